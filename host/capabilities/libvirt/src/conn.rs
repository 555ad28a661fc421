//! Connections: dialing a granted URI with the host's SSH material, and the pool that shares one
//! connection per URI among every call of every provider.
//!
//! A pooled connection is reused while libvirt says it is alive; one that timed out is evicted so
//! the next call dials afresh (the stuck call keeps its own reference until libvirt returns).
//! Connections are closed off the executor: closing a remote one is a round trip.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use egress_runtime::grant::{
    GrantContext, GrantError, MoreThanOneSource, Resolved, ValueFrom, ValueSource,
};
use egress_runtime::lock;
use virt::connect::Connect;

use crate::Shared;
use crate::grant::ConnectionGrant;
use crate::keys::KeyFile;

/// URI parameters the host sets itself; a grant's URI may not carry them.
const HOST_OWNED_PARAMETERS: &[&str] = &[
    "keyfile",
    "known_hosts",
    "known_hosts_verify",
    "no_verify",
    "no_tty",
    "sshauth",
    "command",
    "netcat",
    "socket",
];

/// How libvirt reaches the hypervisor, from the URI scheme's `+transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// The `ssh` binary (`qemu+ssh://`).
    SshBinary,
    /// libssh or libssh2 inside libvirt (`qemu+libssh://`, `qemu+libssh2://`).
    SshLibrary,
    /// Anything else: local sockets, TLS, TCP, the test driver.
    Other,
}

/// A file libvirt reads while dialing: one the grant names (the CLI), or one the host wrote from
/// a Secret, removed when the grant that holds it goes.
#[derive(Debug)]
enum SshFile {
    Named(PathBuf),
    Written(Arc<KeyFile>),
}

impl SshFile {
    fn path(&self) -> &Path {
        match self {
            SshFile::Named(path) => path,
            SshFile::Written(file) => file.path(),
        }
    }
}

/// One granted connection, validated: shared by every call of the provider.
#[derive(Debug)]
pub(crate) struct ActiveConnection {
    /// The name the guest opens it by.
    pub(crate) name: String,
    uri: url::Url,
    transport: Transport,
    ssh_key: Option<SshFile>,
    known_hosts: Option<SshFile>,
    /// OR of the grant's undefine flags.
    pub(crate) undefine_flags: u32,
    pub(crate) pools: BTreeSet<String>,
    pub(crate) networks: BTreeSet<String>,
    pub(crate) bridges: BTreeSet<String>,
}

impl ActiveConnection {
    /// Validates one connection of `identity`'s grant and resolves its SSH material: a Secret's
    /// key is written to the host's key directory (so `shared` makes it on first need), unless
    /// `previous`, the connection of the grant this one replaces, holds the same bytes already
    /// (its file and pooled connection are kept); a file is only named. Reads no file.
    pub(crate) fn new(
        identity: &str,
        grant: &ConnectionGrant,
        context: &GrantContext<'_>,
        shared: &Shared,
        previous: Option<&ActiveConnection>,
    ) -> Result<Self, GrantError> {
        let about = GrantError::about("libvirt", identity);
        let invalid = |field: &str, reason: String| {
            about(&format!("connections[{}].{field}", grant.name), reason)
        };
        if !crate::leaves::is_simple_name(&grant.name) {
            return Err(invalid(
                "name",
                "must be 1 to 255 bytes, no '/' or NUL".into(),
            ));
        }
        let (uri, transport) = granted_uri(&grant.uri, &invalid)?;
        let (ssh_key, known_hosts) = ssh_material(grant, context, shared, previous, &invalid)?;
        if transport == Transport::Other && (ssh_key.is_some() || known_hosts.is_some()) {
            return Err(invalid(
                "sshKeySecretRef",
                "SSH keys and known_hosts need an ssh, libssh or libssh2 transport".into(),
            ));
        }
        if transport == Transport::SshBinary && known_hosts.is_some() {
            return Err(invalid(
                "knownHostsSecretRef",
                "libvirt's ssh transport cannot take known_hosts; use qemu+libssh2://".into(),
            ));
        }
        let set = |values: &[String], field: &str| {
            values
                .iter()
                .map(|value| {
                    if crate::leaves::is_simple_name(value) {
                        Ok(value.clone())
                    } else {
                        Err(invalid(field, format!("{value:?} is not a name")))
                    }
                })
                .collect::<Result<BTreeSet<_>, _>>()
        };
        Ok(Self {
            name: grant.name.clone(),
            transport,
            ssh_key,
            known_hosts,
            undefine_flags: grant
                .undefine_flags
                .iter()
                .fold(0, |flags, flag| flags | flag.bits()),
            pools: set(&grant.pools, "pools")?,
            networks: set(&grant.networks, "networks")?,
            bridges: set(&grant.bridges, "bridges")?,
            uri,
        })
    }

