//! An open device (`ibv_context`): the root every other verbs resource hangs from.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as ffi;

use super::device::{DeviceList, LinkLayer};
use crate::error::{Error, Result};

/// The limits of a device that queue-pair setup needs.
#[derive(Debug, Clone)]
pub(crate) struct DeviceCaps {
    pub(crate) ports: u8,
    pub(crate) node_guid: u64,
    pub(crate) firmware: String,
    pub(crate) max_qp_wr: u32,
    pub(crate) max_cqe: u32,
    /// RDMA READs a QP may have outstanding as initiator.
    pub(crate) max_init_rd_atom: u8,
    /// RDMA READs a QP may serve at once as responder.
    pub(crate) max_rd_atom: u8,
}

/// What a port reports, in safe types.
#[derive(Debug, Clone)]
pub(crate) struct PortAttr {
    pub(crate) state_name: String,
    pub(crate) active: bool,
    pub(crate) link_layer: LinkLayer,
    pub(crate) lid: u16,
    /// `ibv_mtu` value (1..=5).
    pub(crate) active_mtu: u8,
    pub(crate) active_mtu_bytes: u32,
    pub(crate) gid_table_len: u32,
    pub(crate) max_msg_size: u32,
}

/// An open device. Every other resource holds an `Arc` of it, so it is closed last.
pub(crate) struct Context {
    ptr: NonNull<ffi::ibv_context>,
    name: String,
    caps: DeviceCaps,
}

