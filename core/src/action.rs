//! `Action`: the named transports of one element.
//!
//! A compute element reaches each memory element it co-runs with through a transport
//! named after it. The runtime adds transports from durls, possibly before the memory
//! element's address is known, and completes them later with
//! [`Action::config_transport`]. A program may take an [`Endpoint`] at any time; calls
//! on it wait until the transport is configured, or fail after the action's timeout.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use scad_core::Action;
//!
//! let action = Arc::new(Action::new("demo"));
//! action.add_transport("mem;rdma_local;")?;          // size not known yet
//! let mem = action.endpoint("mem")?;
//! let waiter = std::thread::spawn(move || {
//!     mem.reg(64)?;
//!     mem.buffer()?.write_at(0, b"hello")?;
//!     mem.write(5, 100, 0)                             // waits for the config below
//! });
//! action.config_transport("mem", "size,4096;")?;     // bare pairs, or a full durl
//! waiter.join().unwrap()?;
//! # Ok::<(), scad_core::Error>(())
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::durl::{Durl, TransportConfig};
use crate::error::{Error, Result};
use crate::memory::RegisteredBuffer;
use crate::transport::{self, ReadOp, Transport, TransportStats, WriteOp};

/// How far a transport has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportState {
    /// Added, but keys are missing.
    Pending,
    /// Configured and usable.
    Ready,
    /// Dropped by [`Action::terminate`] or [`Action::release`].
    Terminated,
}

impl TransportState {
    /// The integer the original `add_transport` / `config_transport` returned.
    pub fn code(self) -> i32 {
        match self {
            TransportState::Pending => 0,
            TransportState::Ready => 1,
            TransportState::Terminated => -1,
        }
    }
}

/// What a configured slot holds.
#[derive(Debug, Clone)]
enum Opened {
    Client(Arc<dyn Transport>),
    Server(TransportConfig),
}

#[derive(Debug)]
struct SlotState {
    durl: Durl,
    opened: Option<Opened>,
    terminated: bool,
}

#[derive(Debug)]
struct Slot {
    name: String,
    state: Mutex<SlotState>,
    ready: Condvar,
}

impl Slot {
    fn state(&self) -> TransportState {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.terminated {
            TransportState::Terminated
        } else if s.opened.is_some() {
            TransportState::Ready
        } else {
            TransportState::Pending
        }
    }

    fn wait(&self, timeout: Duration) -> Result<Opened> {
        let deadline = Instant::now() + timeout;
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if s.terminated {
                return Err(Error::Terminated {
                    name: self.name.clone(),
                });
            }
            if let Some(o) = &s.opened {
                return Ok(o.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "waiting for transport {:?} to be configured (still missing {})",
                        self.name,
                        s.durl.missing_keys().join(", ")
                    ),
                    timeout,
                });
            }
            s = self
                .ready
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The per-element registry of named transports.
#[derive(Debug)]
pub struct Action {
    id: String,
    timeout: Duration,
    slots: Mutex<BTreeMap<String, Arc<Slot>>>,
}

impl Action {
    /// Default time an operation waits for its transport to be configured.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// An empty action with the default configuration timeout.
    pub fn new(id: impl Into<String>) -> Self {
        Self::with_timeout(id, Self::DEFAULT_TIMEOUT)
    }

