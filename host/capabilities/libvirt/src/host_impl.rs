//! The `egress:libvirt/libvirt` host traits, implemented on [`LibvirtCtxView`]: each checks the
//! guest's input and the grant, then runs libvirt off the executor.

use std::sync::Arc;

use virt::sys;
use wasmtime::component::Resource;

use crate::bindings::egress::libvirt::libvirt::{
    AddressSource, DomainState, DomainStatus, DomainSummary, Error, Health, Host, HostConnection,
    HostDomain, HostStoragePool, HostVolume, HostVolumeUpload, InterfaceAddresses, PoolInfo,
    VolumeInfo,
};
use crate::call::{self, MAX_CHUNK_BYTES, MAX_DOMAIN_XML_BYTES, MAX_METADATA_BYTES, MAX_PROBES};
use crate::conn::{self, Conn};
use crate::resources::{Connection, Domain, OpenStream, StoragePool, Volume, VolumeUpload};
use crate::retention::{self, VolumeKey};
use crate::{LibvirtCtxView, METADATA_PREFIX, error, import, policy};

type Outcome<T> = wasmtime::Result<Result<T, Error>>;

/// libvirt's error as the guest's.
fn lv(error: virt::error::Error) -> Error {
    error::libvirt(&error)
}

/// `libvirtd`'s version as `major.minor.release`.
fn version_of(connect: &virt::connect::Connect) -> Result<String, Error> {
    let version = connect.get_lib_version().map_err(lv)?;
    Ok(format!(
        "{}.{}.{}",
        version / 1_000_000,
        version / 1_000 % 1_000,
        version % 1_000
    ))
}

/// One probe: a fresh connection's daemon version and the sizes of `pool`. Blocks.
fn health(access: &crate::conn::ActiveConnection, pool: &str) -> Result<Health, Error> {
    let conn = crate::conn::dial_unpooled(access)?;
    let version = version_of(conn.connect())?;
    let info = virt::storage_pool::StoragePool::lookup_by_name(conn.connect(), pool)
        .and_then(|pool| pool.get_info())
        .map_err(lv)?;
    Ok(Health {
        version,
        pool: PoolInfo {
            capacity: info.capacity,
            allocation: info.allocation,
            available: info.available,
        },
    })
}

/// The path and format of the volume a backing store names, as libvirt reads them; refused when
/// that volume is backed itself (its own backing file is not the guest's to choose). Blocks.
fn resolve_backing(
    connect: &virt::connect::Connect,
    backing: &policy::Backing,
) -> Result<(String, String), Error> {
    let named = |error: virt::error::Error| match lv(error) {
        Error::Libvirt(mut libvirt) => {
            libvirt.message = format!(
                "backing store {}/{}: {}",
                backing.pool, backing.volume, libvirt.message
            );
            Error::Libvirt(libvirt)
        }
        other => other,
    };
    let pool =
        virt::storage_pool::StoragePool::lookup_by_name(connect, &backing.pool).map_err(named)?;
    let volume =
        virt::storage_vol::StorageVol::lookup_by_name(&pool, &backing.volume).map_err(named)?;
    let described = volume.get_xml_desc(0).map_err(named)?;
    let document = roxmltree::Document::parse(&described).map_err(|error| {
        Error::Invalid(format!(
            "backing store {}/{}: libvirt's description is not XML: {error}",
            backing.pool, backing.volume
        ))
    })?;
    let root = document.root_element();
    if root
        .children()
        .any(|node| node.has_tag_name("backingStore") && node.has_children())
    {
        return Err(error::denied(format!(
            "backing store {}/{} is itself backed by another file: refused",
            backing.pool, backing.volume
        )));
    }
    let format = root
        .children()
        .find(|node| node.has_tag_name("target"))
        .and_then(|target| target.children().find(|node| node.has_tag_name("format")))
        .and_then(|format| format.attribute("type"))
        .unwrap_or("raw")
        .to_owned();
    Ok((volume.get_path().map_err(named)?, format))
}

/// `Ok(None)` for a lookup of something that is not there.
fn found<T>(outcome: Result<T, virt::error::Error>) -> Result<Option<T>, Error> {
    match outcome {
        Ok(value) => Ok(Some(value)),
        Err(error) if error::is_missing(&error) => Ok(None),
        Err(error) => Err(lv(error)),
    }
}

