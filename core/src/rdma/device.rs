//! Device discovery: the libibverbs device list and what [`list_devices`] reports.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::net::Ipv6Addr;
use std::ptr::NonNull;

use rdma_sys as ffi;

use crate::error::{Error, Result};

/// The device list of libibverbs, freed on drop. Device pointers in it stay valid while
/// it lives; contexts opened from them outlive it.
pub(crate) struct DeviceList {
    list: Option<NonNull<*mut ffi::ibv_device>>,
    len: usize,
}

impl DeviceList {
    /// The devices present now. A host without RDMA support (no `ib_uverbs` kernel
    /// module, no `/sys/class/infiniband`) has an empty list, not an error.
    ///
    /// # Errors
    /// [`Error::Rdma`] when libibverbs fails for another reason (out of memory).
    pub(crate) fn get() -> Result<Self> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-parameter; the returned array (or NULL) is owned by
        // us until `ibv_free_device_list`, which `Drop` calls.
        let ptr = unsafe { ffi::ibv_get_device_list(&mut n) };
        match NonNull::new(ptr) {
            Some(list) => Ok(DeviceList {
                list: Some(list),
                len: usize::try_from(n).unwrap_or(0),
            }),
            None => {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    // No kernel support / no devices: libibverbs says ENOSYS (or ENODEV,
                    // ENOENT on some versions). That is an empty list.
                    None | Some(0 | libc::ENOSYS | libc::ENODEV | libc::ENOENT) => {
                        Ok(DeviceList { list: None, len: 0 })
                    }
                    Some(_) => Err(Error::Rdma {
                        op: "list devices",
                        reason: "ibv_get_device_list failed".into(),
                        source: Some(err),
                    }),
                }
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The raw device at `index` (< `len()`), valid while `self` lives.
    pub(crate) fn device(&self, index: usize) -> *mut ffi::ibv_device {
        match self.list {
            Some(list) if index < self.len => {
                // SAFETY: the array has `len` valid entries (then a NULL), and index < len.
                unsafe { *list.as_ptr().add(index) }
            }
            _ => std::ptr::null_mut(),
        }
    }

    /// The kernel name of the device at `index` (`mlx5_0`, `rxe0`).
    pub(crate) fn name(&self, index: usize) -> String {
        let dev = self.device(index);
        if dev.is_null() {
            return String::new();
        }
        // SAFETY: `dev` is a live device of this list; the name it returns is a
        // NUL-terminated string owned by the device, which we copy at once.
        let name = unsafe { ffi::ibv_get_device_name(dev) };
        if name.is_null() {
            return String::new();
        }
        // SAFETY: non-NULL, NUL-terminated, alive while the list is (see above).
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    pub(crate) fn names(&self) -> Vec<String> {
        (0..self.len).map(|i| self.name(i)).collect()
    }

    /// The index of the device called `name`, or of the first device for `None`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] naming what was asked for and what is present.
    pub(crate) fn find(&self, name: Option<&str>) -> Result<usize> {
        let found = match name {
            Some(n) => (0..self.len).find(|&i| self.name(i) == n),
            None => (self.len > 0).then_some(0),
        };
        found.ok_or_else(|| Error::NoDevice {
            requested: name.map(str::to_owned),
            available: self.names(),
        })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if let Some(list) = self.list {
            // SAFETY: the list came from ibv_get_device_list and is freed exactly once.
            // Contexts opened from its devices stay valid (libibverbs refcounts them).
            unsafe { ffi::ibv_free_device_list(list.as_ptr()) }
        }
    }
}

/// How a port is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (LIDs, subnet manager).
    InfiniBand,
    /// Ethernet: RoCE (GIDs address the peer; the LID is 0).
    Ethernet,
    /// The driver did not say (iWARP, older drivers).
    Unspecified,
    /// A value this build does not know.
    Other(u8),
}

impl LinkLayer {
    pub(crate) fn from_raw(v: u8) -> Self {
        // Values of the anonymous IBV_LINK_LAYER_* enum of <infiniband/verbs.h>.
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Other(other),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Unspecified => f.write_str("unspecified"),
            LinkLayer::Other(v) => write!(f, "unknown ({v})"),
        }
    }
}

