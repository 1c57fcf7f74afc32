//! [`Handoff`]: what one process hands the next — a frame's metadata and who wrote it.
//!
//! The metadata carries the frame's own seal (`scad_remote_frame::seal`): opening a
//! handoff checks that memory still holds the frame (the seal and every chunk's head)
//! and freeing one zeroes the seal first, so a handoff whose frame was freed, or whose
//! memory was reused or overwritten, fails with [`RemoteError::Stale`] instead of
//! being read.

use scad_remote_frame::{Error as FrameError, FrameEnv, FrameMeta, RemoteFrame};
use serde::{Deserialize, Serialize};

use super::cluster::Cluster;
use super::error::{FrameContext, RemoteError};

/// Version of the handoff JSON (2: the seal lives in the frame's metadata).
pub const HANDOFF_VERSION: u32 = 2;

/// A frame handed from one stage (or the table loader) to the next, as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    /// [`HANDOFF_VERSION`].
    pub version: u32,
    /// Who wrote the frame: `q1/dates_in_year`, `table/date_dim`.
    pub producer: String,
    /// The frame's metadata, its seal included.
    pub frame: FrameMeta,
}

impl Handoff {
    /// The handoff of `frame`, written by `producer` (no I/O: the frame was sealed
    /// when it was written).
    pub fn new(producer: &str, frame: &RemoteFrame) -> Self {
        Handoff {
            version: HANDOFF_VERSION,
            producer: producer.to_string(),
            frame: frame.meta().clone(),
        }
    }

    /// The handoff as JSON.
    ///
    /// # Errors
    /// Only if serde fails, which plain data does not.
    pub fn to_json(&self) -> Result<String, RemoteError> {
        serde_json::to_string(self).map_err(|source| RemoteError::BadJson {
            context: format!("serializing the handoff of {}", self.producer),
            source,
        })
    }

    /// Parses a handoff (`context` names it in errors, e.g. the stage input).
    ///
    /// # Errors
    /// [`RemoteError::BadJson`]; [`RemoteError::Frame`] for inconsistent metadata
    /// (or metadata written before frames were sealed); [`RemoteError::Invalid`] for
    /// another handoff version.
    pub fn from_json(json: &str, context: &str) -> Result<Self, RemoteError> {
        let h: Handoff = serde_json::from_str(json).map_err(|source| RemoteError::BadJson {
            context: context.to_string(),
            source,
        })?;
        if h.version != HANDOFF_VERSION {
            return Err(RemoteError::Invalid(format!(
                "{context}: handoff version {} (this build reads {HANDOFF_VERSION})",
                h.version
            )));
        }
        h.frame
            .validate()
            .frame_ctx(|| format!("{context}: frame of {}", h.producer))?;
        Ok(h)
    }

    /// Opens the frame in `env`, after checking that memory still holds it.
    ///
    /// # Errors
    /// [`RemoteError::Stale`] when it does not; [`RemoteError::Frame`] for unknown
    /// elements and transport errors.
    pub fn open(&self, env: &FrameEnv, context: &str) -> Result<RemoteFrame, RemoteError> {
        RemoteFrame::open(env, self.frame.clone()).map_err(|e| self.error(context, e))
    }

    /// Opens the frame (checking it as [`Handoff::open`] does) and frees it: its seal
    /// is zeroed first, then its and its seal's memory go back.
    ///
    /// # Errors
    /// As [`Handoff::open`]; allocator errors.
    pub fn free(&self, cluster: &Cluster) -> Result<(), RemoteError> {
        let context = format!("freeing the frame of {}", self.producer);
        self.open(cluster.env(), &context)?
            .free()
            .map_err(|e| self.error(&context, e))
    }

    /// A frame error in `context`: [`RemoteError::Stale`] for a stale frame.
    fn error(&self, context: &str, e: FrameError) -> RemoteError {
        match e {
            FrameError::Stale { frame, reason } => RemoteError::Stale {
                context: context.to_string(),
                producer: self.producer.clone(),
                reason: format!("frame {frame}: {reason}"),
            },
            source => RemoteError::Frame {
                context: format!("{context}: the frame of {}", self.producer),
                source,
            },
        }
    }
}
