//! `create`: make sure the proxy's domain exists and is starting. Idempotent by name.
//!
//! 1. A domain with the name already exists:
//!    * its mark carries the request's UID: adopted. Running (or paused, blocked) it is returned
//!      at once; stopped it is started.
//!    * its mark carries another UID, or it has none: `permanent`, never adopted (the kvm2
//!      adoption guard). One exception keeps a cut create retryable: a domain with no mark whose
//!      UUID is the request's UID and that is shut off is this proxy's own definition, cut
//!      between `define-domain` and `set-metadata` (the provider cannot write the mark in the
//!      definition, because only the host knows its metadata namespace); it is marked and
//!      started.
//! 2. Otherwise, in the granted pool: the base image is imported once (its volume is named
//!    after its sha256, which the host checks), the pool's free space is checked against what
//!    the new volumes need (`quota-exceeded` when short), the disk is cloned from the base, the
//!    seed is rewritten (a seed left by a cut attempt may be partial; no domain uses it yet),
//!    then the domain is defined with the Proxy UID as its UUID, marked, and started.
//!
//! Every step looks before it makes, so a create cut after any capability call and retried ends
//! with one domain, one disk and one seed.

use crate::Step;
use crate::config::{Config, VolumeFormat};
use crate::domain_xml::{DomainSpec, domain_xml};
use crate::egress::libvirt::libvirt::{
    Connection, Domain, DomainState, DomainStatus, StoragePool, Volume, VolumeUpload,
};
use crate::egress::provider::types::{CreateRequest, Error, Instance};
use crate::errors::{already_running, code, is_code};
use crate::mark::Mark;
use crate::state::instance_state;
use crate::volume_xml::{base_volume_name, disk_volume_name, seed_volume_name, volume_xml};

/// One upload chunk (the capability's largest).
const CHUNK_BYTES: usize = 1024 * 1024;

/// `VIR_ERR_STORAGE_VOL_EXIST`: another create imported the base at the same time.
const STORAGE_VOL_EXIST: i32 = 90;

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

/// The instance for a domain create returns: provisioning until `get` sees an address.
pub fn instance(connection: &str, name: &str, status: DomainStatus, mark: &Mark) -> Instance {
    Instance {
        provider_id: crate::id::format(connection, name),
        name: name.to_owned(),
        state: instance_state(status, false),
        addresses: Vec::new(),
        created_at: mark.created_at.clone(),
        uid: mark.uid.clone(),
    }
}

/// The operation.
pub fn create(request: &CreateRequest) -> Result<Instance, Error> {
    let config = Config::parse(&request.config).map_err(Error::Permanent)?;
    if request.uid.is_empty() {
        return Err(Error::Permanent("create needs the Proxy UID".into()));
    }
    let connection = Connection::open(&config.connection).at("open the connection")?;
    if let Some(domain) = connection
        .lookup_domain(&request.name)
        .at("look up the domain")?
    {
        return existing(&config, request, &domain);
    }
    let pool = connection.storage_pool(&config.pool).at("open the pool")?;
    let base = base_image(&config, &pool)?;
    let seed_iso = nocloud::build_seed_iso(&nocloud::Seed {
        name: request.name.clone(),
        user_data: request.user_data.clone(),
        install_guest_agent: config.install_guest_agent,
    })
    .map_err(|error| Error::Permanent(format!("seed: {error}")))?;

    let format = config.image.format;
    let disk_name = disk_volume_name(&request.name, format);
    let seed_name = seed_volume_name(&request.name);
    let disk = pool.lookup_volume(&disk_name).at("look up the disk")?;
    let old_seed = pool.lookup_volume(&seed_name).at("look up the seed")?;
    let base_capacity = base.info().at("read the base image")?.capacity;
    let disk_capacity = config
        .disk_gib
        .map_or(0, |gib| gib.saturating_mul(1 << 30))
        .max(base_capacity);
    let old_seed_bytes = match &old_seed {
        Some(seed) => seed.info().at("read the seed")?.capacity,
        None => 0,
    };
    let needed = if disk.is_none() { disk_capacity } else { 0 }
        + (seed_iso.len() as u64).saturating_sub(old_seed_bytes);
    let available = pool.info().at("read the pool")?.available;
    if needed > available {
        return Err(Error::QuotaExceeded(format!(
            "pool {} has {available} bytes available; {} needs {needed}",
            config.pool, request.name
        )));
    }

    if disk.is_none() {
        pool.clone_volume(&volume_xml(&disk_name, disk_capacity, format), &base)
            .at("clone the disk")?;
    }
    if let Some(seed) = old_seed {
        delete_volume(&seed, "delete a stale seed")?;
    }
    upload_seed(&pool, &seed_name, &seed_iso)?;

    let uuid = is_uuid(&request.uid).then_some(request.uid.as_str());
    let xml = domain_xml(
        &config,
        &DomainSpec {
            name: &request.name,
            uuid,
            disk: &disk_name,
            seed: &seed_name,
        },
    );
    let domain = connection.define_domain(&xml).at("define the domain")?;
    let mark = new_mark(request);
    domain
        .set_metadata(Some(&mark.format()))
        .at("mark the domain")?;
    start(&domain)?;
    let status = domain.status().at("read the domain state")?;
    Ok(instance(&config.connection, &request.name, status, &mark))
}