/// One non-empty entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table (the durl's `gid_index`).
    pub index: u16,
    /// The GID, printed as an IPv6 address (`fe80::...`, `::ffff:10.0.0.1` for RoCE v2
    /// over IPv4).
    pub gid: Ipv6Addr,
    /// The GID type as sysfs names it (`IB/RoCE v1`, `RoCE v2`), where it says.
    pub kind: Option<String>,
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1; the durl's `port`).
    pub port: u8,
    /// Logical state as libibverbs names it (`PORT_ACTIVE`, `PORT_DOWN`).
    pub state: String,
    /// True when the port can carry traffic.
    pub active: bool,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Size of the GID table.
    pub gid_table_len: u32,
    /// The table's non-empty entries.
    pub gids: Vec<GidEntry>,
}

/// One RDMA device, as [`list_devices`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name (`mlx5_0`, `rxe0`): the durl's `device`.
    pub name: String,
    /// Node GUID as four groups of hex digits.
    pub node_guid: String,
    /// Firmware version, if the driver reports one.
    pub firmware: String,
    /// Its ports.
    pub ports: Vec<PortInfo>,
    /// Why the device could not be opened or queried, if it could not (the other
    /// fields are then partly empty).
    pub error: Option<String>,
}

impl fmt::Display for DeviceInfo {
    /// Several lines: the device, then each port with its GIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if !self.node_guid.is_empty() {
            write!(f, "  node GUID {}", self.node_guid)?;
        }
        if !self.firmware.is_empty() {
            write!(f, "  firmware {}", self.firmware)?;
        }
        if let Some(e) = &self.error {
            write!(f, "\n  error: {e}")?;
        }
        for p in &self.ports {
            write!(
                f,
                "\n  port {}: {} link {} lid {} mtu {} ({} GID entries)",
                p.port, p.state, p.link_layer, p.lid, p.active_mtu, p.gid_table_len
            )?;
            for g in &p.gids {
                write!(f, "\n    gid[{}] {}", g.index, g.gid)?;
                if let Some(k) = &g.kind {
                    write!(f, " ({k})")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_reports_what_was_asked_and_what_exists() {
        let list = DeviceList { list: None, len: 0 };
        let err = list.find(Some("mlx5_1")).unwrap_err();
        assert!(matches!(
            &err,
            Error::NoDevice { requested: Some(n), available } if n == "mlx5_1" && available.is_empty()
        ));
        let text = err.to_string();
        assert!(text.contains("\"mlx5_1\""), "{text}");
        assert!(text.contains("no RDMA device is present"), "{text}");
        assert!(matches!(
            list.find(None),
            Err(Error::NoDevice {
                requested: None,
                ..
            })
        ));
        assert!(list.device(0).is_null());
        assert_eq!(list.name(0), "");
    }

    #[test]
    fn display_shapes() {
        assert_eq!(LinkLayer::from_raw(2).to_string(), "Ethernet");
        assert_eq!(LinkLayer::from_raw(1), LinkLayer::InfiniBand);
        assert_eq!(LinkLayer::from_raw(9), LinkLayer::Other(9));
        let dev = DeviceInfo {
            name: "rxe0".into(),
            node_guid: "0001:0002:0003:0004".into(),
            firmware: String::new(),
            ports: vec![PortInfo {
                port: 1,
                state: "PORT_ACTIVE".into(),
                active: true,
                link_layer: LinkLayer::Ethernet,
                lid: 0,
                active_mtu: 1024,
                gid_table_len: 16,
                gids: vec![GidEntry {
                    index: 1,
                    gid: "::ffff:10.0.0.1".parse().unwrap(),
                    kind: Some("RoCE v2".into()),
                }],
            }],
            error: None,
        };
        let text = dev.to_string();
        assert!(text.contains("port 1: PORT_ACTIVE link Ethernet"), "{text}");
        assert!(text.contains("gid[1] ::ffff:10.0.0.1 (RoCE v2)"), "{text}");
    }
}
