//! The host's RDMA devices as [`list_devices`] describes them: it opens each device
//! (a [`Context`]) to read its ports and GIDs, so it sits above both `device` and
//! `context`, which do not import each other.

use std::net::Ipv6Addr;

use super::context::Context;
use super::device::{DeviceInfo, DeviceList, GidEntry, PortInfo};
use crate::error::Result;

/// Lists the RDMA devices of this host with their ports, port states, link layers and
/// GIDs — the end-port information a client needs to pick `device`, `port` and
/// `gid_index`.
///
/// A host with no RDMA device (or no RDMA support in its kernel) gives an empty list.
/// A device that is present but cannot be opened is listed with its `error` set.
///
/// # Example
/// ```
/// for dev in scad_core::rdma::list_devices()? {
///     println!("{dev}");
/// }
/// # Ok::<(), scad_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::Rdma`] only when libibverbs itself fails (out of memory).
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let list = DeviceList::get()?;
    Ok((0..list.len()).map(|i| describe(&list, i)).collect())
}

fn describe(list: &DeviceList, index: usize) -> DeviceInfo {
    let mut info = DeviceInfo {
        name: list.name(index),
        node_guid: String::new(),
        firmware: String::new(),
        ports: Vec::new(),
        error: None,
    };
    let ctx = match Context::open(list, index) {
        Ok(c) => c,
        Err(e) => {
            info.error = Some(e.to_string());
            return info;
        }
    };
    let caps = ctx.caps();
    info.node_guid = format_guid(caps.node_guid);
    info.firmware.clone_from(&caps.firmware);
    for port in 1..=caps.ports {
        match ctx.query_port(port) {
            Ok(attr) => {
                let gids = (0..attr.gid_table_len.min(u32::from(u16::MAX)))
                    .filter_map(|i| {
                        let i = i as u16;
                        let gid = ctx.query_gid(port, i).ok()?;
                        (gid != [0; 16]).then(|| GidEntry {
                            index: i,
                            gid: Ipv6Addr::from(gid),
                            kind: gid_kind(&info.name, port, i),
                        })
                    })
                    .collect();
                info.ports.push(PortInfo {
                    port,
                    state: attr.state_name,
                    active: attr.active,
                    link_layer: attr.link_layer,
                    lid: attr.lid,
                    active_mtu: attr.active_mtu_bytes,
                    gid_table_len: attr.gid_table_len,
                    gids,
                });
            }
            Err(e) => {
                info.error = Some(e.to_string());
            }
        }
    }
    info
}

/// The node GUID (big-endian on the wire, as libibverbs returns it) as `xxxx:xxxx:xxxx:xxxx`.
fn format_guid(be: u64) -> String {
    let v = u64::from_be(be);
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (v >> 48) & 0xffff,
        (v >> 32) & 0xffff,
        (v >> 16) & 0xffff,
        v & 0xffff
    )
}

/// The GID type from sysfs (no verbs call reports it in libibverbs' stable ABI).
fn gid_kind(device: &str, port: u8, index: u16) -> Option<String> {
    let path = format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_works_with_or_without_devices() {
        let devices = list_devices().expect("listing never fails for lack of devices");
        if !std::path::Path::new("/sys/class/infiniband").exists() {
            assert!(devices.is_empty(), "no sysfs class, yet {devices:?}");
        }
        for d in &devices {
            assert!(!d.name.is_empty());
            assert!(!d.to_string().is_empty());
        }
    }

    #[test]
    fn guids_print_in_groups_of_four() {
        assert_eq!(
            format_guid(0x0102_0304_0506_0708u64.to_be()),
            "0102:0304:0506:0708"
        );
    }
}
