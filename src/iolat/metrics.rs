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

/// Encodes the families for every (tenant, device, op) that has completed IO.
pub fn encode(
    enc: &mut DescriptorEncoder,
    sys: &Path,
    by: &BTreeMap<TenantKey, Stages>,
    throttle_measured: bool,
) -> std::fmt::Result {
    if by.is_empty() {
        return Ok(());
    }
    let names: BTreeMap<_, String> = by.keys().map(|k| (k.dev, dev_name(sys, k.dev))).collect();
    // device and name as the other dbcage_io_* families label them, so that queries join.
    let labels = |k: &TenantKey| -> [(&'static str, String); 4] {
        [
            ("tenant", k.tenant.clone()),
            ("device", k.dev.to_string()),
            ("name", names[&k.dev].clone()),
            ("op", k.op.as_str().to_string()),
        ]
    };
    let mut m = enc.encode_descriptor(
        "dbcage_io_latency",
        "Time from submission to completion of each tenant's IO requests (bios), by device and operation, from the kernel (eBPF)",
        Some(&Unit::Seconds),
        MetricType::Histogram,
    )?;
    for (k, s) in by {
        let l = labels(k);
        ConstHistogram(&s.total).encode(m.encode_family(&l)?)?;
    }
    if throttle_measured {
        let mut m = enc.encode_descriptor(
            "dbcage_io_throttle_wait",
            "Time the tenant's IO requests waited in the throttle (blk-throttle) before the block layer queued them",
            Some(&Unit::Seconds),
            MetricType::Counter,
        )?;
        for (k, s) in by {
            let l = labels(k);
            ConstCounter::new(s.throttled.sum_ns as f64 / 1e9).encode(m.encode_family(&l)?)?;
        }
    }
    Ok(())
}
