//! `create`: make sure the proxy's domain exists and is starting. Idempotent by name, across
//! every connection of the config.
//!
//! 1. The name is looked up on every connection, in list order. The first that has a domain with
//!    the name goes to adoption there:
//!    * its mark carries the request's UID: adopted ([`adoption`]). Running it is returned at
//!      once; stopped it is started; paused or pm-suspended it is returned in the state `get`
//!      reports (paused by a person, on its way, or failed). An adopted domain gets autostart (so one
//!      made before the provider set it gains it), and its mark the request's tags when they
//!      differ (so one made before the operator named its installation gains it).
//!    * its mark carries another UID, or it has none: `permanent`, never adopted (the kvm2
//!      adoption guard). One exception keeps a cut create retryable: a domain with no mark whose
//!      UUID is the request's UID and that is shut off is this proxy's own definition, cut
//!      between `define-domain` and `set-metadata` (the provider cannot write the mark in the
//!      definition, because only the host knows its metadata namespace); it is marked and
//!      started.
//!
//!    A connection that cannot be opened or does not answer is left out, and the VM is placed on
//!    those that answered; when none answers, create fails (`transient` unless retrying cannot
//!    help, naming the connection). A domain a cut create left on the silent one would give the
//!    Proxy two VMs once it answers again: the operator's sweep deletes the one its Proxy does not
//!    record.
//! 2. Otherwise every connection's pool is read: whether it holds this VM's disk, temporary disk
//!    or seed (left by a cut attempt), its available bytes, and whether it holds the base image.
//!    [`placement`] chooses: the pool holding our volume, else the config's rule.
//! 3. In the chosen pool: the base image is imported once (its volume is named after its sha256,
//!    which the host checks), the pool's free space is checked against what the new volumes
//!    allocate (`quota-exceeded` when short), the disk is made ([`make_disk`]), the seed is
//!    rewritten (a seed left by a cut attempt may be partial; no domain uses it yet), then the
//!    domain is defined with the Proxy UID as its UUID, marked, given autostart (the hypervisor
//!    starts it when it boots), and started.
//!
//! Every step looks before it makes, so a create cut after any capability call and retried ends
//! with one domain, one whole disk of the configured size and one seed.
//!
//! [`placement`]: crate::placement

use crate::calls::{at, call, on};
use crate::config::{Config, DiskMode, VolumeFormat};
use crate::domain_xml::{DomainSpec, domain_xml};
use crate::egress::libvirt::libvirt::{
    Connection, Domain, DomainState, DomainStatus, StoragePool, Volume, VolumeUpload,
};
use crate::egress::provider::types::{CreateRequest, Error, Vm};
use crate::errors::{already_running, code, is_code};
use crate::mark::Mark;
use crate::placement::{BaseSize, Candidate, choose, disk_capacity, disk_needs, needed, spread};
use crate::state::vm_state;
use crate::volume_xml::{
    base_volume_name, creating_volume_name, disk_volume_name, overlay_xml, seed_volume_name,
    volume_xml,
};

/// One upload chunk (the capability's largest).
const CHUNK_BYTES: usize = 1024 * 1024;

/// Whether `text` is a UUID in the `8-4-4-4-12` form (Kubernetes UIDs are).
pub fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(index, c)| match index {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Whether an unmarked domain is this request's own definition, cut before it was marked.
pub fn is_own_unmarked(uid: &str, domain_uuid: &str, status: &DomainStatus) -> bool {
    is_uuid(uid) && uid.eq_ignore_ascii_case(domain_uuid) && status.state == DomainState::Shutoff
}

/// What create does with a domain of its own, by its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Return it as it is (running, on its way, paused or suspended), in the state `get` reports.
    Return,
    /// Start it first.
    Start,
}

/// The adoption rule for our own domain in `status`. A start fails on a paused or pm-suspended
/// domain, so it is returned as it is, its state saying what it is (paused by a person, on its
/// way, or failed): kvm2 answered `permanent` ("resume or destroy it", K34), which latched the
/// Proxy until an object changed even after a person resumed the domain.
pub fn adoption(status: DomainStatus) -> Adoption {
    match status.state {
        DomainState::Shutoff | DomainState::Crashed | DomainState::Shutdown => Adoption::Start,
        DomainState::Paused
        | DomainState::PmSuspended
        | DomainState::Running
        | DomainState::Blocked
        | DomainState::NoState => Adoption::Return,
    }
}