fn state(raw: sys::virDomainState) -> DomainState {
    match raw {
        sys::VIR_DOMAIN_RUNNING => DomainState::Running,
        sys::VIR_DOMAIN_BLOCKED => DomainState::Blocked,
        sys::VIR_DOMAIN_PAUSED => DomainState::Paused,
        sys::VIR_DOMAIN_SHUTDOWN => DomainState::Shutdown,
        sys::VIR_DOMAIN_SHUTOFF => DomainState::Shutoff,
        sys::VIR_DOMAIN_CRASHED => DomainState::Crashed,
        sys::VIR_DOMAIN_PMSUSPENDED => DomainState::PmSuspended,
        _ => DomainState::NoState,
    }
}

fn status(domain: &virt::domain::Domain) -> Result<DomainStatus, virt::error::Error> {
    let (raw, reason) = domain.get_state()?;
    Ok(DomainStatus {
        state: state(raw),
        reason,
    })
}

/// The provider's metadata element of `domain`, or `None`.
fn metadata(
    domain: &virt::domain::Domain,
    namespace: &str,
) -> Result<Option<String>, virt::error::Error> {
    match domain.get_metadata(
        sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
        Some(namespace),
        sys::VIR_DOMAIN_AFFECT_CURRENT,
    ) {
        Ok(xml) => Ok(Some(xml)),
        Err(error) if error.code().to_raw() == sys::VIR_ERR_NO_DOMAIN_METADATA => Ok(None),
        Err(error) => Err(error),
    }
}

/// A `Domain` resource for a domain libvirt handed back.
fn domain_resource(
    connection: &Connection,
    domain: virt::domain::Domain,
) -> Result<Domain, virt::error::Error> {
    Ok(Domain {
        name: domain.get_name()?,
        uuid: domain.get_uuid_string()?,
        conn: connection.conn.clone(),
        access: connection.access.clone(),
        domain: Arc::new(domain),
    })
}

fn volume_resource(
    conn: &Arc<Conn>,
    volume: virt::storage_vol::StorageVol,
) -> Result<Volume, virt::error::Error> {
    Ok(Volume {
        name: volume.get_name()?,
        conn: conn.clone(),
        volume: Arc::new(volume),
    })
}

impl LibvirtCtxView<'_> {
    async fn open_connection(
        &mut self,
        name: String,
        pooled: bool,
    ) -> Outcome<Resource<Connection>> {
        if let Err(invalid) = call::bounded("connection name", &name, call::MAX_NAME_BYTES) {
            return Ok(Err(invalid));
        }
        let access = match self.ctx.grant() {
            Ok(grant) => match grant.connections.get(&name) {
                Some(access) => access.clone(),
                None => {
                    return Ok(Err(error::denied(format!(
                        "connection {name:?} is not granted"
                    ))));
                }
            },
            Err(denied) => return Ok(Err(denied)),
        };
        let shared = self.ctx.shared.clone();
        let dialing = access.clone();
        let conn = self
            .ctx
            .blocking(None, move || {
                let dialed = if pooled {
                    shared.pool.get(&dialing)
                } else {
                    conn::dial_unpooled(&dialing).map(Arc::new)
                };
                dialed.map_err(Error::from)
            })
            .await?;
        Ok(match conn {
            Ok(conn) => Ok(self.table.push(Connection { conn, access })?),
            Err(error) => Err(error),
        })
    }

    /// One connection of a probe, checked against the grant: what to dial, or why not.
    fn probe_target(
        &self,
        name: &str,
        pool: &str,
    ) -> Result<Arc<crate::conn::ActiveConnection>, Error> {
        let grant = self.ctx.grant()?;
        let Some(access) = grant.connections.get(name) else {
            return Err(error::denied(format!("connection {name:?} is not granted")));
        };
        if !access.pools.contains(pool) {
            return Err(error::denied(format!(
                "pool {pool:?} is not granted on connection {name}"
            )));
        }
        Ok(access.clone())
    }

    /// The provider's metadata namespace.
    fn namespace(&self) -> Result<String, Error> {
        Ok(self.ctx.grant()?.namespace.clone())
    }
}

