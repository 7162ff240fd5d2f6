//! What a probe prints: per-step figures, the knee, and the response-time histogram in the
//! layout of seed 000 (RANGE {min ≤ e < max}, DURATION, %, CALLS, MEAN, MIN, MAX, TOTAL).

use std::fmt::Write as _;

use serde::Serialize;

/// Bucket bounds in microseconds; the last bucket is open (1000 ms to +∞). From 5 ms up they are
/// seed 000's; below, where fast storage puts nearly every IO (99.4% in 0-5 ms on an NVMe or a
/// cached loop device), 5 ms is split into 100us, 250us, 500us, 1ms and 2ms.
pub const BUCKET_US: [u64; 14] = [
    0, 100, 250, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 20_000, 25_000, 50_000, 100_000,
    1_000_000,
];
const NBUCKETS: usize = BUCKET_US.len();

/// Exact per-bucket statistics (not rounded by the HDR histogram): calls, total, min and max.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bucket {
    pub calls: u64,
    pub sum_ns: u128,
    pub min_ns: u64,
    pub max_ns: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buckets(pub [Bucket; NBUCKETS]);

impl Buckets {
    pub fn index(ns: u64) -> usize {
        let bound = |i: usize| BUCKET_US[i] * 1_000;
        (1..NBUCKETS)
            .take_while(|&i| ns >= bound(i))
            .last()
            .unwrap_or(0)
    }

    pub fn record(&mut self, ns: u64) {
        let b = &mut self.0[Self::index(ns)];
        if b.calls == 0 || ns < b.min_ns {
            b.min_ns = ns;
        }
        b.max_ns = b.max_ns.max(ns);
        b.calls += 1;
        b.sum_ns += ns as u128;
    }