    /// An empty action whose operations wait at most `timeout` for configuration.
    pub fn with_timeout(id: impl Into<String>, timeout: Duration) -> Self {
        Action {
            id: id.into(),
            timeout,
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    /// The action's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Names of the transports, in order.
    pub fn names(&self) -> Vec<String> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Names of the client transports, in order: the memory elements this element
    /// reaches (server transports, the serving side of a memory element, are left
    /// out). Each may still be waiting for its configuration. This is the list a
    /// registry of memory elements is filled from (`scad_remote_array::MemoryElements`
    /// takes an action's client transports by these names).
    pub fn client_names(&self) -> Vec<String> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(_, slot)| {
                !slot
                    .state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .durl
                    .kind
                    .is_server()
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn slot(&self, name: &str) -> Result<Arc<Slot>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownTransport {
                name: name.to_owned(),
                hint: if slots.is_empty() {
                    " (this action has no transports)".to_owned()
                } else {
                    format!(
                        " (known: {})",
                        slots.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                },
            })
    }

    fn open_if_complete(state: &mut SlotState) -> Result<()> {
        if state.opened.is_some() || !state.durl.is_complete() {
            return Ok(());
        }
        let config = state.durl.resolve()?;
        state.opened = Some(if state.durl.kind.is_server() {
            Opened::Server(config)
        } else {
            Opened::Client(transport::open(&state.durl.name, &config)?)
        });
        Ok(())
    }

    /// Adds a transport from a durl, complete or not.
    ///
    /// # Errors
    /// [`Error::Durl`] for a malformed durl, [`Error::InvalidArgument`] if the name is
    /// taken, and errors opening a complete transport.
    pub fn add_transport(&self, durl: &str) -> Result<TransportState> {
        let durl: Durl = durl.parse()?;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.contains_key(&durl.name) {
            return Err(Error::InvalidArgument(format!(
                "transport {:?} already exists in action {:?}",
                durl.name, self.id
            )));
        }
        let mut state = SlotState {
            durl,
            opened: None,
            terminated: false,
        };
        Self::open_if_complete(&mut state)?;
        let name = state.durl.name.clone();
        debug!(action = %self.id, transport = %name, "transport added");
        let slot = Arc::new(Slot {
            name: name.clone(),
            state: Mutex::new(state),
            ready: Condvar::new(),
        });
        let st = slot.state();
        slots.insert(name, slot);
        Ok(st)
    }

    /// Completes transport `name` and wakes threads waiting on it once it is ready.
    ///
    /// `durl` is what the original runtime passes: bare `KEY,VALUE;` pairs with no
    /// name and no implementation (`"url,tcp://localhost:2333;"`, `"size,65536;"`), or
    /// a full durl for this transport (see [`Durl::configure`]).
    ///
    /// # Errors
    /// [`Error::UnknownTransport`], [`Error::Durl`] quoting a malformed part,
    /// [`Error::InvalidArgument`] if a full durl is for another transport or kind, and
    /// errors opening the transport.
    pub fn config_transport(&self, name: &str, durl: &str) -> Result<TransportState> {
        let slot = self.slot(name)?;
        {
            let mut s = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
            if s.terminated {
                return Err(Error::Terminated {
                    name: name.to_owned(),
                });
            }
            let mut merged = s.durl.clone();
            merged.configure(durl)?;
            if s.opened.is_some() && merged != s.durl {
                return Err(Error::InvalidArgument(format!(
                    "transport {name:?} is already configured; release it before reconfiguring"
                )));
            }
            s.durl = merged;
            Self::open_if_complete(&mut s)?;
        }
        slot.ready.notify_all();
        Ok(slot.state())
    }

    /// State of transport `name`.
    ///
    /// # Errors
    /// [`Error::UnknownTransport`].
    pub fn state(&self, name: &str) -> Result<TransportState> {
        Ok(self.slot(name)?.state())
    }

    /// A client handle to transport `name` (configured or not).
    ///
    /// # Errors
    /// [`Error::UnknownTransport`]; [`Error::InvalidArgument`] for a server transport.
    pub fn endpoint(&self, name: &str) -> Result<Endpoint> {
        let slot = self.slot(name)?;
        let kind = slot
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .durl
            .kind;
        if kind.is_server() {
            return Err(Error::InvalidArgument(format!(
                "transport {name:?} is a {kind} (serving side); ask for it as a server"
            )));
        }
        Ok(Endpoint {
            slot,
            timeout: self.timeout,
            buffer: Mutex::new(None),
        })
    }

    /// The configuration of server transport `name`, waiting until it is complete.
    ///
    /// # Errors
    /// [`Error::UnknownTransport`], [`Error::Timeout`], [`Error::InvalidArgument`] for a
    /// client transport.
    pub fn server_config(&self, name: &str) -> Result<TransportConfig> {
        let slot = self.slot(name)?;
        match slot.wait(self.timeout)? {
            Opened::Server(config) => Ok(config),
            Opened::Client(_) => Err(Error::InvalidArgument(format!(
                "transport {name:?} is a client transport, not a server"
            ))),
        }
    }

    /// Drops transport `name`; threads waiting on it fail with [`Error::Terminated`].
    ///
    /// # Errors
    /// [`Error::UnknownTransport`].
    pub fn release(&self, name: &str) -> Result<()> {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        let slot = slot.ok_or_else(|| Error::UnknownTransport {
            name: name.to_owned(),
            hint: String::new(),
        })?;
        terminate_slot(&slot);
        Ok(())
    }

    /// Drops every transport.
    pub fn terminate(&self) {
        let slots = std::mem::take(&mut *self.slots.lock().unwrap_or_else(PoisonError::into_inner));
        for slot in slots.values() {
            terminate_slot(slot);
        }
    }
}

fn terminate_slot(slot: &Slot) {
    {
        let mut s = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.terminated = true;
        s.opened = None;
    }
    slot.ready.notify_all();
}

/// A client handle on a named transport, with the original libd's registered buffer.
///
/// Every call waits until the transport is configured (or the action's timeout
/// passes). `reg` allocates the local buffer that `read` and `write` move data
/// through; [`Endpoint::reg_shared`] makes two endpoints use one buffer, so data read
/// from one memory element can be written to another without a copy.
#[derive(Debug)]
pub struct Endpoint {
    slot: Arc<Slot>,
    timeout: Duration,
    buffer: Mutex<Option<Arc<RegisteredBuffer>>>,
}

impl Endpoint {
    /// The transport's name.
    pub fn name(&self) -> &str {
        &self.slot.name
    }

    /// The transport, waiting for it to be configured.
    ///
    /// # Errors
    /// [`Error::Timeout`] or [`Error::Terminated`].
    pub fn transport(&self) -> Result<Arc<dyn Transport>> {
        match self.slot.wait(self.timeout)? {
            Opened::Client(t) => Ok(t),
            Opened::Server(_) => Err(Error::InvalidArgument(format!(
                "transport {:?} is a server",
                self.slot.name
            ))),
        }
    }

    /// Registers a fresh zeroed local buffer of `size` bytes, replacing any earlier one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0, [`Error::Alloc`].
    pub fn reg(&self, size: usize) -> Result<Arc<RegisteredBuffer>> {
        let buf = Arc::new(RegisteredBuffer::new(size)?);
        *self.buffer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&buf));
        Ok(buf)
    }

