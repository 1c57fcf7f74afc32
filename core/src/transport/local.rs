//! `rdma_local`: a memory element inside this process.

use std::sync::Arc;

use super::{Counters, ReadOp, Transport, TransportStats, WriteOp};
use crate::error::Result;
use crate::memory::MemoryRegion;

/// A transport to a [`MemoryRegion`] in this process. Clones of the region's `Arc` may
/// back several transports (and a memory server), which then see the same bytes.
#[derive(Debug)]
pub struct LocalTransport {
    region: Arc<MemoryRegion>,
    label: Option<String>,
    counters: Counters,
}

impl LocalTransport {
    /// A transport to a fresh zeroed region of `size` bytes.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if the region cannot be allocated.
    pub fn new(size: u64) -> Result<Self> {
        Ok(Self::with_region(Arc::new(MemoryRegion::new(size)?)))
    }

    /// A transport to an existing region.
    pub fn with_region(region: Arc<MemoryRegion>) -> Self {
        LocalTransport {
            region,
            label: None,
            counters: Counters::default(),
        }
    }

    /// Sets what [`Transport::describe`] says (for transports built on this one).
    #[must_use]
    pub fn with_label(mut self, label: String) -> Self {
        self.label = Some(label);
        self
    }

    /// The region behind this transport.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.region
    }
}

impl Transport for LocalTransport {
    fn describe(&self) -> String {
        self.label
            .clone()
            .unwrap_or_else(|| format!("local({} B)", self.region.size()))
    }

    fn remote_size(&self) -> Result<u64> {
        Ok(self.region.size())
    }

    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        self.region.read(addr, dst)?;
        self.counters.record_read(dst.len() as u64);
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        self.region.write(addr, src)?;
        self.counters.record_write(src.len() as u64);
        Ok(())
    }

    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> Result<()> {
        for op in ops.iter() {
            self.region.check("read", op.addr, op.dst.len() as u64)?;
        }
        let mut bytes = 0;
        for op in ops.iter_mut() {
            self.region.read(op.addr, op.dst)?;
            bytes += op.dst.len() as u64;
        }
        self.counters.record_read(bytes);
        Ok(())
    }

    fn write_vectored(&self, ops: &[WriteOp<'_>]) -> Result<()> {
        for op in ops {
            self.region.check("write", op.addr, op.src.len() as u64)?;
        }
        let mut bytes = 0;
        for op in ops {
            self.region.write(op.addr, op.src)?;
            bytes += op.src.len() as u64;
        }
        self.counters.record_write(bytes);
        Ok(())
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }
}
