//! Reliable-connected queue pairs (`ibv_qp`), set up as a typestate:
//! [`PreparedQp::new`] (created and moved to INIT) → [`PreparedQp::handshake`] with the
//! peer's [`QpInfo`] (RTR, then RTS) → [`ConnectedQp`], the only state that can post work.

use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as ffi;

use super::cq::Cq;
use super::exchange::QpInfo;
use super::pd::Pd;
use crate::error::{Error, Result};

/// Which side of one-sided RDMA a queue pair is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Posts READs and WRITEs (the client).
    Initiator,
    /// Serves them from its registered memory (the server).
    Responder,
}

/// How to build a queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpConfig {
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    /// Send-queue depth: the longest chain of work requests posted at once.
    pub(crate) depth: u32,
    pub(crate) role: Role,
}

/// The QP handle: destroyed before its CQ and PD, whose `Arc`s it holds.
struct QpHandle {
    ptr: NonNull<ffi::ibv_qp>,
    cq: Arc<Cq>,
    pd: Arc<Pd>,
}

// SAFETY: a QP may move between threads; posting to it is thread-safe in libibverbs,
// and we post from one owner at a time anyway (`ConnectedQp::execute` takes &mut).
unsafe impl Send for QpHandle {}
// SAFETY: shared references only read immutable fields (the QP number).
unsafe impl Sync for QpHandle {}

impl QpHandle {
    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        step: &str,
    ) -> Result<()> {
        let mask = libc::c_int::try_from(mask.0).unwrap_or(libc::c_int::MAX);
        // SAFETY: the QP is alive and `attr` is a fully initialised ibv_qp_attr.
        let rc = unsafe { ffi::ibv_modify_qp(self.ptr.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(self.pd.context().errno(
                "connect queue pair",
                &format!("moving the queue pair to {step} failed"),
                rc,
            ));
        }
        Ok(())
    }

    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is alive; qp_num is set at creation and never changes.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        // SAFETY: created in `PreparedQp::new`, destroyed once. After this returns the
        // device does no more work for the QP; the CQ and PD outlive it (we hold Arcs).
        let rc = unsafe { ffi::ibv_destroy_qp(self.ptr.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.pd.context().name(), rc, "ibv_destroy_qp failed");
        }
    }
}

/// An all-zero `ibv_qp_attr`, the starting point of every transition.
fn zeroed_attr() -> ffi::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is a plain C struct of integers and unions of integer arrays;
    // all-zero is a valid value of every field.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// A queue pair created and in INIT, not yet connected: it can tell its [`QpInfo`] but
/// cannot post work.
pub(crate) struct PreparedQp {
    qp: QpHandle,
    local: QpInfo,
    config: QpConfig,
    max_msg: u32,
}