    /// The hypervisor this connection reaches: the granted URI, without what the host adds.
    pub(crate) fn hypervisor(&self) -> String {
        self.uri.to_string()
    }

    /// Whether dialing goes through SSH (whose failures are classified).
    fn ssh(&self) -> bool {
        self.transport != Transport::Other
    }

    /// The URI to dial: the grant's, plus the SSH parameters the host owns. Holds file paths,
    /// never their contents.
    pub(crate) fn dial_uri(&self) -> String {
        let mut uri = self.uri.clone();
        if self.ssh() {
            let mut query = uri.query_pairs_mut();
            if let Some(key) = &self.ssh_key {
                query.append_pair("keyfile", &key.path().to_string_lossy());
            }
            match self.transport {
                Transport::SshBinary => {
                    // Never prompt: no terminal to answer on.
                    query.append_pair("no_tty", "1");
                }
                Transport::SshLibrary => {
                    if let Some(known_hosts) = &self.known_hosts {
                        query.append_pair("known_hosts", &known_hosts.path().to_string_lossy());
                    }
                    // An unknown or changed host key fails the dial.
                    query.append_pair("known_hosts_verify", "normal");
                    if self.ssh_key.is_some() {
                        query.append_pair("sshauth", "privkey");
                    }
                }
                Transport::Other => {}
            }
        }
        uri.to_string()
    }

    /// Checks that the SSH files can be read now (libvirt reads them while dialing): a missing
    /// file is a host not ready yet, not a refused key.
    fn check_files(&self) -> Result<(), DialError> {
        for path in [&self.ssh_key, &self.known_hosts]
            .into_iter()
            .flatten()
            .map(SshFile::path)
        {
            if let Err(io) = std::fs::File::open(path) {
                tracing::warn!(connection = %self.name, path = %path.display(), error = %io, "SSH file unreadable");
                return Err(DialError::CredentialsUnavailable(format!(
                    "connection {}: cannot read {}: {}",
                    self.name,
                    path.display(),
                    io.kind()
                )));
            }
        }
        Ok(())
    }
}