/// The contract's `vm` for a domain create returns: provisioning until `get` sees an address.
pub fn contract_vm(connection: &str, name: &str, status: DomainStatus, mark: &Mark) -> Vm {
    Vm {
        provider_id: crate::id::format(connection, name),
        name: name.to_owned(),
        state: vm_state(status, false),
        addresses: Vec::new(),
        created_at: mark.created_at.clone(),
        uid: mark.uid.clone(),
        host: Some(connection.to_owned()),
    }
}

/// One connection's pool, read before anything is made.
struct Site<'a> {
    name: &'a str,
    connection: Connection,
    pool: StoragePool,
    /// The VM's disk under its own name: whole (see [`make_disk`]).
    disk: Option<Volume>,
    /// The VM's disk under its temporary name: a cut attempt's, or the source of a copy.
    creating: Option<Volume>,
    seed: Option<Volume>,
    base: Option<Volume>,
    /// The base's sizes, when the pool holds it.
    base_size: Option<BaseSize>,
    available: u64,
}

/// The operation.
pub fn create(request: &CreateRequest) -> Result<Vm, Error> {
    let config = Config::parse(&request.config).map_err(Error::Permanent)?;
    if request.uid.is_empty() {
        return Err(Error::Permanent("create needs the Proxy UID".into()));
    }

    // Step 1: the name on every connection.
    let mut connections = Vec::with_capacity(config.connections.len());
    let mut unanswered = None;
    for name in &config.connections {
        let looked_up =
            on(name, "open the connection", || Connection::open(name)).and_then(|connection| {
                let domain = on(name, "look up the domain", || {
                    connection.lookup_domain(&request.name)
                })?;
                Ok((connection, domain))
            });
        match looked_up {
            Ok((_, Some(domain))) => return existing(name, request, &domain),
            Ok((connection, None)) => connections.push((name.as_str(), connection)),
            Err(error) => {
                unanswered.get_or_insert(error);
            }
        }
    }
    if connections.is_empty()
        && let Some(error) = unanswered
    {
        return Err(error);
    }
    // A connection that did not answer is left out: the VM goes on one that did (issue 32: one
    // dead hypervisor stopped every new Proxy). Should a cut create's domain be waiting on it, the
    // operator's sweep removes the one of the two its Proxy does not record.

    // Step 2: where this VM goes.
    let seed_iso = nocloud::build_seed_iso(&nocloud::Seed {
        name: request.name.clone(),
        user_data: request.user_data.clone(),
        install_guest_agent: config.install_guest_agent,
    })
    .map_err(|error| Error::Permanent(format!("seed: {error}")))?;
    let mut sites = connections
        .into_iter()
        .map(|(name, connection)| survey(&config, &request.name, name, connection))
        .collect::<Result<Vec<_>, _>>()?;
    let candidates: Vec<_> = sites
        .iter()
        .map(|site| Candidate {
            name: site.name,
            available: site.available,
            holds_our_volume: site.disk.is_some() || site.creating.is_some() || site.seed.is_some(),
            needed: needed(
                config.disk_mode,
                config.disk_gib,
                site.base_size,
                seed_iso.len() as u64,
            ),
        })
        .collect();
    let candidates = match &request.placement {
        Some(placement) => spread(&placement.avoid_hosts, placement.required, candidates)
            .map_err(Error::QuotaExceeded)?,
        None => candidates,
    };
    // Both keep list order, so a candidate's index is its site's.
    sites.retain(|site| candidates.iter().any(|c| c.name == site.name));
    let Some(chosen) = choose(config.placement, &candidates) else {
        let pools: Vec<_> = candidates
            .iter()
            .map(|c| {
                format!(
                    "{} has {} bytes available, needs at least {}",
                    c.name, c.available, c.needed
                )
            })
            .collect();
        return Err(Error::QuotaExceeded(format!(
            "no connection's pool {} has room for {}: {}",
            config.pool,
            request.name,
            pools.join(", ")
        )));
    };
    let site = sites.swap_remove(chosen);
    drop(sites);
    make(&config, request, site, &seed_iso)
}