    /// Uses the buffer registered on `other`.
    ///
    /// # Errors
    /// [`Error::NotRegistered`] if `other` has no buffer.
    pub fn reg_shared(&self, other: &Endpoint) -> Result<Arc<RegisteredBuffer>> {
        let buf = other.buffer()?;
        *self.buffer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&buf));
        Ok(buf)
    }

    /// Uses an existing buffer (a page pool's, say).
    pub fn reg_buffer(&self, buf: Arc<RegisteredBuffer>) {
        *self.buffer.lock().unwrap_or_else(PoisonError::into_inner) = Some(buf);
    }

    /// The registered buffer.
    ///
    /// # Errors
    /// [`Error::NotRegistered`].
    pub fn buffer(&self) -> Result<Arc<RegisteredBuffer>> {
        self.buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Error::NotRegistered {
                name: self.slot.name.clone(),
            })
    }

    /// Copies `size` bytes from remote address `addr` into the buffer at `offset`.
    ///
    /// # Errors
    /// [`Error::NotRegistered`], [`Error::BufferRange`], [`Error::OutOfRange`],
    /// [`Error::Timeout`], transport errors.
    pub fn read(&self, size: usize, addr: u64, offset: usize) -> Result<()> {
        let buf = self.buffer()?;
        self.transport()?.read_to_buffer(&buf, offset, size, addr)
    }

    /// Copies `size` bytes of the buffer at `offset` to remote address `addr`.
    ///
    /// # Errors
    /// As [`Endpoint::read`].
    pub fn write(&self, size: usize, addr: u64, offset: usize) -> Result<()> {
        let buf = self.buffer()?;
        self.transport()?
            .write_from_buffer(&buf, offset, size, addr)
    }

    /// Reads remote bytes straight into `dst` (no registered buffer needed).
    ///
    /// # Errors
    /// As [`Transport::read`], plus waiting errors.
    pub fn read_into(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.transport()?.read(addr, dst)
    }

    /// Writes `src` to remote address `addr` (no registered buffer needed).
    ///
    /// # Errors
    /// As [`Transport::write`], plus waiting errors.
    pub fn write_from(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.transport()?.write(addr, src)
    }

    /// Vectored read; see [`Transport::read_vectored`].
    ///
    /// # Errors
    /// As [`Transport::read_vectored`], plus waiting errors.
    pub fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        self.transport()?.read_vectored(ops)
    }

    /// Vectored write; see [`Transport::write_vectored`].
    ///
    /// # Errors
    /// As [`Transport::write_vectored`], plus waiting errors.
    pub fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        self.transport()?.write_vectored(ops)
    }

    /// The transport's counters (zero while unconfigured).
    pub fn stats(&self) -> TransportStats {
        match self
            .slot
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .opened
            .as_ref()
        {
            Some(Opened::Client(t)) => t.stats(),
            _ => TransportStats::default(),
        }
    }
}