impl Host for LibvirtCtxView<'_> {}

impl HostConnection for LibvirtCtxView<'_> {
    async fn open(&mut self, name: String) -> Outcome<Resource<Connection>> {
        self.open_connection(name, true).await
    }

    async fn open_unpooled(&mut self, name: String) -> Outcome<Resource<Connection>> {
        self.open_connection(name, false).await
    }

    async fn probe(
        &mut self,
        names: Vec<String>,
        pool: String,
        timeout_ms: u32,
    ) -> Outcome<Vec<Result<Health, Error>>> {
        self.ctx.shared.count_call()?;
        if names.len() > MAX_PROBES {
            return Ok(Err(Error::Invalid(format!(
                "a probe checks at most {MAX_PROBES} connections, not {}",
                names.len()
            ))));
        }
        let checked = call::name("pool name", &pool).and_then(|()| {
            names
                .iter()
                .try_for_each(|name| call::bounded("connection name", name, call::MAX_NAME_BYTES))
        });
        if let Err(invalid) = checked {
            return Ok(Err(invalid));
        }
        let timeout = std::time::Duration::from_millis(timeout_ms.into());
        let stop = self.ctx.stop_at(self.ctx.call_timeout().min(timeout));
        // Every dial starts before any answer is awaited: the probe takes as long as the slowest.
        let probes: Vec<_> = names
            .iter()
            .map(|name| {
                let access = self.probe_target(name, &pool)?;
                let pool = pool.clone();
                Ok(tokio::task::spawn_blocking(move || health(&access, &pool)))
            })
            .collect();
        let mut answers = Vec::with_capacity(probes.len());
        for (name, probe) in names.iter().zip(probes) {
            let answer = match (probe, stop) {
                (Err(refused), _) => Err(refused),
                (Ok(_), None) => Err(Error::Timeout),
                (Ok(task), Some(stop)) => {
                    match tokio::time::timeout_at(tokio::time::Instant::from_std(stop), task).await
                    {
                        Ok(Ok(answer)) => answer,
                        Ok(Err(join)) => {
                            return Err(wasmtime::format_err!("a libvirt probe failed: {join}"));
                        }
                        // The dial goes on in the background; its connection closes when it ends.
                        Err(_elapsed) => {
                            tracing::warn!(connection = %name, "libvirt probe timed out");
                            Err(Error::Timeout)
                        }
                    }
                }
            };
            answers.push(answer);
        }
        Ok(Ok(answers))
    }

    async fn version(&mut self, this: Resource<Connection>) -> Outcome<String> {
        let conn = self.table.get(&this)?.conn.clone();
        let on = conn.clone();
        self.ctx
            .blocking(Some(&on), move || version_of(conn.connect()))
            .await
    }

    async fn define_domain(
        &mut self,
        this: Resource<Connection>,
        xml: String,
    ) -> Outcome<Resource<Domain>> {
        if let Err(invalid) = call::bounded("domain XML", &xml, MAX_DOMAIN_XML_BYTES) {
            return Ok(Err(invalid));
        }
        let namespace = match self.namespace() {
            Ok(namespace) => namespace,
            Err(denied) => return Ok(Err(denied)),
        };
        let connection = self.table.get(&this)?;
        let access = connection.access.clone();
        let scope = policy::DomainScope {
            pools: &access.pools,
            networks: &access.networks,
            bridges: &access.bridges,
            namespace: &namespace,
        };
        if let Err(refused) = policy::check_domain(&xml, &scope) {
            return Ok(Err(refused));
        }
        let handle = Connection {
            conn: connection.conn.clone(),
            access: connection.access.clone(),
        };
        let on = handle.conn.clone();
        let defined = self
            .ctx
            .blocking(Some(&on), move || {
                let domain =
                    virt::domain::Domain::define_xml(handle.conn.connect(), &xml).map_err(lv)?;
                domain_resource(&handle, domain).map_err(lv)
            })
            .await?;
        Ok(match defined {
            Ok(domain) => Ok(self.table.push(domain)?),
            Err(error) => Err(error),
        })
    }

    async fn lookup_domain(
        &mut self,
        this: Resource<Connection>,
        name: String,
    ) -> Outcome<Option<Resource<Domain>>> {
        if let Err(invalid) = call::name("domain name", &name) {
            return Ok(Err(invalid));
        }
        self.lookup(this, move |connect| {
            virt::domain::Domain::lookup_by_name(connect, &name)
        })
        .await
    }

    async fn lookup_domain_by_uuid(
        &mut self,
        this: Resource<Connection>,
        uuid: String,
    ) -> Outcome<Option<Resource<Domain>>> {
        if let Err(invalid) = call::uuid(&uuid) {
            return Ok(Err(invalid));
        }
        self.lookup(this, move |connect| {
            virt::domain::Domain::lookup_by_uuid_string(connect, &uuid)
        })
        .await
    }

    async fn list_domains(&mut self, this: Resource<Connection>) -> Outcome<Vec<DomainSummary>> {
        let namespace = match self.namespace() {
            Ok(namespace) => namespace,
            Err(denied) => return Ok(Err(denied)),
        };
        let conn = self.table.get(&this)?.conn.clone();
        let on = conn.clone();
        self.ctx
            .blocking(Some(&on), move || {
                let domains = conn.connect().list_all_domains(0).map_err(lv)?;
                let mut summaries = Vec::with_capacity(domains.len());
                for domain in domains {
                    let summary = (|| {
                        Ok(DomainSummary {
                            name: domain.get_name()?,
                            uuid: domain.get_uuid_string()?,
                            status: status(&domain)?,
                            metadata: metadata(&domain, &namespace)?,
                        })
                    })();
                    match summary {
                        Ok(summary) => summaries.push(summary),
                        // Undefined while we listed.
                        Err(error) if error::is_missing(&error) => {}
                        Err(error) => return Err(lv(error)),
                    }
                }
                Ok(summaries)
            })
            .await
    }

    async fn storage_pool(
        &mut self,
        this: Resource<Connection>,
        name: String,
    ) -> Outcome<Resource<StoragePool>> {
        if let Err(invalid) = call::name("pool name", &name) {
            return Ok(Err(invalid));
        }
        let connection = self.table.get(&this)?;
        if !connection.access.pools.contains(&name) {
            return Ok(Err(error::denied(format!(
                "pool {name:?} is not granted on connection {}",
                connection.access.name
            ))));
        }
        let conn = connection.conn.clone();
        let access = connection.access.clone();
        let hypervisor = connection.access.hypervisor();
        let on = conn.clone();
        let pool = self
            .ctx
            .blocking(Some(&on), move || {
                let pool = virt::storage_pool::StoragePool::lookup_by_name(conn.connect(), &name)
                    .map_err(lv)?;
                Ok(StoragePool {
                    conn,
                    access,
                    hypervisor,
                    pool: Arc::new(pool),
                    name,
                })
            })
            .await?;
        Ok(match pool {
            Ok(pool) => Ok(self.table.push(pool)?),
            Err(error) => Err(error),
        })
    }

    async fn drop(&mut self, this: Resource<Connection>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl LibvirtCtxView<'_> {
    async fn lookup(
        &mut self,
        this: Resource<Connection>,
        find: impl FnOnce(&virt::connect::Connect) -> Result<virt::domain::Domain, virt::error::Error>
        + Send
        + 'static,
    ) -> Outcome<Option<Resource<Domain>>> {
        let connection = self.table.get(&this)?;
        let handle = Connection {
            conn: connection.conn.clone(),
            access: connection.access.clone(),
        };
        let on = handle.conn.clone();
        let looked_up = self
            .ctx
            .blocking(Some(&on), move || {
                let Some(domain) = found(find(handle.conn.connect()))? else {
                    return Ok(None);
                };
                found(domain_resource(&handle, domain))
            })
            .await?;
        Ok(match looked_up {
            Ok(Some(domain)) => Ok(Some(self.table.push(domain)?)),
            Ok(None) => Ok(None),
            Err(error) => Err(error),
        })
    }

    /// Runs `work` on the domain behind `this`.
    async fn on_domain<T: Send + 'static>(
        &mut self,
        this: &Resource<Domain>,
        work: impl FnOnce(&virt::domain::Domain) -> Result<T, Error> + Send + 'static,
    ) -> Outcome<T> {
        let domain = self.table.get(this)?;
        let (conn, handle) = (domain.conn.clone(), domain.domain.clone());
        self.ctx.blocking(Some(&conn), move || work(&handle)).await
    }
}