/// Reads what placement needs from `connection`'s pool.
fn survey<'a>(
    config: &Config,
    vm: &str,
    name: &'a str,
    connection: Connection,
) -> Result<Site<'a>, Error> {
    let pool = on(name, "open the pool", || {
        connection.storage_pool(&config.pool)
    })?;
    let disk_name = disk_volume_name(vm, config.disk_format());
    let disk = on(name, "look up the disk", || pool.lookup_volume(&disk_name))?;
    let creating = on(name, "look up the temporary disk", || {
        pool.lookup_volume(&creating_volume_name(&disk_name))
    })?;
    let seed = on(name, "look up the seed", || {
        pool.lookup_volume(&seed_volume_name(vm))
    })?;
    let base = on(name, "look up the base image", || {
        pool.lookup_volume(&base_volume_name(&config.image.sha256, config.image.format))
    })?;
    let base_size = match &base {
        Some(base) => {
            let info = on(name, "read the base image", || base.info())?;
            Some(BaseSize {
                capacity: info.capacity,
                allocation: info.allocation,
            })
        }
        None => None,
    };
    let available = on(name, "read the pool", || pool.info())?.available;
    Ok(Site {
        name,
        connection,
        pool,
        disk,
        creating,
        seed,
        base,
        base_size,
        available,
    })
}

/// Step 3: the disk, the seed and the domain on the chosen connection.
fn make(
    config: &Config,
    request: &CreateRequest,
    site: Site<'_>,
    seed_iso: &[u8],
) -> Result<Vm, Error> {
    let Site {
        name: here,
        connection,
        pool,
        disk,
        creating,
        seed: old_seed,
        base,
        ..
    } = site;
    let base = match base {
        Some(base) => base,
        None => crate::bases::import(config, here, &pool)?,
    };
    let disk_name = disk_volume_name(&request.name, config.disk_format());
    let seed_name = seed_volume_name(&request.name);
    let base_info = at(here, "read the base image", || base.info())?;
    let disk_capacity = disk_capacity(config.disk_gib, base_info.capacity);
    let old_seed_bytes = match &old_seed {
        Some(seed) => at(here, "read the seed", || seed.info())?.capacity,
        None => 0,
    };
    // What the new volumes allocate, not the disk's virtual size: a copy-on-write disk starts
    // near-empty (placement's `disk_needs`).
    let disk_bytes = match disk {
        Some(_) => 0,
        None => disk_needs(config.disk_mode, disk_capacity, base_info.allocation),
    };
    let needed = disk_bytes + (seed_iso.len() as u64).saturating_sub(old_seed_bytes);
    let available = at(here, "read the pool", || pool.info())?.available;
    if needed > available {
        return Err(Error::QuotaExceeded(format!(
            "pool {} on connection {here} has {available} bytes available; {} needs {needed}",
            config.pool, request.name
        )));
    }

    make_disk(
        config,
        here,
        &pool,
        &base,
        Disk {
            name: &disk_name,
            capacity: disk_capacity,
            whole: disk,
            creating,
        },
    )?;
    if let Some(seed) = old_seed {
        delete_volume(here, &seed, "delete a stale seed")?;
    }
    upload_seed(here, &pool, &seed_name, seed_iso)?;

    let uuid = is_uuid(&request.uid).then_some(request.uid.as_str());
    let xml = domain_xml(
        config,
        &DomainSpec {
            name: &request.name,
            uuid,
            disk: &disk_name,
            seed: &seed_name,
        },
    );
    let domain = at(here, "define the domain", || connection.define_domain(&xml))?;
    let mark = new_mark(request);
    at(here, "mark the domain", || {
        domain.set_metadata(Some(&mark.format()))
    })?;
    autostart(here, &domain)?;
    start(here, &domain)?;
    let status = at(here, "read the domain state", || domain.status())?;
    // Bases an image change left unused go after the grant's retention.
    crate::bases::prune(here, &pool);
    Ok(contract_vm(here, &request.name, status, &mark))
}

