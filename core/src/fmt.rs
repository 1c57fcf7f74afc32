//! Byte counts as reports and logs print them, in one place so every crate agrees.
//!
//! - [`bytes`]: an amount, rounded, in the largest binary unit it reaches
//!   (`512 B`, `1.5 MiB`, `8.08 GiB`): pool statistics, budgets, data moved.
//! - [`bytes_exact`]: a size label that never rounds (`4 KiB`, `64 MiB`, `1500 B`):
//!   message and page sizes in benchmark tables and chart axes.
//!
//! Sizes are parsed by [`crate::server::parse_bytes`].
//!
//! # Example
//! ```
//! assert_eq!(scad_core::fmt::bytes(3 << 20), "3.0 MiB");
//! assert_eq!(scad_core::fmt::bytes_exact(4096), "4 KiB");
//! ```

/// Formats an amount of bytes with a binary unit: plain bytes below 1 KiB, one decimal
/// in KiB and MiB, two in GiB and TiB (`512 B`, `1.5 MiB`, `8.08 GiB`).
pub fn bytes(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;
    if n >= TIB {
        format!("{:.2} TiB", n as f64 / TIB as f64)
    } else if n >= GIB {
        format!("{:.2} GiB", n as f64 / GIB as f64)
    } else if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else if n >= KIB {
        format!("{:.1} KiB", n as f64 / KIB as f64)
    } else {
        format!("{n} B")
    }
}

/// Formats a size as an exact label: whole MiB or KiB when it is a multiple of one,
/// plain bytes otherwise (`4 KiB`, `64 MiB`, `1500 B`).
pub fn bytes_exact(n: u64) -> String {
    const KIB: u64 = 1024;
    if n >= KIB * KIB && n % (KIB * KIB) == 0 {
        format!("{} MiB", n / (KIB * KIB))
    } else if n >= KIB && n % KIB == 0 {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_round_in_the_largest_unit() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(bytes(8_680_000_000), "8.08 GiB");
        assert_eq!(bytes(3 << 40), "3.00 TiB");
    }

    #[test]
    fn labels_never_round() {
        assert_eq!(bytes_exact(64), "64 B");
        assert_eq!(bytes_exact(4096), "4 KiB");
        assert_eq!(bytes_exact(64 << 20), "64 MiB");
        assert_eq!(bytes_exact(1500), "1500 B");
        assert_eq!(bytes_exact((1 << 20) + 1024), "1025 KiB");
    }
}