impl PreparedQp {
    /// Creates a completion queue and an RC queue pair on `pd`'s device, and moves the
    /// pair to INIT on `config.port`.
    ///
    /// # Errors
    /// [`Error::Rdma`] naming the device and port: the port is not active, the GID index
    /// is empty or out of the table, or a verbs call failed.
    pub(crate) fn new(pd: &Arc<Pd>, config: QpConfig) -> Result<Self> {
        let ctx = pd.context();
        let port = ctx.query_port(config.port)?;
        if !port.active {
            return Err(Error::Rdma {
                op: "open port",
                reason: format!(
                    "port {} of device {:?} is {}, not active (check the cable or the \
                     subnet manager; list_devices shows every port)",
                    config.port,
                    ctx.name(),
                    port.state_name
                ),
                source: None,
            });
        }
        if u32::from(config.gid_index) >= port.gid_table_len.max(1) {
            return Err(Error::Rdma {
                op: "open port",
                reason: format!(
                    "gid_index {} is outside the {} entries of port {} of device {:?}",
                    config.gid_index,
                    port.gid_table_len,
                    config.port,
                    ctx.name()
                ),
                source: None,
            });
        }
        let gid = if port.gid_table_len > 0 {
            ctx.query_gid(config.port, u16::from(config.gid_index))?
        } else {
            [0; 16]
        };
        if gid == [0; 16] && port.link_layer == super::LinkLayer::Ethernet {
            return Err(Error::Rdma {
                op: "open port",
                reason: format!(
                    "GID {} of port {} of device {:?} is empty; RoCE needs a GID (pick a \
                     gid_index that list_devices shows)",
                    config.gid_index,
                    config.port,
                    ctx.name()
                ),
                source: None,
            });
        }
        let caps = ctx.caps();
        let depth = config.depth.clamp(1, caps.max_qp_wr.max(1));
        let cq = Cq::new(ctx, depth + 1)?;
        // SAFETY: ibv_qp_init_attr is plain C data; all-zero (null pointers, zero
        // counts) is valid and we set what matters below.
        let mut init: ffi::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.cap = ffi::ibv_qp_cap {
            max_send_wr: depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: the PD and CQ are alive (and outlive the QP through the Arcs in
        // QpHandle); `init` is fully initialised.
        let raw = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut init) };
        let ptr = NonNull::new(raw).ok_or_else(|| Error::Rdma {
            op: "create queue pair",
            reason: format!(
                "ibv_create_qp (depth {depth}) failed on device {:?}",
                ctx.name()
            ),
            source: Some(io::Error::last_os_error()),
        })?;
        let qp = QpHandle {
            ptr,
            cq,
            pd: Arc::clone(pd),
        };
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = config.port;
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if config.role == Role::Responder {
            access = access
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        attr.qp_access_flags = access.0;
        qp.modify(
            &mut attr,
            ffi::ibv_qp_attr_mask::IBV_QP_STATE
                | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
                | ffi::ibv_qp_attr_mask::IBV_QP_PORT
                | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let rd_atomic = match config.role {
            Role::Initiator => caps.max_init_rd_atom,
            Role::Responder => caps.max_rd_atom,
        }
        .clamp(1, 16);
        let local = QpInfo {
            qpn: qp.qp_num(),
            psn: random_psn(),
            lid: port.lid,
            gid,
            mtu: port.active_mtu,
            rd_atomic,
            rkey: 0,
            addr: 0,
            size: 0,
        };
        Ok(PreparedQp {
            qp,
            local,
            config: QpConfig { depth, ..config },
            max_msg: port.max_msg_size,
        })
    }

    /// What the peer needs to know to connect to this pair.
    pub(crate) fn info(&self) -> QpInfo {
        self.local
    }

    /// Connects to the peer described by `remote`: RTR (receive from it), then RTS.
    ///
    /// # Errors
    /// [`Error::Rdma`] if the device refuses a transition (a peer on an unreachable
    /// subnet, a GID of the wrong type).
    pub(crate) fn handshake(self, remote: &QpInfo) -> Result<ConnectedQp> {
        let PreparedQp {
            qp,
            local,
            config,
            max_msg,
        } = self;
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = u32::from(local.mtu.min(remote.mtu).max(1));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = match config.role {
            Role::Responder => local.rd_atomic,
            Role::Initiator => 1,
        };
        attr.min_rnr_timer = 12;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = config.port;
        // Route globally (with a GRH) on RoCE (no LIDs there) and across IB subnets;
        // within one InfiniBand subnet the LID is enough.
        let other_subnet = remote.gid[..8] != local.gid[..8];
        if remote.gid != [0; 16] && (remote.lid == 0 || other_subnet) {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = config.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        qp.modify(
            &mut attr,
            ffi::ibv_qp_attr_mask::IBV_QP_STATE
                | ffi::ibv_qp_attr_mask::IBV_QP_AV
                | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
                | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
                | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
                | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.sq_psn = local.psn;
        attr.max_rd_atomic = match config.role {
            Role::Initiator => local.rd_atomic.min(remote.rd_atomic).max(1),
            Role::Responder => 1,
        };
        qp.modify(
            &mut attr,
            ffi::ibv_qp_attr_mask::IBV_QP_STATE
                | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
                | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
                | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
                | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
                | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        Ok(ConnectedQp {
            qp,
            local,
            remote: *remote,
            depth: config.depth as usize,
            max_msg: (max_msg as usize).clamp(1, 1 << 30),
            next_id: 1,
            broken: false,
        })
    }
}

/// RDMA READ or WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    /// Remote → local.
    Read,
    /// Local → remote.
    Write,
}

impl Opcode {
    fn name(self) -> &'static str {
        match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
        }
    }
}

/// One work request: `len` bytes between local `local` (in the MR of `lkey`) and
/// remote virtual address `remote` (in the peer's MR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkRequest {
    pub(crate) local: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
    pub(crate) remote: u64,
}

/// A connected queue pair: the only state that can post work.
pub(crate) struct ConnectedQp {
    qp: QpHandle,
    local: QpInfo,
    remote: QpInfo,
    depth: usize,
    max_msg: usize,
    next_id: u64,
    broken: bool,
}

impl std::fmt::Debug for ConnectedQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectedQp")
            .field("qpn", &self.local.qpn)
            .field("remote_qpn", &self.remote.qpn)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl ConnectedQp {
    /// Our side's information.
    pub(crate) fn local(&self) -> &QpInfo {
        &self.local
    }

    /// The peer's information (its memory's address, key and size for a client).
    pub(crate) fn remote(&self) -> &QpInfo {
        &self.remote
    }

    /// Largest length of one work request.
    pub(crate) fn max_msg(&self) -> usize {
        self.max_msg
    }

    /// True after an error: the pair is in the error state and must be dropped.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Posts `requests` as chains of at most the queue depth, only the last of each chain
    /// signalled, and waits for each chain to complete before posting the next.
    ///
    /// Returns only when the device is done with every request's local memory: on
    /// success all completed; on any error (a completion error, a timeout, a failed
    /// post) the pair is moved to the error state and drained, and is then broken.
    ///
    /// # Safety
    /// Until this call returns, for every request, `local..local + len` must be valid
    /// memory inside the registered region of `lkey`, which must stay registered; for
    /// [`Opcode::Read`] nothing else may read or write it (the device writes it), and
    /// for [`Opcode::Write`] nothing may write it.
    ///
    /// # Errors
    /// [`Error::RdmaCompletion`] naming the completion status, [`Error::Timeout`],
    /// [`Error::Rdma`] if posting fails or the pair is already broken.
    pub(crate) unsafe fn execute(
        &mut self,
        op: Opcode,
        requests: &[WorkRequest],
        timeout: Duration,
    ) -> Result<()> {
        if self.broken {
            return Err(Error::Rdma {
                op: "post work request",
                reason: "the queue pair is in the error state after an earlier failure".into(),
                source: None,
            });
        }
        if let Some(r) = requests.iter().find(|r| r.len as usize > self.max_msg) {
            return Err(Error::InvalidArgument(format!(
                "an RDMA work request of {} bytes exceeds the port's maximum of {}",
                r.len, self.max_msg
            )));
        }
        for chain in requests.chunks(self.depth.max(1)) {
            // SAFETY: forwarded from the caller's contract.
            unsafe { self.post_chain(op, chain) }?;
            let last = self.next_id - 1;
            self.wait(op, last, chain, timeout)?;
        }
        Ok(())
    }

    /// Posts one chain (its length at most the queue depth), only the last signalled.
    ///
    /// # Safety
    /// As [`ConnectedQp::execute`].
    unsafe fn post_chain(&mut self, op: Opcode, chain: &[WorkRequest]) -> Result<()> {
        let n = chain.len();
        if n == 0 {
            return Ok(());
        }
        let opcode = match op {
            Opcode::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            Opcode::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        let mut sges: Vec<ffi::ibv_sge> = chain
            .iter()
            .map(|r| ffi::ibv_sge {
                addr: r.local,
                length: r.len,
                lkey: r.lkey,
            })
            .collect();
        let first_id = self.next_id;
        let mut wrs: Vec<ffi::ibv_send_wr> = chain
            .iter()
            .enumerate()
            .map(|(i, r)| {
                // SAFETY: ibv_send_wr is plain C data (integers, null pointers, unions of
                // those); all-zero is valid, and we set the fields an RDMA op reads.
                let mut wr: ffi::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
                wr.wr_id = first_id + i as u64;
                wr.num_sge = 1;
                wr.opcode = opcode;
                wr.send_flags = if i + 1 == n {
                    ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
                } else {
                    0
                };
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: r.remote,
                    rkey: self.remote.rkey,
                };
                wr
            })
            .collect();
        let wr_base = wrs.as_mut_ptr();
        let sge_base = sges.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n = len of both vectors, which are not touched through any
            // other path until the post below returns.
            unsafe {
                (*wr_base.add(i)).sg_list = sge_base.add(i);
                if i + 1 < n {
                    (*wr_base.add(i)).next = wr_base.add(i + 1);
                }
            }
        }
        self.next_id += n as u64;
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is connected (RTS); the chain is a valid NULL-terminated list of
        // work requests whose SGEs live in `sges` until this returns (the device copies
        // them at post time); the caller guarantees the local memory they name.
        let rc = unsafe { ffi::ibv_post_send(self.qp.ptr.as_ptr(), wr_base, &mut bad) };
        if rc != 0 {
            // The requests before `bad` were posted: stop them (their flush completions
            // come back even unsignalled) before returning.
            let posted = if bad.is_null() {
                n
            } else {
                (bad as usize).saturating_sub(wr_base as usize)
                    / std::mem::size_of::<ffi::ibv_send_wr>()
            };
            self.fail(posted.checked_sub(1).map(|i| first_id + i as u64));
            return Err(self.qp.pd.context().errno(
                "post work request",
                &format!("ibv_post_send of {n} RDMA {}s failed", op.name()),
                rc,
            ));
        }
        drop((wrs, sges));
        Ok(())
    }

