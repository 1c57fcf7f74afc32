//! Budgets as the command lines give them, and bytes and seconds as reports print them.

use scad_remote_frame::Budget;

use crate::error::TpcdsError;

/// Parses a budget: bytes as every size is parsed (`64M`, `1G`, `512 MB`; see
/// `scad_core::server::parse_bytes`), or a percentage of `largest` (`25%`).
///
/// # Errors
/// [`TpcdsError::Invalid`] for anything else or zero.
pub fn parse_budget(text: &str, largest: u64) -> Result<u64, TpcdsError> {
    let t = text.trim();
    let bad = || {
        TpcdsError::Invalid(format!(
            "budget {text:?}: expected bytes (e.g. 64M) or a percentage (e.g. 25%)"
        ))
    };
    let value = if let Some(p) = t.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad())?;
        if p.is_nan() || p <= 0.0 {
            return Err(bad());
        }
        (largest as f64 * p / 100.0) as u64
    } else {
        scad_core::server::parse_bytes(t).map_err(|_| bad())?
    };
    if value == 0 {
        return Err(bad());
    }
    Ok(value)
}

/// Human-readable bytes, as [`scad_core::fmt::bytes`] prints them.
pub fn fmt_bytes(b: u64) -> String {
    scad_core::fmt::bytes(b)
}

/// A budget as reports print it: its bytes, or `unlimited`.
pub fn fmt_budget(b: Budget) -> String {
    b.limit().map_or_else(|| "unlimited".into(), fmt_bytes)
}

/// Seconds as a short string.
pub fn fmt_secs(d: f64) -> String {
    if d < 1.0 {
        format!("{:.1} ms", d * 1e3)
    } else {
        format!("{d:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_as_bytes_or_percentages() {
        assert_eq!(parse_budget("25%", 1000).unwrap(), 250);
        assert_eq!(parse_budget("64M", 0).unwrap(), 64 << 20);
        assert_eq!(parse_budget("1G", 0).unwrap(), 1 << 30);
        assert_eq!(parse_budget("4096", 0).unwrap(), 4096);
        for bad in ["", "x", "-5%", "0", "0%", "12Q", "1%"] {
            let largest = if bad == "1%" { 10 } else { 1000 };
            let err = parse_budget(bad, largest).unwrap_err();
            assert!(err.to_string().contains("budget"), "{bad}: {err}");
        }
    }

    #[test]
    fn sizes_and_times_print_in_their_unit() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 20), "3.0 MiB");
        assert_eq!(fmt_budget(Budget::Unlimited), "unlimited");
        assert_eq!(fmt_budget(Budget::bytes(3 << 20).unwrap()), "3.0 MiB");
        assert_eq!(fmt_secs(0.0123), "12.3 ms");
        assert_eq!(fmt_secs(2.5), "2.50 s");
    }
}