/// Step 1: a domain with the request's name exists.
fn existing(config: &Config, request: &CreateRequest, domain: &Domain) -> Result<Instance, Error> {
    let status = domain.status().at("read the domain state")?;
    let mark = match Mark::parse(domain.metadata().at("read the mark")?.as_deref()) {
        Some(mark) if mark.uid == request.uid => mark,
        Some(mark) => {
            return Err(Error::Permanent(format!(
                "domain {} belongs to Proxy UID {:?}, not {:?}: not adopted",
                request.name, mark.uid, request.uid
            )));
        }
        None if is_own_unmarked(&request.uid, &domain.uuid(), &status) => {
            let mark = new_mark(request);
            domain
                .set_metadata(Some(&mark.format()))
                .at("mark the domain")?;
            mark
        }
        None => {
            return Err(Error::Permanent(format!(
                "domain {} exists without this provider's mark: not adopted",
                request.name
            )));
        }
    };
    let status = match status.state {
        DomainState::Shutoff | DomainState::Crashed | DomainState::Shutdown => {
            start(domain)?;
            domain.status().at("read the domain state")?
        }
        _ => status,
    };
    Ok(instance(&config.connection, &request.name, status, &mark))
}

/// The mark for a new domain: the UID, now, and the request's tags.
fn new_mark(request: &CreateRequest) -> Mark {
    Mark {
        uid: request.uid.clone(),
        created_at: Some(egress_guest::time::now_rfc3339()),
        tags: request
            .tags
            .iter()
            .map(|tag| (tag.key.clone(), tag.value.clone()))
            .collect(),
    }
}

/// The base volume, imported by the host when the pool does not have it yet.
fn base_image(config: &Config, pool: &StoragePool) -> Result<Volume, Error> {
    let name = base_volume_name(&config.image.sha256, config.image.format);
    if let Some(base) = pool.lookup_volume(&name).at("look up the base image")? {
        return Ok(base);
    }
    match pool.import_image(&name, &config.image.url, &config.image.sha256) {
        Ok(base) => Ok(base),
        // Another create imported it meanwhile.
        Err(error) if is_code(&error, STORAGE_VOL_EXIST) => pool
            .lookup_volume(&name)
            .at("look up the base image")?
            .ok_or_else(|| Error::Transient(format!("base image {name} vanished"))),
        Err(error) => Err(crate::errors::classify("import the base image", error)),
    }
}

/// Creates the seed volume and writes the ISO into it.
fn upload_seed(pool: &StoragePool, name: &str, iso: &[u8]) -> Result<(), Error> {
    let seed = pool
        .create_volume(&volume_xml(name, iso.len() as u64, VolumeFormat::Raw))
        .at("create the seed")?;
    let upload = seed.upload().at("upload the seed")?;
    for chunk in iso.chunks(CHUNK_BYTES) {
        upload.write(chunk).at("upload the seed")?;
    }
    VolumeUpload::finish(upload).at("upload the seed")?;
    Ok(())
}

/// Deletes a volume; one already gone is fine.
pub fn delete_volume(volume: &Volume, what: &str) -> Result<(), Error> {
    match volume.delete() {
        Err(error) if !is_code(&error, code::NO_STORAGE_VOL) => {
            Err(crate::errors::classify(what, error))
        }
        _ => Ok(()),
    }
}

/// Starts a domain; one already running is fine.
fn start(domain: &Domain) -> Result<(), Error> {
    match domain.start() {
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