/// The granted URI, checked: no parameter the host sets itself, no password; and its transport.
fn granted_uri(
    text: &str,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<(url::Url, Transport), GrantError> {
    let uri =
        url::Url::parse(text).map_err(|error| invalid("uri", format!("not a URI: {error}")))?;
    if let Some((key, _)) = uri
        .query_pairs()
        .find(|(key, _)| HOST_OWNED_PARAMETERS.contains(&key.as_ref()))
    {
        return Err(invalid(
            "uri",
            format!("the host sets {key:?} itself; grant the SSH key and known_hosts instead"),
        ));
    }
    if !uri.password().unwrap_or_default().is_empty() {
        return Err(invalid("uri", "may not carry a password".into()));
    }
    let transport = match uri.scheme().split_once('+').map(|(_, transport)| transport) {
        Some("ssh") => Transport::SshBinary,
        Some("libssh" | "libssh2") => Transport::SshLibrary,
        _ => Transport::Other,
    };
    Ok((uri, transport))
}

/// The SSH key and known_hosts `grant` names, each written to the key directory when a Secret or
/// ConfigMap holds it (kept from `previous` when it holds the same bytes), or only named when a
/// file.
fn ssh_material(
    grant: &ConnectionGrant,
    context: &GrantContext<'_>,
    shared: &Shared,
    previous: Option<&ActiveConnection>,
    invalid: &impl Fn(&str, String) -> GrantError,
) -> Result<(Option<SshFile>, Option<SshFile>), GrantError> {
    let write = |what: &str, bytes: &[u8]| -> Result<SshFile, String> {
        let kept = previous.and_then(|previous| match what {
            "key" => previous.ssh_key.as_ref(),
            _ => previous.known_hosts.as_ref(),
        });
        if let Some(SshFile::Written(file)) = kept
            && file.holds(bytes)
        {
            return Ok(SshFile::Written(Arc::clone(file)));
        }
        let dir = shared.key_dir()?;
        dir.write(&format!("{}-{}", grant.name, what), bytes)
            .map(|file| SshFile::Written(Arc::new(file)))
    };
    let ssh_key = ssh_file(
        ValueFrom::one_of([
            (
                "sshKeySecretRef",
                grant.ssh_key_secret_ref.as_ref().map(ValueSource::Secret),
            ),
            (
                "sshKeyFile",
                grant.ssh_key_file.as_deref().map(ValueSource::File),
            ),
        ]),
        (
            "sshKeySecretRef",
            "name one of sshKeySecretRef and sshKeyFile",
        ),
        context,
        invalid,
        |bytes, from| {
            private_key(bytes, from)?;
            write("key", bytes)
        },
    )?;
    let known_hosts = ssh_file(
        ValueFrom::one_of([
            (
                "knownHostsSecretRef",
                grant
                    .known_hosts_secret_ref
                    .as_ref()
                    .map(ValueSource::Secret),
            ),
            (
                "knownHostsConfigMapRef",
                grant
                    .known_hosts_config_map_ref
                    .as_ref()
                    .map(ValueSource::ConfigMap),
            ),
            (
                "knownHostsFile",
                grant.known_hosts_file.as_deref().map(ValueSource::File),
            ),
        ]),
        (
            "knownHostsSecretRef",
            "name one of knownHostsSecretRef, knownHostsConfigMapRef and knownHostsFile",
        ),
        context,
        invalid,
        |bytes, _| write("known_hosts", bytes),
    )?;
    Ok((ssh_key, known_hosts))
}

/// The SSH file one of a connection's fields names: a Secret's or ConfigMap's value, handed to
/// `keep` (which checks and writes it to the key directory), or a file, only named. `one_of` is
/// the field and the message for a grant that names more than one.
fn ssh_file(
    from: Result<Option<ValueFrom<'_>>, MoreThanOneSource>,
    one_of: (&str, &str),
    context: &GrantContext<'_>,
    invalid: &impl Fn(&str, String) -> GrantError,
    keep: impl FnOnce(&[u8], &ValueSource<'_>) -> Result<SshFile, String>,
) -> Result<Option<SshFile>, GrantError> {
    let from = from.map_err(|MoreThanOneSource| invalid(one_of.0, one_of.1.into()))?;
    let Some(from) = from else {
        return Ok(None);
    };
    match context.resolve(from, invalid)? {
        Resolved::Value(bytes) => keep(&bytes, &from.source)
            .map(Some)
            .map_err(|reason| invalid(from.field, reason)),
        Resolved::File(path) => Ok(Some(SshFile::Named(path.to_owned()))),
    }
}

/// Checks that `bytes`, read from `from`, look like an SSH private key (OpenSSH or PEM), so a
/// Secret holding something else is refused when the grant is set rather than at the first dial.
/// Never says what the bytes hold.
fn private_key(bytes: &[u8], from: &ValueSource<'_>) -> Result<(), String> {
    let text = std::str::from_utf8(bytes).unwrap_or_default().trim_start();
    let pem = text.starts_with("-----BEGIN ")
        && text
            .lines()
            .next()
            .is_some_and(|line| line.ends_with("PRIVATE KEY-----"));
    if pem {
        Ok(())
    } else {
        Err(format!("{from} is not an SSH private key (OpenSSH or PEM)"))
    }
}

/// A libvirt connection, closed when the last handle goes.
pub(crate) struct Conn {
    connect: Option<Connect>,
    /// The pool's key, when pooled.
    key: Option<String>,
}

impl Conn {
    /// The libvirt connection.
    pub(crate) fn connect(&self) -> &Connect {
        // Only `drop` takes it out.
        self.connect
            .as_ref()
            .unwrap_or_else(|| unreachable!("a Conn holds its Connect until dropped"))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(mut connect) = self.connect.take() {
            crate::leaves::off_executor(move || {
                if let Err(error) = connect.close() {
                    tracing::debug!(%error, "closing a libvirt connection failed");
                }
            });
        }
    }
}

/// One connection per dial URI, shared by every call of every provider. Holds at most one entry
/// per granted connection.
#[derive(Default)]
pub(crate) struct ConnectionPool {
    pooled: Mutex<HashMap<String, Arc<Conn>>>,
}

impl ConnectionPool {
    /// The pooled connection for `grant`, dialing when there is none or it died. Blocks: call it
    /// off the executor.
    pub(crate) fn get(&self, grant: &ActiveConnection) -> Result<Arc<Conn>, DialError> {
        let key = grant.dial_uri();
        let existing = lock(&self.pooled).get(&key).cloned();
        if let Some(conn) = existing
            && conn.connect().is_alive().unwrap_or(false)
        {
            return Ok(conn);
        }
        let conn = Arc::new(dial(grant, &key, true)?);
        lock(&self.pooled).insert(key, conn.clone());
        Ok(conn)
    }

    /// Keeps only the connections dialed with one of `uris`: those of grants that are gone, or
    /// of a key that rotated, leave the pool (calls in flight keep theirs).
    pub(crate) fn retain(&self, uris: &HashSet<String>) {
        lock(&self.pooled).retain(|uri, _| uris.contains(uri));
    }

    /// Removes `conn` from the pool (after it timed out), if it is still the pooled one.
    pub(crate) fn evict(&self, conn: &Arc<Conn>) {
        let Some(key) = &conn.key else { return };
        let mut pooled = lock(&self.pooled);
        if pooled
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, conn))
        {
            pooled.remove(key);
        }
    }
}