/// The VM's disk as the survey found it.
struct Disk<'a> {
    name: &'a str,
    capacity: u64,
    /// Under its own name.
    whole: Option<Volume>,
    /// Under its temporary name.
    creating: Option<Volume>,
}

/// Makes the VM's disk unless it is whole already. A disk under its own name is whole: it
/// appears only once made at its full size (the audit's gap 9: a half-made disk was reused).
///
/// * `copyOnWrite`: one call makes a qcow2 volume at the disk's size backed by the base: there is
///   no copy and no resize to cut in two.
/// * `fullCopy`: a temporary qcow2 volume `<disk>.creating` is made the same way, then libvirt
///   copies it, reading through to the base, into the disk in the image's format at the disk's
///   size (one copy, no resize), and the temporary volume is deleted. libvirt has no rename: the
///   copy is the publication, as an import's is.
///
/// A temporary volume found beside no disk is a cut attempt's, deleted and made again, never
/// used. Found beside the disk, it is the source of a copy that was cut or is still running
/// (the call timed out, libvirt goes on): libvirt refuses to delete it until the copy ends, so
/// create fails `transient` until then, and the disk is whole once it is gone.
fn make_disk(
    config: &Config,
    here: &str,
    pool: &StoragePool,
    base: &Volume,
    disk: Disk<'_>,
) -> Result<(), Error> {
    if let Some(creating) = disk.creating {
        delete_volume(
            here,
            &creating,
            "delete the temporary disk (libvirt refuses while it still copies from it)",
        )?;
    }
    if disk.whole.is_some() {
        return Ok(());
    }
    let overlay = |name: &str| overlay_xml(name, disk.capacity, &config.pool, &base.name());
    match config.disk_mode {
        DiskMode::CopyOnWrite => {
            at(here, "make the disk", || {
                pool.create_volume(&overlay(disk.name))
            })?;
        }
        DiskMode::FullCopy => {
            let creating = at(here, "make the temporary disk", || {
                pool.create_volume(&overlay(&creating_volume_name(disk.name)))
            })?;
            let copy = volume_xml(disk.name, disk.capacity, config.disk_format());
            at(here, "copy the disk", || {
                pool.clone_volume(&copy, &creating)
            })?;
            delete_volume(here, &creating, "delete the temporary disk")?;
        }
    }
    Ok(())
}

/// Step 1: a domain with the request's name exists on `connection`.
fn existing(connection: &str, request: &CreateRequest, domain: &Domain) -> Result<Vm, Error> {
    let here = connection;
    let status = at(here, "read the domain state", || domain.status())?;
    let mark = match Mark::parse(at(here, "read the mark", || domain.metadata())?.as_deref()) {
        Some(mark) if mark.uid == request.uid => {
            let tags = request_tags(request);
            if mark.tags == tags {
                mark
            } else {
                // Made before the operator named its installation in the tags (or with other
                // tags): the mark gains the request's, keeping its UID and creation time.
                let mark = Mark { tags, ..mark };
                at(here, "update the mark", || {
                    domain.set_metadata(Some(&mark.format()))
                })?;
                mark
            }
        }
        Some(mark) => {
            return Err(Error::Permanent(format!(
                "domain {} on connection {connection} belongs to Proxy UID {:?}, not {:?}: not adopted",
                request.name, mark.uid, request.uid
            )));
        }
        None if is_own_unmarked(&request.uid, &domain.uuid(), &status) => {
            let mark = new_mark(request);
            at(here, "mark the domain", || {
                domain.set_metadata(Some(&mark.format()))
            })?;
            mark
        }
        None => {
            return Err(Error::Permanent(format!(
                "domain {} on connection {connection} exists without this provider's mark: not adopted",
                request.name
            )));
        }
    };
    let status = match adoption(status) {
        Adoption::Return => {
            autostart(here, domain)?;
            status
        }
        Adoption::Start => {
            autostart(here, domain)?;
            start(here, domain)?;
            at(here, "read the domain state", || domain.status())?
        }
    };
    Ok(contract_vm(connection, &request.name, status, &mark))
}

