//! Prometheus exposition from the daemon: per-tenant and per-device counters read from the
//! kernel at each scrape (a `prometheus-client` Collector over `status::collect`), configured
//! limits as gauges, and the daemon's own health. Served over HTTP by `tiny_http` on its own
//! thread: it is small, blocking, and keeps the daemon's event loop free of any HTTP work
//! (the crate is in maintenance mode; the server does one thing and needs nothing newer).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::cgroup::Layout;
use crate::hostfs::HostFs;
use crate::policy::Policy;
use crate::status;

/// The daemon's own counters, updated by the event loop, read by scrapes.
#[derive(Debug, Default)]
pub struct Health {
    pub events: AtomicU64,
    pub events_lost: AtomicU64,
    pub rescans: AtomicU64,
    pub moves: AtomicU64,
    pub reload_failures: AtomicU64,
    /// Unix time of the last full scan, in milliseconds.
    pub last_scan_ms: AtomicU64,
}

/// What a scrape reads: the current policy and layout (replaced on reload) and the health.
#[derive(Debug)]
pub struct Shared {
    pub fs: HostFs,
    pub view: RwLock<(Policy, Layout)>,
    pub health: Health,
    /// The IO latency program, when the daemon could load it (`crate::iolat`).
    pub iolat: Option<crate::iolat::loader::IoLatency>,
}

#[derive(Debug)]
struct TenantCollector(Arc<Shared>);

/// Labels borrow from the sample being encoded: a scrape of 50 tenants x 8 devices has some
/// 2,800 series, and owned label strings would be four allocations each.
type Labels<'a> = Vec<(&'static str, &'a str)>;

enum Kind {
    Counter,
    Gauge,
}

fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    kind: Kind,
    rows: &[(Labels, f64)],
) -> std::fmt::Result {
    if rows.is_empty() {
        return Ok(());
    }
    let t = match kind {
        Kind::Counter => MetricType::Counter,
        Kind::Gauge => MetricType::Gauge,
    };
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), t)?;
    for (labels, v) in rows {
        let f = m.encode_family(labels)?;
        match kind {
            Kind::Counter => ConstCounter::new(*v).encode(f)?,
            Kind::Gauge => ConstGauge::new(*v).encode(f)?,
        }
    }
    Ok(())
}

