//! Raw bindings to the `egress:libvirt` package: the types the guest sees and the `Host*` traits
//! this crate implements on [`LibvirtCtxView`](crate::LibvirtCtxView).

#[expect(missing_docs, reason = "bindgen-generated code")]
mod generated {
    wasmtime::component::bindgen!({
        path: "../../../wit/libvirt",
        world: "egress:libvirt/imports",
        imports: { default: async | trappable },
        require_store_data_send: true,
        with: {
            "egress:libvirt/libvirt.connection": crate::resources::Connection,
            "egress:libvirt/libvirt.domain": crate::resources::Domain,
            "egress:libvirt/libvirt.storage-pool": crate::resources::StoragePool,
            "egress:libvirt/libvirt.volume": crate::resources::Volume,
            "egress:libvirt/libvirt.volume-upload": crate::resources::VolumeUpload,
        },
    });
}

pub use self::generated::egress;
pub use self::generated::{Imports, ImportsIndices, ImportsPre};