    pub fn merge(&mut self, other: &Buckets) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            if b.calls == 0 {
                continue;
            }
            if a.calls == 0 || b.min_ns < a.min_ns {
                a.min_ns = b.min_ns;
            }
            a.max_ns = a.max_ns.max(b.max_ns);
            a.calls += b.calls;
            a.sum_ns += b.sum_ns;
        }
    }

    /// The rows for JSON.
    pub fn rows(&self) -> Vec<BucketRow> {
        let total: u128 = self.0.iter().map(|b| b.sum_ns).sum();
        self.0
            .iter()
            .enumerate()
            .map(|(i, b)| BucketRow {
                min_ms: BUCKET_US[i] as f64 / 1000.0,
                max_ms: BUCKET_US.get(i + 1).map(|us| *us as f64 / 1000.0),
                calls: b.calls,
                duration_s: b.sum_ns as f64 / 1e9,
                percent: if total > 0 {
                    b.sum_ns as f64 * 100.0 / total as f64
                } else {
                    0.0
                },
                mean_s: (b.calls > 0).then(|| b.sum_ns as f64 / b.calls as f64 / 1e9),
                min_s: (b.calls > 0).then(|| b.min_ns as f64 / 1e9),
                max_s: (b.calls > 0).then(|| b.max_ns as f64 / 1e9),
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BucketRow {
    pub min_ms: f64,
    /// `null` for the open last bucket.
    pub max_ms: Option<f64>,
    pub calls: u64,
    /// Sum of the calls' latencies, in seconds.
    pub duration_s: f64,
    /// Share of the total duration.
    pub percent: f64,
    pub mean_s: Option<f64>,
    pub min_s: Option<f64>,
    pub max_s: Option<f64>,
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    let first = match s.len() % 3 {
        0 => 3,
        r => r,
    };
    out.push_str(&s[..first.min(s.len())]);
    let mut i = first;
    while i < s.len() {
        out.push(',');
        out.push_str(&s[i..i + 3]);
        i += 3;
    }
    out
}

/// A bound as `250us`, `5ms`, `1,000ms`.
fn bound_label(us: u64) -> String {
    if us != 0 && us < 1000 {
        format!("{us}us")
    } else {
        format!("{}ms", thousands(us / 1000))
    }
}

const RULE: &str =
    "---------------------  ------------  ------  ------  ---------  ---------  ---------";

/// The histogram in seed 000's layout, with each column's unit in its header (DURATION is the
/// sum of the IOs' latencies, % its share of the total).
pub fn histogram_table(b: &Buckets) -> String {
    let mut out = String::new();
    let total_ns: u128 = b.0.iter().map(|x| x.sum_ns).sum();
    let calls: u64 = b.0.iter().map(|x| x.calls).sum();
    let secs = |ns: u128| ns as f64 / 1e9;
    let ms = |ns: u128| ns as f64 / 1e6;
    let _ = writeln!(
        out,
        "RANGE {{min ≤ e < max}}  DURATION (s)       %   CALLS  MEAN (ms)   MIN (ms)   MAX (ms)"
    );
    let _ = writeln!(out, "{RULE}");
    for (i, x) in b.0.iter().enumerate() {
        let hi = BUCKET_US
            .get(i + 1)
            .map(|m| bound_label(*m))
            .unwrap_or_else(|| "+∞".into());
        let range = format!("{:>2}. {:>7} {:>8}", i + 1, bound_label(BUCKET_US[i]), hi);
        if x.calls == 0 {
            let _ = writeln!(out, "{range}");
            continue;
        }
        let pct = if total_ns > 0 {
            x.sum_ns as f64 * 100.0 / total_ns as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "{range:<21}  {:>12.6}  {:>6}  {:>6}  {:>9.3}  {:>9.3}  {:>9.3}",
            secs(x.sum_ns),
            format!("{pct:.1}%"),
            thousands(x.calls),
            ms(x.sum_ns) / x.calls as f64,
            ms(x.min_ns as u128),
            ms(x.max_ns as u128),
        );
    }
    let _ = writeln!(out, "{RULE}");
    let min = b.0.iter().filter(|x| x.calls > 0).map(|x| x.min_ns).min();
    let max = b.0.iter().filter(|x| x.calls > 0).map(|x| x.max_ns).max();
    let label = format!("TOTAL ({})", b.0.len());
    if calls == 0 {
        let _ = writeln!(out, "{label}");
    } else {
        let _ = writeln!(
            out,
            "{label:<21}  {:>12.6}  {:>6}  {:>6}  {:>9.3}  {:>9.3}  {:>9.3}",
            secs(total_ns),
            "100.0%",
            thousands(calls),
            ms(total_ns) / calls as f64,
            ms(min.unwrap_or(0) as u128),
            ms(max.unwrap_or(0) as u128),
        );
    }
    out
}

/// Latency percentiles of one step, in microseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Latency {
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub p99_9: f64,
    pub max: f64,
}

/// One step's result.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub bs: u64,
    pub parallelism: usize,
    pub seconds: f64,
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    pub mib_s: f64,
    pub latency_us: Latency,
    /// Stopped early by Ctrl-C: the figures cover `seconds` only.
    pub interrupted: bool,
    pub histogram: Vec<BucketRow>,
    #[serde(skip)]
    pub buckets: Buckets,
}

/// The usable capacity at one block size: the highest parallelism whose p99 stays under the
/// target, and its throughput.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Knee {
    pub bs: u64,
    /// `None`: even parallelism 1 exceeds the latency target.
    pub parallelism: Option<usize>,
    pub p99_us: Option<f64>,
    pub iops: Option<f64>,
    pub mib_s: Option<f64>,
    /// The step after the knee exceeded the target (false: every step stayed under it, so the
    /// real knee may be at a higher parallelism than was probed).
    pub bounded: bool,
}

