//! `rdma_uverbs`: one-sided RDMA through libibverbs (cargo feature `rdma`).
//!
//! - [`list_devices`]: the RDMA devices of this host, their ports, port states, link
//!   layers and GIDs. Empty on a host without RDMA.
//! - [`RdmaServer`] (`rdma_uverbs_server`): registers a [`crate::MemoryRegion`] with
//!   remote access and hands each client a queue pair to it.
//! - [`RdmaTransport`] (`rdma_uverbs`): a [`crate::Transport`] that reads and writes the
//!   server's memory with RDMA READ and WRITE; the server's CPU takes no part.
//! - [`exchange`]: the connection-information message both sides send over TCP.
//!
//! # Example
//! ```no_run
//! use scad_core::rdma::{RdmaOptions, RdmaServer, RdmaServerConfig, RdmaTransport};
//! use scad_core::Transport;
//!
//! let server = RdmaServer::start("0.0.0.0:2333", 1 << 30, RdmaServerConfig::default())?;
//! let client = RdmaTransport::connect("127.0.0.1:2333", RdmaOptions::default())?;
//! client.write(4096, b"remote memory")?;
//! # drop(server);
//! # Ok::<(), scad_core::Error>(())
//! ```
//!
//! # Connection set-up
//! A client creates a completion queue and an RC queue pair, connects over TCP to the
//! durl's `url`, and sends its queue-pair information with the shared-secret token. The
//! server checks the token in constant time before doing anything else, creates a queue
//! pair for the client, connects it, and answers with its own information and the
//! address, `rkey` and size of the served memory. The client then connects its pair.
//! The TCP connection stays open: closing it (dropping the transport's connection)
//! makes the server destroy its pair.
//!
//! # Resources
//! Each verbs resource is a struct holding its raw pointer and an `Arc` of its parent,
//! released in `Drop`, so teardown follows ownership: queue pairs, then completion
//! queues and memory regions, then the protection domain, then the device context.
//! One protection domain per device is shared by all transports and servers of the
//! process. Queue-pair set-up is a typestate: `PreparedQp` (INIT) →
//! `handshake(remote info)` → `ConnectedQp`, the only state that can post work.
//!
//! # Safety story
//! All `unsafe` code of the RDMA support is in this module. The device writes local
//! memory only through work requests that a call posts and waits for before it returns,
//! while it holds a guard over that memory (a registered buffer's range guard, or the
//! connection's private bounce buffer). A request that fails or times out moves its
//! queue pair to the error state, which flushes everything outstanding, and the pair is
//! destroyed before the call returns. Out-of-range remote accesses are refused locally
//! before posting; the server's memory region enforces the bounds again in hardware.
//!
//! # Running the hardware tests
//! `cargo test -p scad-core --features rdma --test rdma_hw` runs against the first
//! device, or the one named by `SCAD_RDMA_DEVICE` (with `SCAD_RDMA_PORT` and
//! `SCAD_RDMA_GID_INDEX`). Without a device they print why they were skipped. Soft-RoCE
//! works too: `rdma link add rxe0 type rxe netdev eth0`.

mod context;
mod cq;
mod device;
pub mod exchange;
mod inventory;
mod mr;
mod pd;
mod qp;
mod server;
mod session;
mod transport;

pub use device::{DeviceInfo, GidEntry, LinkLayer, PortInfo};
pub use inventory::list_devices;
pub use server::{RdmaServer, RdmaServerConfig, RdmaServerStats, RdmaShutdownHandle};
pub use transport::{RdmaOptions, RdmaTransport};
