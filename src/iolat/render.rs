//! Text views of the IO latency histograms: one tenant's histogram in the layout of seed 000
//! (RANGE {min ≤ e < max}, DURATION, %, CALLS, MEAN, TOTAL) and the per-tenant summary lines.

use std::fmt::Write as _;

use super::{slot_high_us, slot_low_us, Hist, SLOTS};
use crate::probe::report::thousands;

/// A slot bound as a person reads it: `512µs`, `1.024ms`, `65.536ms`, `1.049s`.
pub fn us_label(us: u64) -> String {
    if us < 1000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        trim(format!("{:.3}", us as f64 / 1e3)) + "ms"
    } else {
        trim(format!("{:.3}", us as f64 / 1e6)) + "s"
    }
}

fn trim(s: String) -> String {
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A duration in seconds with a unit that keeps three significant digits.
pub fn secs_label(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0}µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

const RULE: &str = "-------------------------  ------------  ------  ---------  ----------";

/// The histogram as seed 000 prints it, one row per log2 slot from the first slot with
/// requests to the last; % is each range's share of the total time, as in the seed.
pub fn histogram_table(h: &Hist) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "RANGE {{min ≤ e < max}}        DURATION       %      CALLS        MEAN"
    );
    let _ = writeln!(out, "{RULE}");
    let used: Vec<usize> = (0..SLOTS).filter(|&s| h.slots[s] > 0).collect();
    let total_ns: u64 = h.slot_ns.iter().sum();
    if let (Some(&first), Some(&last)) = (used.first(), used.last()) {
        for s in first..=last {
            let hi = slot_high_us(s).map_or_else(|| "+∞".to_string(), us_label);
            let range = format!("{:>2}. {:>9} {:>9}", s + 1, us_label(slot_low_us(s)), hi);
            if h.slots[s] == 0 {
                let _ = writeln!(out, "{range}");
                continue;
            }
            let secs = h.slot_ns[s] as f64 / 1e9;
            let pct = if total_ns > 0 {
                h.slot_ns[s] as f64 * 100.0 / total_ns as f64
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "{range:<25}  {secs:>12.6}  {:>6}  {:>9}  {:>10.6}",
                format!("{pct:.1}%"),
                thousands(h.slots[s]),
                secs / h.slots[s] as f64,
            );
        }
    }
    let _ = writeln!(out, "{RULE}");
    let calls: u64 = h.slots.iter().sum();
    let label = format!("TOTAL ({})", used.len());
    if calls == 0 {
        let _ = writeln!(out, "{label}");
    } else {
        let secs = total_ns as f64 / 1e9;
        let _ = writeln!(
            out,
            "{label:<25}  {secs:>12.6}  {:>6}  {:>9}  {:>10.6}",
            "100.0%",
            thousands(calls),
            secs / calls as f64,
        );
    }
    out
}

/// `p50 1.23ms p99 4.56ms` for a histogram, `-` when it is empty.
pub fn percentiles(h: &Hist) -> String {
    match (h.quantile(0.5), h.quantile(0.99)) {
        (Some(p50), Some(p99)) => format!("p50 {} p99 {}", secs_label(p50), secs_label(p99)),
        _ => "-".into(),
    }
}