impl HostDomain for LibvirtCtxView<'_> {
    async fn name(&mut self, this: Resource<Domain>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name.clone())
    }

    async fn uuid(&mut self, this: Resource<Domain>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.uuid.clone())
    }

    async fn start(&mut self, this: Resource<Domain>) -> Outcome<()> {
        self.on_domain(&this, |domain| domain.create().map(drop).map_err(lv))
            .await
    }

    async fn destroy(&mut self, this: Resource<Domain>) -> Outcome<()> {
        self.on_domain(&this, |domain| domain.destroy().map_err(lv))
            .await
    }

    async fn undefine(&mut self, this: Resource<Domain>) -> Outcome<()> {
        let flags = self.table.get(&this)?.access.undefine_flags;
        self.on_domain(&this, move |domain| {
            domain.undefine_flags(flags).map_err(lv)
        })
        .await
    }

    async fn status(&mut self, this: Resource<Domain>) -> Outcome<DomainStatus> {
        self.on_domain(&this, |domain| status(domain).map_err(lv))
            .await
    }

    async fn metadata(&mut self, this: Resource<Domain>) -> Outcome<Option<String>> {
        let namespace = match self.namespace() {
            Ok(namespace) => namespace,
            Err(denied) => return Ok(Err(denied)),
        };
        self.on_domain(&this, move |domain| {
            metadata(domain, &namespace).map_err(lv)
        })
        .await
    }

    async fn set_metadata(&mut self, this: Resource<Domain>, xml: Option<String>) -> Outcome<()> {
        if let Some(xml) = &xml {
            let checked = call::bounded("metadata", xml, MAX_METADATA_BYTES)
                .and_then(|()| policy::check_metadata(xml));
            if let Err(invalid) = checked {
                return Ok(Err(invalid));
            }
        }
        let namespace = match self.namespace() {
            Ok(namespace) => namespace,
            Err(denied) => return Ok(Err(denied)),
        };
        self.on_domain(&this, move |domain| {
            let mut flags = 0;
            if domain.is_persistent().map_err(lv)? {
                flags |= sys::VIR_DOMAIN_AFFECT_CONFIG;
            }
            if domain.is_active().map_err(lv)? {
                flags |= sys::VIR_DOMAIN_AFFECT_LIVE;
            }
            let key = xml.as_ref().map(|_| METADATA_PREFIX);
            domain
                .set_metadata(
                    sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
                    xml.as_deref(),
                    key,
                    Some(&namespace),
                    flags,
                )
                .map(drop)
                .map_err(lv)
        })
        .await
    }

    async fn autostart(&mut self, this: Resource<Domain>) -> Outcome<bool> {
        self.on_domain(&this, |domain| domain.get_autostart().map_err(lv))
            .await
    }

    async fn set_autostart(&mut self, this: Resource<Domain>, enabled: bool) -> Outcome<()> {
        self.on_domain(&this, move |domain| {
            domain.set_autostart(enabled).map(drop).map_err(lv)
        })
        .await
    }

    async fn interface_addresses(&mut self, this: Resource<Domain>) -> Outcome<InterfaceAddresses> {
        self.on_domain(&this, |domain| {
            let agent = crate::addresses::interface_addresses(
                domain,
                sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
            );
            match agent {
                Ok(interfaces)
                    if interfaces
                        .iter()
                        .any(|interface| !interface.addresses.is_empty()) =>
                {
                    return Ok(InterfaceAddresses {
                        source: AddressSource::Agent,
                        interfaces,
                    });
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "no addresses from the guest agent; trying leases");
                }
            }
            let interfaces = crate::addresses::interface_addresses(
                domain,
                sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
            )
            .map_err(lv)?;
            Ok(InterfaceAddresses {
                source: AddressSource::Lease,
                interfaces,
            })
        })
        .await
    }

    async fn drop(&mut self, this: Resource<Domain>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl LibvirtCtxView<'_> {
    /// Creates a volume in the pool behind `this` from checked XML, cloning `base` when given,
    /// backed by the volume the XML names when it names one.
    async fn create_volume_from(
        &mut self,
        this: Resource<StoragePool>,
        xml: String,
        base: Option<Resource<Volume>>,
    ) -> Outcome<Resource<Volume>> {
        let checked = call::bounded("volume XML", &xml, call::MAX_VOLUME_XML_BYTES)
            .and_then(|()| policy::check_volume(&xml));
        let request = match checked {
            Ok(request) => request,
            Err(refused) => return Ok(Err(refused)),
        };
        let pool = self.table.get(&this)?;
        if let Some(backing) = &request.backing {
            if base.is_some() {
                return Ok(Err(Error::Invalid(
                    "a clone is a whole copy of its source: name a backing store with create-volume"
                        .into(),
                )));
            }
            if !pool.access.pools.contains(&backing.pool) {
                return Ok(Err(error::denied(format!(
                    "backing store {}/{}: pool {:?} is not granted on connection {}",
                    backing.pool, backing.volume, backing.pool, pool.access.name
                ))));
            }
        }
        let base = match base {
            Some(base) => Some(self.table.get(&base)?.volume.clone()),
            None => None,
        };
        let asked = policy::capacity_bytes(&xml);
        let pool = self.table.get(&this)?;
        let (conn, handle) = (pool.conn.clone(), pool.pool.clone());
        let hypervisor = pool.hypervisor.clone();
        let state = self.ctx.shared.retention.clone();
        let on = conn.clone();
        let created = self
            .ctx
            .blocking(Some(&on), move || {
                // A volume backed by another holds the hypervisor's lock shared, so no prune
                // removes the other meanwhile, and records its use (`retention`). A clone needs
                // neither: libvirt refuses to delete a volume it copies from.
                let ordered = state.lock(&hypervisor);
                let _held = request.backing.as_ref().map(|backing| {
                    state.used(VolumeKey {
                        hypervisor: hypervisor.clone(),
                        pool: backing.pool.clone(),
                        volume: backing.volume.clone(),
                    });
                    ordered
                        .read()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                });
                let xml = match &request.backing {
                    Some(backing) => {
                        let (path, format) = resolve_backing(conn.connect(), backing)?;
                        policy::with_backing_path(&xml, backing, &path, &format)
                    }
                    None => xml,
                };
                let volume = match &base {
                    Some(base) => {
                        let clone =
                            virt::storage_vol::StorageVol::create_xml_from(&handle, &xml, base, 0)
                                .map_err(lv)?;
                        // libvirt copies a qcow2 base with `qemu-img convert`, which keeps the
                        // base's size whatever capacity the XML asks: grow the clone to it.
                        let had = clone.get_info().map_err(lv)?.capacity;
                        if let Some(asked) = asked.filter(|asked| *asked > had) {
                            clone.resize(asked, 0).map_err(lv)?;
                        }
                        Ok(clone)
                    }
                    None => virt::storage_vol::StorageVol::create_xml(&handle, &xml, 0).map_err(lv),
                }?;
                volume_resource(&conn, volume).map_err(lv)
            })
            .await?;
        Ok(match created {
            Ok(volume) => Ok(self.table.push(volume)?),
            Err(error) => Err(error),
        })
    }
}