/// The mark for a new domain: the UID, now, and the request's tags.
fn new_mark(request: &CreateRequest) -> Mark {
    Mark {
        uid: request.uid.clone(),
        created_at: Some(egress_guest::time::now_rfc3339()),
        tags: request_tags(request),
    }
}

/// The request's tags as the mark holds them.
fn request_tags(request: &CreateRequest) -> Vec<(String, String)> {
    request
        .tags
        .iter()
        .map(|tag| (tag.key.clone(), tag.value.clone()))
        .collect()
}

/// Creates the seed volume in `pool` on connection `here` and writes the ISO into it.
fn upload_seed(here: &str, pool: &StoragePool, name: &str, iso: &[u8]) -> Result<(), Error> {
    let xml = volume_xml(name, iso.len() as u64, VolumeFormat::Raw);
    let seed = at(here, "create the seed", || pool.create_volume(&xml))?;
    let upload = at(here, "start the seed's upload", || seed.upload())?;
    for chunk in iso.chunks(CHUNK_BYTES) {
        at(here, "upload the seed", || upload.write(chunk))?;
    }
    at(here, "finish the seed's upload", || {
        VolumeUpload::finish(upload)
    })?;
    Ok(())
}

/// Deletes a volume on connection `here`; one already gone is fine.
pub fn delete_volume(here: &str, volume: &Volume, what: &str) -> Result<(), Error> {
    match call(here, what, || volume.delete()) {
        Err(error) if !is_code(&error, code::NO_STORAGE_VOL) => {
            Err(crate::errors::classify(what, error))
        }
        _ => Ok(()),
    }
}

/// Has the hypervisor start the domain when it boots, so a proxy comes back with its host.
fn autostart(here: &str, domain: &Domain) -> Result<(), Error> {
    at(here, "set the domain's autostart", || {
        domain.set_autostart(true)
    })
}

/// Starts a domain; one already running is fine.
fn start(here: &str, domain: &Domain) -> Result<(), Error> {
    match call(here, "start the domain", || domain.start()) {
        Err(error) if !already_running(&error) => {
            Err(crate::errors::classify("start the domain", error))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adoption_table() {
        use Adoption::{Return, Start};
        use DomainState as D;
        let rows = [
            (D::Running, 1, Return),
            (D::Blocked, 0, Return),
            (D::NoState, 0, Return),
            (D::Paused, 11, Return),
            (D::Paused, 1, Return),
            (D::Paused, 5, Return),
            (D::Paused, 0, Return),
            (D::PmSuspended, 1, Return),
            (D::Shutoff, 1, Start),
            (D::Shutoff, 3, Start),
            (D::Crashed, 0, Start),
            (D::Shutdown, 1, Start),
        ];
        for (state, reason, want) in rows {
            assert_eq!(
                adoption(DomainStatus { state, reason }),
                want,
                "{state:?}/{reason}"
            );
        }
    }

    #[test]
    fn only_a_shut_off_domain_whose_uuid_is_the_uid_is_our_own_unmarked_one() {
        let uid = "6c1f0a2e-0000-4000-8000-00000000000a";
        let off = DomainStatus {
            state: DomainState::Shutoff,
            reason: 0,
        };
        let running = DomainStatus {
            state: DomainState::Running,
            reason: 1,
        };
        assert!(is_own_unmarked(uid, &uid.to_uppercase(), &off));
        assert!(!is_own_unmarked(
            uid,
            "6c1f0a2e-0000-4000-8000-00000000000b",
            &off
        ));
        assert!(!is_own_unmarked(uid, uid, &running));
        assert!(!is_own_unmarked("uid-1", "uid-1", &off));
        assert!(is_uuid(uid));
        for bad in [
            "",
            "uid-1",
            "6c1f0a2e000040008000000000000000000a",
            &uid.replace('a', "g"),
        ] {
            assert!(!is_uuid(bad), "{bad:?}");
        }
    }
}