impl Collector for TenantCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let view = self.0.view.read().unwrap_or_else(|e| e.into_inner());
        let (policy, layout) = &*view;
        let sample = status::collect(&self.0.fs, layout, policy, &[], None);
        drop(view);
        fn tenant(t: &status::TenantStatus) -> Labels<'_> {
            vec![("tenant", t.name.as_str())]
        }
        fn dev<'a>(
            t: &'a status::TenantStatus,
            d: &'a status::DeviceStatus,
            dir: &'static str,
        ) -> Labels<'a> {
            vec![
                ("tenant", t.name.as_str()),
                ("device", d.device.as_str()),
                ("name", d.name.as_str()),
                ("direction", dir),
            ]
        }
        let mut bytes = Vec::new();
        let mut ios = Vec::new();
        let mut bps_limit = Vec::new();
        let mut iops_limit = Vec::new();
        let mut io_share = Vec::new();
        let mut procs = Vec::new();
        let mut cpu = Vec::new();
        let mut throttled = Vec::new();
        let mut quota = Vec::new();
        let mut mem = Vec::new();
        let mut mem_limit = Vec::new();
        let mut ooms = Vec::new();
        let mut numa_local = Vec::new();
        let (mut lag_bytes, mut lag_seconds, mut behind, mut raised) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for t in &sample.tenants {
            procs.push((tenant(t), t.processes as f64));
            for d in &t.devices {
                bytes.push((dev(t, d, "read"), d.usage.read_bytes as f64));
                bytes.push((dev(t, d, "write"), d.usage.write_bytes as f64));
                ios.push((dev(t, d, "read"), d.usage.read_ios as f64));
                ios.push((dev(t, d, "write"), d.usage.write_ios as f64));
                for (dir, v) in [("read", d.read_bps_limit), ("write", d.write_bps_limit)] {
                    if let Some(v) = v {
                        bps_limit.push((dev(t, d, dir), v as f64));
                    }
                }
                for (dir, v) in [("read", d.read_iops_limit), ("write", d.write_iops_limit)] {
                    if let Some(v) = v {
                        iops_limit.push((dev(t, d, dir), v as f64));
                    }
                }
                for (key, v) in d.balance.iter().flatten() {
                    let k = crate::balance::KEYS
                        .iter()
                        .find(|x| **x == key.as_str())
                        .copied()
                        .unwrap_or("other");
                    io_share.push((dev(t, d, k), v.share));
                }
            }
            if let Some(s) = t.cpu.usage_seconds {
                cpu.push((tenant(t), s));
            }
            if let Some(s) = t.cpu.throttled_seconds {
                throttled.push((tenant(t), s));
            }
            if let Some(q) = t.cpu_quota_cores {
                quota.push((tenant(t), q));
            }
            if let Some(b) = t.memory.current_bytes {
                mem.push((tenant(t), b as f64));
            }
            if let Some(b) = t.memory_limit_bytes {
                mem_limit.push((tenant(t), b as f64));
            }
            if let Some(k) = t.memory.oom_kills {
                ooms.push((tenant(t), k as f64));
            }
            if let Some(r) = t.numa_local_share {
                numa_local.push((tenant(t), r));
            }
            if let Some(g) = &t.replication {
                lag_bytes.push((tenant(t), g.lag_bytes as f64));
                lag_seconds.push((tenant(t), g.lag_seconds));
                behind.push((tenant(t), f64::from(u8::from(g.behind))));
                let up = g.raised_write_bps.is_some() || g.raised_write_iops.is_some();
                raised.push((tenant(t), f64::from(u8::from(up))));
            }
        }
        use Kind::*;
        family(
            &mut enc,
            "dbcage_io",
            "Bytes read and written by a tenant on a device",
            Some(Unit::Bytes),
            Counter,
            &bytes,
        )?;
        family(
            &mut enc,
            "dbcage_io_operations",
            "IOs completed by a tenant on a device",
            None,
            Counter,
            &ios,
        )?;
        family(
            &mut enc,
            "dbcage_io_limit_bytes_per_second",
            "Configured bytes/s limit of a tenant on a device",
            None,
            Gauge,
            &bps_limit,
        )?;
        family(
            &mut enc,
            "dbcage_io_limit_iops",
            "Configured IOPS limit of a tenant on a device",
            None,
            Gauge,
            &iops_limit,
        )?;
        family(
            &mut enc,
            "dbcage_io_share_ratio",
            "Share of the tenant's instance total given to a device under io.split = demand (direction: read_bps, write_bps, read_iops, write_iops)",
            None,
            Gauge,
            &io_share,
        )?;
        family(
            &mut enc,
            "dbcage_processes",
            "Processes in the tenant's groups",
            None,
            Gauge,
            &procs,
        )?;
        family(
            &mut enc,
            "dbcage_cpu_usage",
            "CPU time used by a tenant",
            Some(Unit::Seconds),
            Counter,
            &cpu,
        )?;
        family(
            &mut enc,
            "dbcage_cpu_throttled",
            "Time a tenant was throttled by its cpu quota",
            Some(Unit::Seconds),
            Counter,
            &throttled,
        )?;
        family(
            &mut enc,
            "dbcage_cpu_quota_cores",
            "Configured cpu quota of a tenant, in cores",
            None,
            Gauge,
            &quota,
        )?;
        family(
            &mut enc,
            "dbcage_memory_usage",
            "Memory in use by a tenant",
            Some(Unit::Bytes),
            Gauge,
            &mem,
        )?;
        family(
            &mut enc,
            "dbcage_memory_limit",
            "Configured memory.max of a tenant",
            Some(Unit::Bytes),
            Gauge,
            &mem_limit,
        )?;
        family(
            &mut enc,
            "dbcage_memory_numa_local_ratio",
            "Share of a NUMA-pinned tenant's processes' resident pages on its own nodes (numa_maps)",
            None,
            Gauge,
            &numa_local,
        )?;
        family(
            &mut enc,
            "dbcage_memory_oom_kills",
            "Processes of a tenant killed by the OOM killer",
            None,
            Counter,
            &ooms,
        )?;
        family(
            &mut enc,
            "dbcage_replication_lag",
            "Replication lag the guard last measured for a tenant (a standby: behind its primary; a primary: its furthest standby)",
            Some(Unit::Bytes),
            Gauge,
            &lag_bytes,
        )?;
        family(
            &mut enc,
            "dbcage_replication_lag",
            "Replication lag in time the guard last measured for a tenant",
            Some(Unit::Seconds),
            Gauge,
            &lag_seconds,
        )?;
        family(
            &mut enc,
            "dbcage_replication_behind",
            "1 while the tenant's lag has been past its guard's threshold",
            None,
            Gauge,
            &behind,
        )?;
        family(
            &mut enc,
            "dbcage_replication_raised",
            "1 while the guard holds the tenant's write limits raised",
            None,
            Gauge,
            &raised,
        )?;

        let h = &self.0.health;
        let none: Labels = Vec::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        family(
            &mut enc,
            "dbcage_events",
            "Process events handled by the daemon",
            None,
            Counter,
            &[(none.clone(), get(&h.events))],
        )?;
        family(
            &mut enc,
            "dbcage_events_lost",
            "Times process events were lost (socket overrun); each caused a rescan",
            None,
            Counter,
            &[(none.clone(), get(&h.events_lost))],
        )?;
        family(
            &mut enc,
            "dbcage_rescans",
            "Full rescans",
            None,
            Counter,
            &[(none.clone(), get(&h.rescans))],
        )?;
        family(
            &mut enc,
            "dbcage_moves",
            "Processes moved into tenant groups",
            None,
            Counter,
            &[(none.clone(), get(&h.moves))],
        )?;
        family(
            &mut enc,
            "dbcage_reload_failures",
            "Reloads refused because the new policy was invalid",
            None,
            Counter,
            &[(none.clone(), get(&h.reload_failures))],
        )?;
        family(
            &mut enc,
            "dbcage_last_scan_timestamp",
            "Unix time of the last full scan",
            Some(Unit::Seconds),
            Gauge,
            &[(none, get(&h.last_scan_ms) / 1000.0)],
        )?;
        if let Some(prog) = &self.0.iolat {
            let view = self.0.view.read().unwrap_or_else(|e| e.into_inner());
            let (policy, layout) = &*view;
            let names: Vec<String> = policy.tenants.iter().map(|t| t.name.clone()).collect();
            let owners = crate::iolat::command::owners(layout, &names);
            drop(view);
            let by = prog.read().by_tenant(&owners);
            crate::iolat::metrics::encode(
                &mut enc,
                &self.0.fs.path("/sys"),
                &by,
                prog.no_throttle_split().is_none(),
            )?;
        }
        Ok(())
    }
}

/// The exposition text for the current state (also used by tests and the scrape benchmark).
pub fn render(shared: &Arc<Shared>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(TenantCollector(shared.clone())));
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
        tracing::warn!("encoding metrics failed: {e}");
    }
    out
}

/// Serves `/metrics` on `addr` from a background thread.
pub fn serve(addr: std::net::SocketAddr, shared: Arc<Shared>) -> anyhow::Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow::anyhow!("metrics: cannot listen on {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let content_type = tiny_http::Header::from_bytes(
                &b"Content-Type"[..],
                &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
            )
            .expect("static header");
            for req in server.incoming_requests() {
                let response = if req.url() == "/metrics" {
                    tiny_http::Response::from_string(render(&shared))
                        .with_header(content_type.clone())
                } else {
                    tiny_http::Response::from_string("dbcage: metrics are at /metrics\n")
                        .with_status_code(404)
                };
                if let Err(e) = req.respond(response) {
                    tracing::debug!("metrics: responding failed: {e}");
                }
            }
        })?;
    Ok(())
}