impl HostStoragePool for LibvirtCtxView<'_> {
    async fn name(&mut self, this: Resource<StoragePool>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name.clone())
    }

    async fn info(&mut self, this: Resource<StoragePool>) -> Outcome<PoolInfo> {
        let pool = self.table.get(&this)?;
        let (conn, handle) = (pool.conn.clone(), pool.pool.clone());
        self.ctx
            .blocking(Some(&conn), move || {
                let info = handle.get_info().map_err(lv)?;
                Ok(PoolInfo {
                    capacity: info.capacity,
                    allocation: info.allocation,
                    available: info.available,
                })
            })
            .await
    }

    async fn create_volume(
        &mut self,
        this: Resource<StoragePool>,
        xml: String,
    ) -> Outcome<Resource<Volume>> {
        self.create_volume_from(this, xml, None).await
    }

    async fn clone_volume(
        &mut self,
        this: Resource<StoragePool>,
        xml: String,
        base: Resource<Volume>,
    ) -> Outcome<Resource<Volume>> {
        self.create_volume_from(this, xml, Some(base)).await
    }

    async fn lookup_volume(
        &mut self,
        this: Resource<StoragePool>,
        name: String,
    ) -> Outcome<Option<Resource<Volume>>> {
        if let Err(invalid) = call::name("volume name", &name) {
            return Ok(Err(invalid));
        }
        let pool = self.table.get(&this)?;
        let (conn, handle) = (pool.conn.clone(), pool.pool.clone());
        let on = conn.clone();
        let looked_up = self
            .ctx
            .blocking(Some(&on), move || {
                let Some(volume) = found(virt::storage_vol::StorageVol::lookup_by_name(
                    &handle, &name,
                ))?
                else {
                    return Ok(None);
                };
                found(volume_resource(&conn, volume))
            })
            .await?;
        Ok(match looked_up {
            Ok(Some(volume)) => Ok(Some(self.table.push(volume)?)),
            Ok(None) => Ok(None),
            Err(error) => Err(error),
        })
    }

    async fn import_image(
        &mut self,
        this: Resource<StoragePool>,
        name: String,
        url: String,
        sha256: String,
    ) -> Outcome<Resource<Volume>> {
        self.ctx.shared.count_call()?;
        let pool = self.table.get(&this)?;
        let (conn, handle) = (pool.conn.clone(), pool.pool.clone());
        let place = import::Place {
            hypervisor: pool.hypervisor.clone(),
            pool: pool.name.clone(),
        };
        let imported =
            import::import(self.ctx, conn.clone(), handle, place, name, url, sha256).await?;
        Ok(match imported {
            Ok(volume) => {
                Ok(self
                    .table
                    .push(volume_resource(&conn, volume).map_err(|error| {
                        wasmtime::format_err!("reading an imported volume: {error}")
                    })?)?)
            }
            Err(error) => Err(error),
        })
    }

    async fn prune_images(
        &mut self,
        this: Resource<StoragePool>,
        prefix: String,
    ) -> Outcome<Vec<String>> {
        if let Err(invalid) = call::name("image name prefix", &prefix) {
            return Ok(Err(invalid));
        }
        let retention = match self.ctx.grant() {
            Ok(grant) => match &grant.images {
                Some(images) => images.unused_retention,
                // A base put in place by a person: the host could not import it again.
                None => return Ok(Ok(Vec::new())),
            },
            Err(denied) => return Ok(Err(denied)),
        };
        let pool = self.table.get(&this)?;
        let (conn, handle) = (pool.conn.clone(), pool.pool.clone());
        let place = import::Place {
            hypervisor: pool.hypervisor.clone(),
            pool: pool.name.clone(),
        };
        let (imports, state) = (
            self.ctx.shared.imports.clone(),
            self.ctx.shared.retention.clone(),
        );
        let on = conn.clone();
        self.ctx
            .blocking(Some(&on), move || {
                let importing = |volume: &str| imports.is_running(&place, volume);
                retention::prune(
                    conn.connect(),
                    &handle,
                    &state,
                    &retention::Prune {
                        hypervisor: &place.hypervisor,
                        pool: &place.pool,
                        prefix: &prefix,
                        retention,
                        importing: &importing,
                    },
                )
            })
            .await
    }

    async fn drop(&mut self, this: Resource<StoragePool>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl HostVolume for LibvirtCtxView<'_> {
    async fn name(&mut self, this: Resource<Volume>) -> wasmtime::Result<String> {
        Ok(self.table.get(&this)?.name.clone())
    }

    async fn path(&mut self, this: Resource<Volume>) -> Outcome<String> {
        let volume = self.table.get(&this)?;
        let (conn, handle) = (volume.conn.clone(), volume.volume.clone());
        self.ctx
            .blocking(Some(&conn), move || handle.get_path().map_err(lv))
            .await
    }

    async fn info(&mut self, this: Resource<Volume>) -> Outcome<VolumeInfo> {
        let volume = self.table.get(&this)?;
        let (conn, handle) = (volume.conn.clone(), volume.volume.clone());
        self.ctx
            .blocking(Some(&conn), move || {
                let info = handle.get_info().map_err(lv)?;
                Ok(VolumeInfo {
                    capacity: info.capacity,
                    allocation: info.allocation,
                })
            })
            .await
    }

    async fn delete(&mut self, this: Resource<Volume>) -> Outcome<()> {
        let volume = self.table.get(&this)?;
        let (conn, handle) = (volume.conn.clone(), volume.volume.clone());
        self.ctx
            .blocking(Some(&conn), move || handle.delete(0).map_err(lv))
            .await
    }

    async fn upload(&mut self, this: Resource<Volume>) -> Outcome<Resource<VolumeUpload>> {
        let max = match self.ctx.grant() {
            Ok(grant) => grant.max_upload_bytes,
            Err(denied) => return Ok(Err(denied)),
        };
        let volume = self.table.get(&this)?;
        let (conn, handle) = (volume.conn.clone(), volume.volume.clone());
        let opening = conn.clone();
        let stream = self
            .ctx
            .blocking(Some(&conn), move || {
                let stream = virt::stream::Stream::new(opening.connect(), 0).map_err(lv)?;
                // Offset 0, length 0: from the first byte to wherever the guest stops.
                match handle.upload(&stream, 0, 0, 0) {
                    Ok(()) => Ok(OpenStream::new(stream)),
                    Err(error) => Err(lv(error)),
                }
            })
            .await?;
        Ok(match stream {
            Ok(stream) => Ok(self.table.push(VolumeUpload {
                conn,
                stream: Arc::new(stream),
                written: 0,
                max,
                broken: false,
            })?),
            Err(error) => Err(error),
        })
    }

    async fn drop(&mut self, this: Resource<Volume>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl HostVolumeUpload for LibvirtCtxView<'_> {
    async fn write(&mut self, this: Resource<VolumeUpload>, chunk: Vec<u8>) -> Outcome<()> {
        let upload = self.table.get(&this)?;
        if upload.broken {
            return Ok(Err(Error::Invalid(
                "this upload failed earlier; start a new one".into(),
            )));
        }
        if chunk.len() > MAX_CHUNK_BYTES {
            return Ok(Err(Error::Invalid(format!(
                "a chunk is {} bytes, more than {MAX_CHUNK_BYTES}",
                chunk.len()
            ))));
        }
        let length = chunk.len() as u64;
        if upload.written.saturating_add(length) > upload.max {
            return Ok(Err(Error::Invalid(format!(
                "the upload would exceed the grant's maxUploadBytes ({})",
                upload.max
            ))));
        }
        let (conn, stream) = (upload.conn.clone(), upload.stream.clone());
        let sending = stream.clone();
        let sent = self
            .ctx
            .blocking(Some(&conn), move || {
                sending.send_all(&chunk).map_err(|error| {
                    sending.abort();
                    lv(error)
                })
            })
            .await?;
        let upload = self.table.get_mut(&this)?;
        match &sent {
            Ok(()) => upload.written += length,
            Err(_) => {
                upload.broken = true;
                // After a timeout the send may still be running: abort once it lets go.
                crate::call::off_executor(move || stream.abort());
            }
        }
        Ok(sent)
    }

    async fn finish(&mut self, this: Resource<VolumeUpload>) -> Outcome<u64> {
        let upload = self.table.delete(this)?;
        if upload.broken {
            return Ok(Err(Error::Invalid(
                "this upload failed earlier; start a new one".into(),
            )));
        }
        let (stream, written) = (upload.stream.clone(), upload.written);
        self.ctx
            .blocking(Some(&upload.conn), move || match stream.finish() {
                Ok(_) => Ok(written),
                Err(error) => Err(lv(error)),
            })
            .await
    }

    async fn drop(&mut self, this: Resource<VolumeUpload>) -> wasmtime::Result<()> {
        // Dropping the last reference to an unfinished stream aborts it.
        self.table.delete(this)?;
        Ok(())
    }
}
