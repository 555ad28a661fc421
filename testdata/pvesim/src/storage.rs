//! The storage endpoints under `/nodes/{node}/storage/{storage}`: ISO upload, content listing,
//! status and volume delete. Each node has its own copy of a storage that is not shared (its
//! `local`, `local-lvm`, `proxy-seeds`), so a volume uploaded through one node is on that node
//! only, as on a real cluster; a shared storage's disks are seen from every node.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::access::{require, require_any};
use crate::api::{ApiRequest, Ctx, Server, start_task};
use crate::model;
use crate::params::Params;
use crate::reply::{ApiError, MISSING};
use crate::state::{Guest, Inner, Volume};
use crate::tasks::Work;

fn content_dir(content: &str) -> &'static str {
    match content {
        "vztmpl" => "vztmpl",
        "import" => "import",
        _ => "iso",
    }
}

fn extension_ok(content: &str, filename: &str) -> bool {
    let lower = filename.to_ascii_lowercase();
    let endings: &[&str] = match content {
        "iso" => &[".iso", ".img"],
        "vztmpl" => &[".tar.gz", ".tar.xz", ".tar.zst"],
        _ => &[".raw", ".qcow2", ".vmdk", ".ova"],
    };
    endings
        .iter()
        .any(|e| lower.len() > e.len() && lower.ends_with(e))
}