    /// Waits for the signalled completion `last`; on error or timeout stops the pair.
    fn wait(
        &mut self,
        op: Opcode,
        last: u64,
        chain: &[WorkRequest],
        timeout: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            match self.qp.cq.poll() {
                Ok(Some(c)) if c.is_ok() && c.wr_id == last => return Ok(()),
                Ok(Some(c)) if c.is_ok() => {
                    // Only the last request is signalled; a stray success is harmless.
                    tracing::debug!(wr_id = c.wr_id, "unexpected successful completion");
                }
                Ok(Some(c)) => {
                    // Requests after the failed one are flushed with completions of their
                    // own; wait for the last one unless it is the one that failed.
                    self.fail((c.wr_id < last).then_some(last));
                    return Err(Error::RdmaCompletion {
                        op: op.name(),
                        status: c.status_str(),
                        code: c.status,
                        vendor_err: c.vendor_err,
                    });
                }
                Ok(None) => {
                    if spins < 2048 {
                        spins += 1;
                        std::hint::spin_loop();
                    } else if start.elapsed() > timeout {
                        self.fail(Some(last));
                        let bytes: u64 = chain.iter().map(|r| u64::from(r.len)).sum();
                        return Err(Error::Timeout {
                            what: format!(
                                "RDMA {} of {bytes} bytes in {} work requests",
                                op.name(),
                                chain.len()
                            ),
                            timeout,
                        });
                    } else {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    self.fail(Some(last));
                    return Err(e);
                }
            }
        }
    }

    /// Moves the pair to the error state, which flushes every outstanding request, and
    /// drains the completion queue until request `last`, if given, has been flushed
    /// (bounded: the QP is destroyed soon after anyway, which also stops the device).
    fn fail(&mut self, last: Option<u64>) {
        self.broken = true;
        let mut attr = zeroed_attr();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        if let Err(e) = self
            .qp
            .modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE, "ERR")
        {
            tracing::warn!(error = %e, "cannot move a failed queue pair to the error state");
            return;
        }
        let Some(last) = last else { return };
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            match self.qp.cq.poll() {
                Ok(Some(c)) if c.wr_id >= last => return,
                Ok(Some(_)) => {}
                Ok(None) => std::thread::yield_now(),
                Err(_) => return,
            }
        }
        tracing::warn!("a failed queue pair did not flush its work requests within 1 s");
    }
}

/// A random 24-bit initial packet sequence number.
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() as u32) & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    #[test]
    fn psns_fit_24_bits_and_vary() {
        let psns: Vec<u32> = (0..16).map(|_| super::random_psn()).collect();
        assert!(psns.iter().all(|&p| p < 1 << 24));
        assert!(psns.windows(2).any(|w| w[0] != w[1]));
    }
}