/// Index of the knee among steps of one block size sorted by parallelism: the last step before
/// the first one whose p99 reaches the target ("stays under": a later step that dips under the
/// target again does not count). `None` if the first step already reaches it.
pub fn knee_index(p99s: &[f64], target: f64) -> Option<usize> {
    let first_over = p99s.iter().position(|p| *p >= target);
    match first_over {
        Some(0) => None,
        Some(i) => Some(i - 1),
        None if p99s.is_empty() => None,
        None => Some(p99s.len() - 1),
    }
}

/// Knees for every block size, in the order the sizes were probed.
pub fn knees(steps: &[StepResult], target_us: f64) -> Vec<Knee> {
    let mut sizes: Vec<u64> = Vec::new();
    for s in steps {
        if !sizes.contains(&s.bs) {
            sizes.push(s.bs);
        }
    }
    sizes
        .into_iter()
        .map(|bs| {
            let mut these: Vec<&StepResult> = steps.iter().filter(|s| s.bs == bs).collect();
            these.sort_by_key(|s| s.parallelism);
            let p99s: Vec<f64> = these.iter().map(|s| s.latency_us.p99).collect();
            match knee_index(&p99s, target_us) {
                Some(i) => Knee {
                    bs,
                    parallelism: Some(these[i].parallelism),
                    p99_us: Some(these[i].latency_us.p99),
                    iops: Some(these[i].iops),
                    mib_s: Some(these[i].mib_s),
                    bounded: i + 1 < these.len(),
                },
                None => Knee {
                    bs,
                    parallelism: None,
                    p99_us: None,
                    iops: None,
                    mib_s: None,
                    bounded: true,
                },
            }
        })
        .collect()
}

/// A latency in microseconds as `850us`, `4.2ms`, `1.20s`.
pub fn lat(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.0}us")
    } else if us < 1_000_000.0 {
        let ms = us / 1000.0;
        if ms < 10.0 {
            format!("{ms:.2}ms")
        } else {
            format!("{ms:.1}ms")
        }
    } else {
        format!("{:.2}s", us / 1e6)
    }
}

/// Block sizes as the user writes them: 4k, 64k, 1m, 1536.
pub fn bs_label(bs: u64) -> String {
    if bs >= 1 << 20 && bs & ((1 << 20) - 1) == 0 {
        format!("{}m", bs >> 20)
    } else if bs >= 1024 && bs & 1023 == 0 {
        format!("{}k", bs >> 10)
    } else {
        bs.to_string()
    }
}

pub fn step_header() -> String {
    format!(
        "{:>5} {:>4} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "bs", "jobs", "IOPS", "MiB/s", "mean", "p50", "p95", "p99", "p99.9", "max"
    )
}

pub fn step_line(s: &StepResult, target_us: f64) -> String {
    let l = &s.latency_us;
    let mut line = format!(
        "{:>5} {:>4} {:>9.0} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        bs_label(s.bs),
        s.parallelism,
        s.iops,
        s.mib_s,
        lat(l.mean),
        lat(l.p50),
        lat(l.p95),
        lat(l.p99),
        lat(l.p99_9),
        lat(l.max)
    );
    if l.p99 >= target_us {
        line.push_str("  p99 over target");
    }
    if s.interrupted {
        line.push_str(&format!("  (interrupted after {:.1}s)", s.seconds));
    }
    line
}

pub fn knee_line(k: &Knee, target_us: f64) -> String {
    match (k.parallelism, k.iops, k.mib_s, k.p99_us) {
        (Some(p), Some(iops), Some(mib), Some(p99)) => format!(
            "knee at bs {}: {p} job{} (p99 {} < {}): usable capacity {iops:.0} IOPS, {mib:.1} MiB/s{}",
            bs_label(k.bs),
            if p == 1 { "" } else { "s" },
            lat(p99),
            lat(target_us),
            if k.bounded {
                ""
            } else {
                " (every step stayed under the target; probe a higher --jobs-max to find the knee)"
            }
        ),
        _ => format!(
            "knee at bs {}: none; even 1 job has p99 at or over {}",
            bs_label(k.bs),
            lat(target_us)
        ),
    }
}
