//! Byte counts as people write them (`512 MB`, `4K`).

/// Parses a byte count with an optional K, M, G or T suffix (powers of 1024), also
/// written as element limits are (`512 MB`, `1GiB`, `4096 B`): the one size parser
/// of the server, the `memory_server` command line and the wheel.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    // A unit written out: `MB`, `MiB`, `B` (all powers of 1024, as the limits mean).
    let t = match t.strip_suffix(['B', 'b']) {
        Some(rest) => rest.strip_suffix('i').unwrap_or(rest).trim_end(),
        None => t,
    };
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        Some((i, 'T' | 't')) => (&t[..i], 40),
        _ => (t, 0),
    };
    let digits = digits.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{s:?} is not a number with an optional K/M/G/T suffix"
        ));
    }
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is too large"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("3K"), Ok(3 << 10));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("K").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").is_err());
        assert_eq!(parse_bytes("512 MB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("4096 B"), Ok(4096));
        assert_eq!(parse_bytes(" 64 kb "), Ok(64 << 10));
        for bad in ["MB", "B", "1.5G", "1 2M", "1XB", "iB"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