/// F12, F23: multipart with `content` and a `filename` file part; overwrite is silent. The file
/// lands on `node`'s own copy of the storage, as the upload runs on the node the URL names.
pub(crate) async fn upload(
    server: &Arc<Server>,
    ctx: &Ctx,
    node: &str,
    storage: &str,
    request: &ApiRequest,
) -> Result<Value, ApiError> {
    require(
        &ctx.token,
        &format!("/storage/{storage}"),
        "Datastore.AllocateTemplate",
    )?;
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    let mut file: Option<(String, Bytes)> = None;
    if let Ok(boundary) = multer::parse_boundary(&request.content_type) {
        let body = request.body.clone();
        let stream = futures_util::stream::once(async move { Ok::<Bytes, std::io::Error>(body) });
        let mut multipart = multer::Multipart::new(stream, boundary);
        loop {
            let field = match multipart.next_field().await {
                Ok(Some(field)) => field,
                Ok(None) => break,
                Err(err) => {
                    return Err(ApiError::new(
                        400,
                        format!("malformed multipart body: {err}"),
                    ));
                }
            };
            let name = field.name().unwrap_or_default().to_string();
            let file_name = field.file_name().map(str::to_string);
            let bytes = field
                .bytes()
                .await
                .map_err(|err| ApiError::new(400, format!("malformed multipart body: {err}")))?;
            match file_name {
                Some(file_name) if name == "filename" => file = Some((file_name, bytes)),
                _ => {
                    fields.insert(name, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
    } else {
        fields.extend(request.params().0);
    }
    let params = Params(fields);
    params.allow(&[
        "content",
        "filename",
        "checksum",
        "checksum-algorithm",
        "tmpfilename",
    ])?;
    let content = params.required("content")?.to_string();
    if !["iso", "vztmpl", "import"].contains(&content.as_str()) {
        return Err(ApiError::param(
            "content",
            format!(
                "value '{content}' does not have a value in the enumeration 'iso, vztmpl, import'"
            ),
        ));
    }
    let Some((raw_name, bytes)) = file else {
        return Err(ApiError::param("filename", MISSING));
    };
    let filename: String = raw_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    if !scfg.content.contains(&content.as_str()) {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not support '{content}' content"
        )));
    }
    if !extension_ok(&content, &filename) {
        return Err(ApiError::param("filename", "wrong file extension"));
    }
    let volid = format!("{storage}:{}/{filename}", content_dir(&content));
    let work = Work::Upload {
        volid,
        filename,
        bytes,
    };
    // The imgcopy task has an empty id.
    Ok(json!(start_task(
        server, ctx, &mut inner, node, "imgcopy", "", work
    )))
}

/// `GET /nodes/{node}/storage/{storage}/content`: the volumes on `node`'s copy of the storage,
/// and the disks on it of the guests it holds (on a shared storage, every node's guests).
pub(crate) fn list_content(
    server: &Server,
    ctx: &Ctx,
    node: &str,
    storage: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require_any(&ctx.token, &format!("/storage/{storage}"), STORAGE_READ)?;
    params.allow(&["content", "vmid"])?;
    let inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    let wanted = params.get("content");
    let prefix = format!("{storage}:");
    let mut entries: Vec<Value> = stored_on(&inner, node, storage)
        .map(|(volid, volume)| {
            let content = volid[prefix.len()..].split('/').next().unwrap_or("iso");
            json!({"volid": volid, "content": content, "format": content, "size": volume.bytes.len(), "ctime": volume.ctime})
        })
        .collect();
    if scfg.content.contains(&"images") {
        let guests = guests_seeing(&inner, node, scfg.shared);
        for (vmid, guest) in guests.filter(|(_, g)| !g.placeholder) {
            for drive in guest
                .config
                .iter()
                .filter(|(k, _)| model::is_drive_key(k))
                .map(|(_, d)| d)
            {
                let volume = drive.split(',').next().unwrap_or_default();
                if volume.starts_with(&prefix)
                    && model::drive_option(drive, "media") != Some("cdrom")
                {
                    let size = model::drive_option(drive, "size")
                        .and_then(model::parse_size)
                        .unwrap_or(0);
                    entries.push(json!({"volid": volume, "content": "images", "format": "raw", "size": size, "vmid": vmid}));
                }
            }
        }
    }
    if let Some(wanted) = wanted {
        entries.retain(|e| e["content"] == wanted);
    }
    Ok(Value::Array(entries))
}

/// Either lets a token read a storage's status and content (pve-storage).
const STORAGE_READ: &[&str] = &["Datastore.Audit", "Datastore.AllocateSpace"];

/// Capacity the simulated storages report, in bytes (made up: no capture has them).
fn storage_total(storage: &str) -> u64 {
    match storage {
        "local-lvm" => 375_809_638_400,
        "proxy-seeds" => 21_474_836_480,
        _ => 107_374_182_400,
    }
}

/// `GET /nodes/{node}/storage/{storage}/status`: type, content, active, enabled, shared and
/// total/used/avail, where used counts the stored volumes and the disks of guests on it. The
/// unknown-storage text is the one `PVE::Storage::storage_config` dies with (from the upstream
/// source, not a capture), which the other storage endpoints here already give.
pub(crate) fn storage_status(
    server: &Server,
    ctx: &Ctx,
    node: &str,
    storage: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    require_any(&ctx.token, &format!("/storage/{storage}"), STORAGE_READ)?;
    params.allow(&[])?;
    let inner = server.state.lock();
    let Some(scfg) = inner.storage(storage) else {
        return Err(ApiError::internal(format!(
            "storage '{storage}' does not exist"
        )));
    };
    let prefix = format!("{storage}:");
    let volumes: u64 = stored_on(&inner, node, storage)
        .map(|(_, volume)| volume.bytes.len() as u64)
        .sum();
    let disks: u64 = guests_seeing(&inner, node, scfg.shared)
        .flat_map(|(_, guest)| guest.config.iter())
        .filter(|(key, drive)| {
            model::is_drive_key(key)
                && drive.starts_with(&prefix)
                && model::drive_option(drive, "media") != Some("cdrom")
        })
        .filter_map(|(_, drive)| model::drive_option(drive, "size").and_then(model::parse_size))
        .sum();
    let total = storage_total(storage);
    let used = (volumes + disks).min(total);
    Ok(json!({
        "type": scfg.plugin, "content": scfg.content.join(","), "active": 1, "enabled": 1,
        "shared": u8::from(scfg.shared), "total": total, "used": used, "avail": total - used,
    }))
}

/// F13: needs Datastore.Allocate on the volume's storage; a missing volume still ends OK. It
/// removes the volume from `node`'s copy of the storage only.
pub(crate) fn delete_volume(
    server: &Arc<Server>,
    ctx: &Ctx,
    node: &str,
    storage: &str,
    volume: &str,
    params: &Params,
) -> Result<Value, ApiError> {
    params.allow(&["delay"])?;
    let volid = if volume.contains(':') {
        volume.to_string()
    } else {
        format!("{storage}:{volume}")
    };
    let storeid = volid.split(':').next().unwrap_or(storage).to_string();
    let mut inner = server.state.lock();
    if inner.storage(&storeid).is_none() {
        return Err(ApiError::internal(format!(
            "storage '{storeid}' does not exist"
        )));
    }
    require(
        &ctx.token,
        &format!("/storage/{storeid}"),
        "Datastore.Allocate",
    )?;
    let work = Work::DeleteVolume { volid };
    Ok(json!(start_task(
        server, ctx, &mut inner, node, "imgdel", &storeid, work
    )))
}

/// The volumes on `node`'s copy of `storage`, by volid.
fn stored_on<'a>(
    inner: &'a Inner,
    node: &'a str,
    storage: &str,
) -> impl Iterator<Item = (&'a String, &'a Volume)> + 'a {
    let prefix = format!("{storage}:");
    inner
        .volumes
        .iter()
        .filter(move |((holder, volid), _)| holder == node && volid.starts_with(&prefix))
        .map(|((_, volid), volume)| (volid, volume))
}

/// The guests whose disks `node` sees on a storage: its own, or every node's on a shared one.
fn guests_seeing<'a>(
    inner: &'a Inner,
    node: &'a str,
    shared: bool,
) -> impl Iterator<Item = (&'a u32, &'a Guest)> + 'a {
    inner
        .guests
        .iter()
        .filter(move |(_, guest)| shared || guest.node == node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_per_content() {
        assert!(extension_ok("iso", "seed.ISO"));
        assert!(!extension_ok("iso", "seed.txt"));
        assert!(!extension_ok("iso", ".iso"));
        assert!(extension_ok("vztmpl", "debian.tar.zst"));
    }
}