// SAFETY: libibverbs contexts may be used from any thread, concurrently (verbs calls on
// a context are thread-safe; providers lock internally where they must).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens the device at `index` of `list`.
    ///
    /// # Errors
    /// [`Error::Rdma`] naming the device (permissions on `/dev/infiniband`, a device
    /// being removed).
    pub(crate) fn open(list: &DeviceList, index: usize) -> Result<Arc<Context>> {
        let name = list.name(index);
        let dev = list.device(index);
        if dev.is_null() {
            return Err(Error::NoDevice {
                requested: Some(name),
                available: list.names(),
            });
        }
        // SAFETY: `dev` is a live entry of `list`, which outlives this call.
        let raw = unsafe { ffi::ibv_open_device(dev) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Rdma {
            op: "open device",
            reason: format!("cannot open RDMA device {name:?}"),
            source: Some(io::Error::last_os_error()),
        })?;
        // Own it at once so an error below still closes it.
        let mut ctx = Context {
            ptr,
            name,
            caps: DeviceCaps {
                ports: 0,
                node_guid: 0,
                firmware: String::new(),
                max_qp_wr: 0,
                max_cqe: 0,
                max_init_rd_atom: 0,
                max_rd_atom: 0,
            },
        };
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: the context is open and `attr` is a writable ibv_device_attr.
        let rc = unsafe { ffi::ibv_query_device(ctx.ptr.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(ctx.errno("query device", "ibv_query_device failed", rc));
        }
        // SAFETY: zero-initialised, and ibv_query_device succeeded, so it is filled in;
        // the struct is plain integers and arrays, valid for any bit pattern anyway.
        let attr = unsafe { attr.assume_init() };
        let fw: [u8; 64] = attr.fw_ver.map(|c| c as u8);
        let firmware = CStr::from_bytes_until_nul(&fw)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let clamp_u8 = |v: libc::c_int| u8::try_from(v.max(0)).unwrap_or(u8::MAX);
        ctx.caps = DeviceCaps {
            ports: attr.phys_port_cnt,
            node_guid: attr.node_guid,
            firmware,
            max_qp_wr: u32::try_from(attr.max_qp_wr).unwrap_or(0),
            max_cqe: u32::try_from(attr.max_cqe).unwrap_or(0),
            max_init_rd_atom: clamp_u8(attr.max_qp_init_rd_atom),
            max_rd_atom: clamp_u8(attr.max_qp_rd_atom),
        };
        Ok(Arc::new(ctx))
    }

    /// The device's kernel name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    /// The raw context, for the resources created from it.
    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ptr.as_ptr()
    }

    /// An [`Error::Rdma`] for a verbs call that returned an errno value (`rc > 0`) or
    /// -1 with `errno` set.
    pub(crate) fn errno(&self, op: &'static str, what: &str, rc: libc::c_int) -> Error {
        let source = if rc > 0 {
            io::Error::from_raw_os_error(rc)
        } else {
            io::Error::last_os_error()
        };
        Error::Rdma {
            op,
            reason: format!("{what} on device {:?}", self.name),
            source: Some(source),
        }
    }

    /// Attributes of port `port` (from 1).
    ///
    /// # Errors
    /// [`Error::Rdma`] for a port the device does not have.
    pub(crate) fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port == 0 || port > self.caps.ports {
            return Err(Error::Rdma {
                op: "query port",
                reason: format!(
                    "device {:?} has ports 1..={}, not port {port}",
                    self.name, self.caps.ports
                ),
                source: None,
            });
        }
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: the context is open. The exported ibv_query_port takes the older, shorter
        // `_compat_ibv_port_attr` and writes at most sizeof(struct ibv_port_attr) bytes
        // (libibverbs' __lib_query_port); we hand it a whole, zeroed ibv_port_attr.
        let rc = unsafe {
            ffi::ibv_query_port(
                self.ptr.as_ptr(),
                port,
                attr.as_mut_ptr().cast::<ffi::_compat_ibv_port_attr>(),
            )
        };
        if rc != 0 {
            return Err(self.errno("query port", &format!("ibv_query_port({port}) failed"), rc));
        }
        // SAFETY: zeroed and then filled by a successful query; plain integers only.
        let attr = unsafe { attr.assume_init() };
        // SAFETY: ibv_port_state_str accepts any value and returns a static string.
        let state = unsafe { ffi::ibv_port_state_str(attr.state) };
        let state_name = if state.is_null() {
            format!("state {}", attr.state)
        } else {
            // SAFETY: non-NULL static NUL-terminated string from libibverbs.
            unsafe { CStr::from_ptr(state) }
                .to_string_lossy()
                .into_owned()
        };
        let active_mtu = u8::try_from(attr.active_mtu).unwrap_or(0);
        Ok(PortAttr {
            state_name,
            active: matches!(
                attr.state,
                ffi::ibv_port_state::IBV_PORT_ACTIVE | ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER
            ),
            link_layer: LinkLayer::from_raw(attr.link_layer),
            lid: attr.lid,
            active_mtu,
            active_mtu_bytes: mtu_bytes(active_mtu),
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            max_msg_size: attr.max_msg_sz,
        })
    }

    /// Entry `index` of port `port`'s GID table.
    ///
    /// # Errors
    /// [`Error::Rdma`] for an index outside the table.
    pub(crate) fn query_gid(&self, port: u8, index: u16) -> Result<[u8; 16]> {
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is a writable ibv_gid.
        let rc = unsafe {
            ffi::ibv_query_gid(self.ptr.as_ptr(), port, libc::c_int::from(index), &mut gid)
        };
        if rc != 0 {
            return Err(self.errno(
                "query gid",
                &format!("ibv_query_gid(port {port}, index {index}) failed"),
                rc,
            ));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed exactly once; every resource created from it
        // holds an Arc of this context, so none is left when the last Arc drops.
        let rc = unsafe { ffi::ibv_close_device(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}

/// Bytes of an `ibv_mtu` value.
pub(crate) fn mtu_bytes(mtu: u8) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mtu_values_map_to_bytes() {
        assert_eq!(super::mtu_bytes(1), 256);
        assert_eq!(super::mtu_bytes(3), 1024);
        assert_eq!(super::mtu_bytes(5), 4096);
        assert_eq!(super::mtu_bytes(0), 0);
        assert_eq!(super::mtu_bytes(6), 0);
    }
}
