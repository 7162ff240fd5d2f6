//! Human quantities in the policy: byte sizes (`50MiB`, `1.5GB`, `4096`) and counts (`2000`, `2k`).
//!
//! Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (kB/KB, MB, GB, TB) powers
//! of 1000, as `numfmt` and the kernel's own documentation use them. A trailing `/s` is accepted on
//! rates so that `50MiB/s` reads as written. Results are whole bytes (rounded down).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

const BYTE_SUFFIXES: &[(&str, f64)] = &[
    ("kib", 1024.0),
    ("mib", 1024.0 * 1024.0),
    ("gib", 1024.0 * 1024.0 * 1024.0),
    ("tib", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("k", 1024.0),
    ("m", 1024.0 * 1024.0),
    ("g", 1024.0 * 1024.0 * 1024.0),
    ("t", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("kb", 1e3),
    ("mb", 1e6),
    ("gb", 1e9),
    ("tb", 1e12),
    ("b", 1.0),
    ("", 1.0),
];

const COUNT_SUFFIXES: &[(&str, f64)] = &[("", 1.0), ("k", 1e3), ("m", 1e6)];

fn split_number(text: &str) -> Option<(f64, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (num, rest) = text.split_at(end);
    let num: String = num.chars().filter(|c| *c != '_').collect();
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return None;
    }
    num.parse::<f64>().ok().map(|n| (n, rest.trim()))
}

fn parse_with(
    text: &str,
    suffixes: &[(&str, f64)],
    what: &str,
    examples: &str,
) -> Result<u64, UnitError> {
    let trimmed = text.trim();
    let body = trimmed.strip_suffix("/s").unwrap_or(trimmed).trim();
    let bad = || {
        UnitError(format!(
            "`{text}` is not a valid {what} (examples: {examples})"
        ))
    };
    let (number, suffix) = split_number(body).ok_or_else(bad)?;
    let lower = suffix.to_ascii_lowercase();
    // Case matters only between "KB" style (decimal) and "K"/"KiB" (binary) which we keep
    // distinct by the presence of "i"; the lowercase table covers every spelling.
    let factor = suffixes
        .iter()
        .find(|(s, _)| *s == lower)
        .map(|(_, f)| *f)
        .ok_or_else(bad)?;
    let value = number * factor;
    if !value.is_finite() || value >= u64::MAX as f64 {
        return Err(UnitError(format!("`{text}` is too large for a {what}")));
    }
    Ok(value as u64)
}

/// Parses a byte quantity: `50MiB`, `1.5GB`, `4096`, `8G`.
pub fn parse_bytes(text: &str) -> Result<u64, UnitError> {
    parse_with(text, BYTE_SUFFIXES, "byte size", "4096, 50MiB, 1.5GB, 8GiB")
}

/// Parses a count such as IOPS: `2000`, `2k`, `1.5k`.
pub fn parse_count(text: &str) -> Result<u64, UnitError> {
    parse_with(text, COUNT_SUFFIXES, "count", "2000, 2k, 1.5k")
}

/// `1 tenant`, `2 tenants`, `0 processes`: a count with the noun it counts, in the right number.
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Prints bytes with the largest binary unit that keeps the value readable (`8MiB`, `1.5GiB`).
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 || (value.fract() == 0.0) {
            write!(f, "{}{}", value as u64, UNITS[unit])
        } else {
            write!(f, "{:.2}{}", value, UNITS[unit])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_accept_binary_decimal_and_plain() {
        assert_eq!(parse_bytes("50MiB").unwrap(), 50 * 1024 * 1024);
        assert_eq!(parse_bytes("50MiB/s").unwrap(), 50 * 1024 * 1024);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("2000").unwrap(), 2000);
        assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("1_000kB").unwrap(), 1_000_000);
    }

    #[test]
    fn bytes_reject_garbage() {
        for bad in ["", "MiB", "5 XB", "-5MiB", "1.2.3G", ".5G", "5.G", "1e3"] {
            assert!(parse_bytes(bad).is_err(), "{bad} should be rejected");
        }
        let msg = parse_bytes("5XB").unwrap_err().to_string();
        assert!(msg.contains("5XB") && msg.contains("50MiB"), "{msg}");
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("2000").unwrap(), 2000);
        assert_eq!(parse_count("2k").unwrap(), 2000);
        assert_eq!(parse_count("1.5k").unwrap(), 1500);
        assert!(parse_count("2MiB").is_err());
    }

    #[test]
    fn counts_agree_in_number() {
        assert_eq!(count(1, "core", "cores"), "1 core");
        assert_eq!(count(0, "process", "processes"), "0 processes");
        assert_eq!(count(2, "tenant", "tenants"), "2 tenants");
    }

    #[test]
    fn human_bytes() {
        assert_eq!(HumanBytes(8 << 20).to_string(), "8MiB");
        assert_eq!(HumanBytes(1536 << 20).to_string(), "1.50GiB");
        assert_eq!(HumanBytes(100).to_string(), "100B");
    }
}
