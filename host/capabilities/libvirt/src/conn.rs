//! Connections: dialing a granted URI with the host's SSH material, and the pool that shares one
//! connection per URI among every call of every provider.
//!
//! A pooled connection is reused while libvirt says it is alive; one that timed out is evicted so
//! the next call dials afresh (the stuck call keeps its own reference until libvirt returns).
//! Connections are closed off the executor: closing a remote one is a round trip.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use virt::connect::Connect;

use crate::bindings::egress::libvirt::libvirt::Error;
use crate::error;
use crate::grant::{ConnectionGrant, GrantError};

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

/// One granted connection, validated: shared by every call of the provider.
#[derive(Debug)]
pub(crate) struct ActiveConnection {
    /// The name the guest opens it by.
    pub(crate) name: String,
    uri: url::Url,
    transport: Transport,
    ssh_key_file: Option<PathBuf>,
    known_hosts_file: Option<PathBuf>,
    /// OR of the grant's undefine flags.
    pub(crate) undefine_flags: u32,
    pub(crate) pools: BTreeSet<String>,
    pub(crate) networks: BTreeSet<String>,
    pub(crate) bridges: BTreeSet<String>,
}

impl ActiveConnection {
    /// Validates one connection of `provider`'s grant. Reads no file.
    pub(crate) fn new(provider: &str, grant: &ConnectionGrant) -> Result<Self, GrantError> {
        let invalid = |field: &str, reason: String| GrantError::Invalid {
            provider: provider.to_owned(),
            field: format!("connections[{}].{field}", grant.name),
            reason,
        };
        if !crate::call::is_simple_name(&grant.name) {
            return Err(invalid(
                "name",
                "must be 1 to 255 bytes, no '/' or NUL".into(),
            ));
        }
        let uri = url::Url::parse(&grant.uri)
            .map_err(|error| invalid("uri", format!("not a URI: {error}")))?;
        if let Some((key, _)) = uri
            .query_pairs()
            .find(|(key, _)| HOST_OWNED_PARAMETERS.contains(&key.as_ref()))
        {
            return Err(invalid(
                "uri",
                format!("the host sets {key:?} itself; use sshKeyFile and knownHostsFile"),
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
        if transport == Transport::Other
            && (grant.ssh_key_file.is_some() || grant.known_hosts_file.is_some())
        {
            return Err(invalid(
                "sshKeyFile",
                "SSH files need an ssh, libssh or libssh2 transport".into(),
            ));
        }
        if transport == Transport::SshBinary && grant.known_hosts_file.is_some() {
            return Err(invalid(
                "knownHostsFile",
                "libvirt's ssh transport cannot take one; use qemu+libssh2://".into(),
            ));
        }
        let set = |values: &[String], field: &str| {
            values
                .iter()
                .map(|value| {
                    if crate::call::is_simple_name(value) {
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
            ssh_key_file: grant.ssh_key_file.clone(),
            known_hosts_file: grant.known_hosts_file.clone(),
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

    /// Whether dialing goes through SSH (whose failures are classified).
    fn ssh(&self) -> bool {
        self.transport != Transport::Other
    }

    /// The URI to dial: the grant's, plus the SSH parameters the host owns. Holds file paths,
    /// never their contents.
    fn dial_uri(&self) -> String {
        let mut uri = self.uri.clone();
        if self.ssh() {
            let mut query = uri.query_pairs_mut();
            if let Some(key) = &self.ssh_key_file {
                query.append_pair("keyfile", &key.to_string_lossy());
            }
            match self.transport {
                Transport::SshBinary => {
                    // Never prompt: no terminal to answer on.
                    query.append_pair("no_tty", "1");
                }
                Transport::SshLibrary => {
                    if let Some(known_hosts) = &self.known_hosts_file {
                        query.append_pair("known_hosts", &known_hosts.to_string_lossy());
                    }
                    // An unknown or changed host key fails the dial.
                    query.append_pair("known_hosts_verify", "normal");
                    if self.ssh_key_file.is_some() {
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
    fn check_files(&self) -> Result<(), Error> {
        for path in [&self.ssh_key_file, &self.known_hosts_file]
            .into_iter()
            .flatten()
        {
            if let Err(io) = std::fs::File::open(path) {
                tracing::warn!(connection = %self.name, path = %path.display(), error = %io, "SSH file unreadable");
                return Err(Error::CredentialsUnavailable(format!(
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
            crate::call::off_executor(move || {
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
    pub(crate) fn get(&self, grant: &ActiveConnection) -> Result<Arc<Conn>, Error> {
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

/// A fresh connection for `grant`, outside the pool. Blocks: call it off the executor.
pub(crate) fn dial_unpooled(grant: &ActiveConnection) -> Result<Conn, Error> {
    dial(grant, &grant.dial_uri(), false)
}

fn dial(grant: &ActiveConnection, uri: &str, pooled: bool) -> Result<Conn, Error> {
    grant.check_files()?;
    match Connect::open(Some(uri)) {
        Ok(connect) => Ok(Conn {
            connect: Some(connect),
            key: pooled.then(|| uri.to_owned()),
        }),
        Err(failure) => {
            tracing::warn!(connection = %grant.name, error = %failure, "libvirt dial failed");
            Err(error::dial(&failure, grant.ssh()))
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves a consistent map behind.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::Grants;

    fn connection(json: &str) -> Result<ActiveConnection, GrantError> {
        let grants = Grants::from_json(&format!(
            r#"{{"grants":{{"p":{{"connections":[{json}]}}}}}}"#
        ))
        .unwrap();
        ActiveConnection::new("p", &grants.grants["p"].connections[0])
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
                "sshKeyFile",
            ),
            (
                r#"{"name":"a","uri":"qemu+ssh://h/system","knownHostsFile":"/k"}"#,
                "knownHostsFile",
            ),
            (r#"{"name":"a/b","uri":"qemu:///system"}"#, "name"),
            (
                r#"{"name":"a","uri":"qemu:///system","pools":["x/y"]}"#,
                "pools",
            ),
        ] {
            let error = connection(json).unwrap_err();
            assert!(error.to_string().contains(field), "{json}: {error}");
        }
    }
}