/// Why a connection could not be had; [`crate::error`] makes it the guest's error.
#[derive(Debug)]
pub(crate) enum DialError {
    /// A granted SSH file cannot be read now.
    CredentialsUnavailable(String),
    /// libvirt refused the dial; `ssh`: through an SSH transport, whose failures are classified.
    Libvirt {
        error: virt::error::Error,
        ssh: bool,
    },
}

/// A fresh connection for `grant`, outside the pool. Blocks: call it off the executor.
pub(crate) fn dial_unpooled(grant: &ActiveConnection) -> Result<Conn, DialError> {
    dial(grant, &grant.dial_uri(), false)
}

fn dial(grant: &ActiveConnection, uri: &str, pooled: bool) -> Result<Conn, DialError> {
    grant.check_files()?;
    match Connect::open(Some(uri)) {
        Ok(connect) => Ok(Conn {
            connect: Some(connect),
            key: pooled.then(|| uri.to_owned()),
        }),
        Err(failure) => {
            tracing::warn!(connection = %grant.name, error = %failure, "libvirt dial failed");
            Err(DialError::Libvirt {
                error: failure,
                ssh: grant.ssh(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use egress_runtime::grant::{FilesOnly, SecretKeyRef};

    fn connection(json: &str) -> Result<ActiveConnection, GrantError> {
        let grant: ConnectionGrant = serde_json::from_str(json).unwrap();
        let context = GrantContext {
            digests: &[],
            host: &FilesOnly,
        };
        ActiveConnection::new("p", &grant, &context, &Shared::default(), None)
    }

    #[test]
    fn libssh2_dials_with_the_key_known_hosts_and_strict_verification() {
        let active = connection(
            r#"{"name":"hv1","uri":"qemu+libssh2://egress@hv1.lab/system","sshKeyFile":"/k/id","knownHostsFile":"/k/known hosts"}"#,
        )
        .unwrap();
        assert_eq!(
            active.dial_uri(),
            "qemu+libssh2://egress@hv1.lab/system?keyfile=%2Fk%2Fid&known_hosts=%2Fk%2Fknown+hosts&known_hosts_verify=normal&sshauth=privkey"
        );
    }

    #[test]
    fn ssh_binary_dials_with_the_key_and_no_tty() {
        let active = connection(
            r#"{"name":"hv1","uri":"qemu+ssh://egress@hv1.lab/system","sshKeyFile":"/k/id"}"#,
        )
        .unwrap();
        assert_eq!(
            active.dial_uri(),
            "qemu+ssh://egress@hv1.lab/system?keyfile=%2Fk%2Fid&no_tty=1"
        );
    }

    #[test]
    fn grants_that_cannot_be_served_safely_are_refused() {
        for (json, field) in [
            (
                r#"{"name":"a","uri":"qemu+ssh://h/system?keyfile=/x"}"#,
                "uri",
            ),
            (r#"{"name":"a","uri":"not a uri"}"#, "uri"),
            (
                r#"{"name":"a","uri":"qemu:///system","sshKeyFile":"/k"}"#,
                "sshKeySecretRef",
            ),
            (
                r#"{"name":"a","uri":"qemu+ssh://h/system","knownHostsFile":"/k"}"#,
                "knownHostsSecretRef",
            ),
            (r#"{"name":"a/b","uri":"qemu:///system"}"#, "name"),
            (
                r#"{"name":"a","uri":"qemu:///system","pools":["x/y"]}"#,
                "pools",
            ),
            (
                r#"{"name":"a","uri":"qemu+libssh2://h/system","sshKeyFile":"/k","sshKeySecretRef":{"name":"s","key":"k"}}"#,
                "sshKeySecretRef",
            ),
            (
                r#"{"name":"a","uri":"qemu+libssh2://h/system","sshKeySecretRef":{"name":"s","key":"k"}}"#,
                "only the operator resolves",
            ),
        ] {
            let error = connection(json).unwrap_err();
            assert!(error.to_string().contains(field), "{json}: {error}");
        }
    }

    #[test]
    fn a_secret_that_is_not_a_private_key_is_refused_without_showing_it() {
        let reference = SecretKeyRef {
            name: "hv1-ssh".into(),
            key: "id".into(),
            namespace: None,
        };
        let from = ValueSource::Secret(&reference);
        assert!(private_key(b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n", &from).is_ok());
        assert!(private_key(b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n", &from).is_ok());
        for bad in [
            &b"ssh-ed25519 AAAAC3Nz user@host"[..],
            b"hunter2",
            b"\xff\xfe",
            b"",
        ] {
            let error = private_key(bad, &from).unwrap_err();
            assert!(
                error.contains("hv1-ssh") && error.contains("not an SSH private key"),
                "{error}"
            );
            assert!(!error.contains("hunter2"));
        }
    }
}
