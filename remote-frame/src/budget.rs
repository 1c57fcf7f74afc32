//! [`Budget`]: how much local memory kernels and query operators may hold.

use std::fmt;
use std::num::NonZeroU64;

use crate::error::{Error, Result};

/// A local memory limit: none, or a positive number of bytes.
///
/// Checked once where it is made ([`Budget::bytes`], [`Budget::from_limit`]), so a
/// zero budget is refused there with an error instead of being clamped or tested for
/// later.
///
/// # Example
/// ```
/// use scad_remote_frame::Budget;
///
/// let b = Budget::bytes(64 << 20)?;
/// assert_eq!(b.limit(), Some(64 << 20));
/// assert_eq!(Budget::from_limit(None)?, Budget::Unlimited);
/// assert!(Budget::bytes(0).is_err());
/// # Ok::<(), scad_remote_frame::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Budget {
    /// No limit: operators hold what they need and never spill.
    #[default]
    Unlimited,
    /// At most this many bytes at once.
    Bytes(NonZeroU64),
}

impl Budget {
    /// A budget of `bytes` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0.
    pub fn bytes(bytes: u64) -> Result<Self> {
        NonZeroU64::new(bytes).map(Budget::Bytes).ok_or_else(|| {
            Error::InvalidArgument(
                "a budget must be at least one byte (for no limit, use an unlimited budget)".into(),
            )
        })
    }

    /// A budget of `limit` bytes, or no limit for `None`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `Some(0)`.
    pub fn from_limit(limit: Option<u64>) -> Result<Self> {
        limit.map_or(Ok(Budget::Unlimited), Budget::bytes)
    }

    /// The limit in bytes; `None` when there is none.
    pub fn limit(self) -> Option<u64> {
        match self {
            Budget::Unlimited => None,
            Budget::Bytes(b) => Some(b.get()),
        }
    }

    /// Whether holding `bytes` at once stays within the budget.
    pub fn allows(self, bytes: u64) -> bool {
        self.limit().is_none_or(|limit| bytes <= limit)
    }

    /// Whether there is no limit.
    pub fn is_unlimited(self) -> bool {
        self == Budget::Unlimited
    }
}

impl From<NonZeroU64> for Budget {
    fn from(bytes: NonZeroU64) -> Self {
        Budget::Bytes(bytes)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Unlimited => f.write_str("unlimited"),
            Budget::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_refused_with_a_clear_error() {
        let err = Budget::bytes(0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("at least one byte"), "{err}");
        assert!(Budget::from_limit(Some(0)).is_err());
    }

    #[test]
    fn limits_round_trip() {
        assert_eq!(Budget::from_limit(None).unwrap(), Budget::Unlimited);
        assert_eq!(Budget::default(), Budget::Unlimited);
        let b = Budget::from_limit(Some(4096)).unwrap();
        assert_eq!(b.limit(), Some(4096));
        assert!(!b.is_unlimited());
        assert!(b.allows(4096) && !b.allows(4097));
        assert!(Budget::Unlimited.allows(u64::MAX));
        assert_eq!(Budget::Unlimited.limit(), None);
        assert_eq!(b.to_string(), "4096 bytes");
        assert_eq!(Budget::Unlimited.to_string(), "unlimited");
    }
}
