//! The Prometheus families of the IO latency histograms, encoded from a loaded program's maps
//! at each scrape: `dbcage_io_latency_seconds` (histogram; labels tenant,
//! device (`MAJ:MIN`), name, op) and,
//! where the kernel lets the submission hook load, `dbcage_io_throttle_wait_seconds_total`.

use std::collections::BTreeMap;
use std::path::Path;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::command::dev_name;
use super::{prom_buckets, Hist, Stages, TenantKey};

/// One histogram as `prometheus_client` encodes it.
struct ConstHistogram<'a>(&'a Hist);

impl EncodeMetric for ConstHistogram<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        let h = self.0;
        let count: u64 = h.slots.iter().sum();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            h.sum_ns as f64 / 1e9,
            count,
            &prom_buckets(h),
            None,
        )
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The histograms of one scrape, with the labels both formats give them: tenant, device and
/// name as the other dbcage_io_* families label them (so that queries join), and op.
pub struct Histograms<'a> {
    rows: Vec<([(&'static str, String); 4], &'a Stages)>,
    throttle_measured: bool,
}

impl<'a> Histograms<'a> {
    pub fn new(
        sys: &Path,
        by: &'a BTreeMap<TenantKey, Stages>,
        throttle_measured: bool,
    ) -> Histograms<'a> {
        let names: BTreeMap<_, String> = by.keys().map(|k| (k.dev, dev_name(sys, k.dev))).collect();
        let rows = by
            .iter()
            .map(|(k, s)| {
                let labels = [
                    ("tenant", k.tenant.clone()),
                    ("device", k.dev.to_string()),
                    ("name", names[&k.dev].clone()),
                    ("op", k.op.as_str().to_string()),
                ];
                (labels, s)
            })
            .collect();
        Histograms {
            rows,
            throttle_measured,
        }
    }
}

const LATENCY: &str = "dbcage_io_latency";
const LATENCY_HELP: &str = "Time from submission to completion of each tenant's IO requests (bios), by device and operation, from the kernel (eBPF)";
const WAIT: &str = "dbcage_io_throttle_wait";
const WAIT_HELP: &str = "Time the tenant's IO requests waited in the throttle (blk-throttle) before the block layer queued them";

/// Encodes the families (OpenMetrics) for every (tenant, device, op) that has completed IO.
pub fn encode(enc: &mut DescriptorEncoder, h: &Histograms) -> std::fmt::Result {
    if h.rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(
        LATENCY,
        LATENCY_HELP,
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for (l, s) in &h.rows {
        ConstHistogram(&s.total).encode(m.encode_family(l)?)?;
    }
    if h.throttle_measured {
        let mut m =
            enc.encode_descriptor(WAIT, WAIT_HELP, Some(&Unit::Seconds), MetricType::Counter)?;
        for (l, s) in &h.rows {
            ConstCounter::new(s.throttled.sum_ns as f64 / 1e9).encode(m.encode_family(l)?)?;
        }
    }
    Ok(())
}

/// The same families in the Prometheus text format 0.0.4: `_bucket` lines with cumulative
/// counts and `le`, then `_sum` and `_count`.
pub fn encode_text004(out: &mut String, h: &Histograms) -> std::fmt::Result {
    use std::fmt::Write;
    if h.rows.is_empty() {
        return Ok(());
    }
    let labels = |l: &[(&'static str, String); 4]| -> String {
        l.iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect::<Vec<_>>()
            .join(",")
    };
    writeln!(out, "# HELP {LATENCY}_seconds {LATENCY_HELP}")?;
    writeln!(out, "# TYPE {LATENCY}_seconds histogram")?;
    for (l, s) in &h.rows {
        let l = labels(l);
        let mut cumulative = 0;
        for (upper, n) in prom_buckets(&s.total) {
            cumulative += n;
            let le = if upper == f64::MAX {
                "+Inf".to_string()
            } else {
                upper.to_string()
            };
            writeln!(
                out,
                "{LATENCY}_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
            )?;
        }
        writeln!(
            out,
            "{LATENCY}_seconds_sum{{{l}}} {}",
            s.total.sum_ns as f64 / 1e9
        )?;
        writeln!(out, "{LATENCY}_seconds_count{{{l}}} {cumulative}")?;
    }
    if h.throttle_measured {
        writeln!(out, "# HELP {WAIT}_seconds_total {WAIT_HELP}")?;
        writeln!(out, "# TYPE {WAIT}_seconds_total counter")?;
        for (l, s) in &h.rows {
            writeln!(
                out,
                "{WAIT}_seconds_total{{{}}} {}",
                labels(l),
                s.throttled.sum_ns as f64 / 1e9
            )?;
        }
    }
    Ok(())
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
