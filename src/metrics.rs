//! Prometheus exposition from the daemon: per-tenant and per-device counters read from the
//! kernel at each scrape (a `prometheus-client` Collector over `status::collect`), configured
//! limits as gauges, the policy in force, and the daemon's own health; in the Prometheus text
//! format or OpenMetrics, as the scraper asks. Served by `web` (HTTP, TLS and basic auth).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::cgroup::Layout;
use crate::control::OverrideInfo;
use crate::hostfs::HostFs;
use crate::policy::Policy;
use crate::status;

/// Per-device series are exported for at most this many devices of one tenant (in device-number
/// order); the rest are counted in `dbcage_devices_omitted`. It bounds a tenant's series (see
/// README, "Series per tenant") when a storage glob or an ASM diskgroup resolves to hundreds of
/// disks.
pub const MAX_DEVICES_PER_TENANT: usize = 64;

/// The daemon's own counters, updated by the event loop, read by scrapes.
#[derive(Debug, Default)]
pub struct Health {
    pub events: AtomicU64,
    pub events_lost: AtomicU64,
    pub rescans: AtomicU64,
    pub moves: AtomicU64,
    pub reload_failures: AtomicU64,
    /// Under systemd: unit properties found different from the plan and set again.
    pub systemd_repairs: AtomicU64,
    /// Unix time of the last full scan, in milliseconds.
    pub last_scan_ms: AtomicU64,
    /// 1 while process events arrive, 0 in rescan-only mode.
    pub events_connected: AtomicU64,
    /// Control-file values rewritten by a periodic rescan: the kernel's value differed from the
    /// policy in force (someone wrote it behind the daemon's back, or a device came or went).
    pub corrections: AtomicU64,
    /// Writes and moves that failed.
    pub apply_errors: AtomicU64,
    /// Processes the rescans read from /proc, and kept from the scan before (no event named
    /// them; see `procs::Reuse`).
    pub rescan_procs_read: AtomicU64,
    pub rescan_procs_kept: AtomicU64,
}

/// The policy in force as the metrics show it; replaced by the daemon on start, reload and `set`.
#[derive(Debug, Clone, Default)]
pub struct PolicyState {
    /// The main policy file (and how far its files are trusted): its files on disk are compared
    /// with `hash` at each scrape.
    pub config: Option<crate::policy::PolicyPath>,
    /// `policy_hash` of the files the policy in force was read from.
    pub hash: String,
    /// Runtime (`set`) and schedule overrides in force.
    pub overrides: Vec<OverrideInfo>,
    /// Unix time the policy in force was loaded, in seconds.
    pub loaded_at: f64,
    /// Whether the last reload was accepted (true until one is refused).
    pub last_reload_ok: bool,
}

/// What a scrape reads: the current policy and layout (replaced on reload) and the health.
#[derive(Debug)]
pub struct Shared {
    pub fs: HostFs,
    pub view: RwLock<(Arc<Policy>, Layout)>,
    pub health: Health,
    pub policy: RwLock<PolicyState>,
    /// The IO latency program, once the daemon has loaded it (`crate::iolat`): set after the
    /// daemon is ready (loading it is ~13% of the start at 1,000 tenants), empty when it could not.
    pub iolat: std::sync::OnceLock<crate::iolat::loader::IoLatency>,
    /// Which tenant owns which cgroup of the IO latency program's histograms, as the last scrape
    /// walked it (forgotten on a reload).
    pub owners: Mutex<crate::iolat::KeptOwners>,
    /// The tenants' groups, kept open from one scrape to the next.
    pub kept: crate::hostfs::KeptDirs,
}

impl Shared {
    pub fn new(fs: HostFs, policy: Arc<Policy>, layout: Layout) -> Shared {
        Shared {
            fs,
            view: RwLock::new((policy, layout)),
            health: Health::default(),
            policy: RwLock::new(PolicyState {
                last_reload_ok: true,
                ..PolicyState::default()
            }),
            iolat: std::sync::OnceLock::new(),
            owners: Mutex::default(),
            kept: crate::hostfs::KeptDirs::new(),
        }
    }
}

/// A short, stable digest of policy files (their names and text, in load order): equal on hosts
/// that run the same policy, whatever directory it was read from, so that
/// `count by (hash) (dbcage_policy_info)` shows drift across a fleet.
pub fn policy_hash(sources: &[(PathBuf, String)]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for (path, text) in sources {
        let name = path
            .file_name()
            .map(|n| n.as_encoded_bytes())
            .unwrap_or(b"");
        h.update((name.len() as u64).to_le_bytes());
        h.update(name);
        h.update((text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    let digest = h.finalize();
    digest[..8]
        .iter()
        .fold(String::with_capacity(16), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[derive(Debug)]
struct TenantCollector(Arc<Shared>);

/// Labels borrow from the sample being encoded: a scrape of 50 tenants x 8 devices has some
/// 2,800 series, and owned label strings would be four allocations each.
type Labels<'a> = Vec<(&'static str, &'a str)>;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Counter,
    Gauge,
}

/// One metric family as both formats need it: the base name (without unit or `_total`, which
/// each encoder appends), help, unit and type, and its samples.
struct Family<'f, 'a> {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    kind: Kind,
    rows: &'f [(Labels<'a>, f64)],
}

/// Where families go: prometheus-client's OpenMetrics encoder, or the Prometheus text format.
trait Sink {
    fn family(&mut self, f: Family) -> std::fmt::Result;
    /// The IO latency histograms (`crate::iolat::metrics`), in this sink's format.
    fn io_latency(&mut self, h: &crate::iolat::metrics::Histograms) -> std::fmt::Result;
}

/// OpenMetrics 1.0 through prometheus-client.
struct OpenMetrics<'e, 'd>(&'e mut DescriptorEncoder<'d>);

impl Sink for OpenMetrics<'_, '_> {
    fn io_latency(&mut self, h: &crate::iolat::metrics::Histograms) -> std::fmt::Result {
        crate::iolat::metrics::encode(self.0, h)
    }
    fn family(&mut self, f: Family) -> std::fmt::Result {
        if f.rows.is_empty() {
            return Ok(());
        }
        let t = match f.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
        };
        fn encode(kind: Kind, v: f64, m: MetricEncoder) -> std::fmt::Result {
            match kind {
                Kind::Counter => ConstCounter::new(v).encode(m),
                Kind::Gauge => ConstGauge::new(v).encode(m),
            }
        }
        let mut m = self
            .0
            .encode_descriptor(f.name, f.help, f.unit.as_ref(), t)?;
        if let [(labels, v)] = f.rows {
            if labels.is_empty() {
                // A daemon-wide series: no `{}`.
                return encode(f.kind, *v, m);
            }
        }
        for (labels, v) in f.rows {
            encode(f.kind, *v, m.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// The Prometheus text format 0.0.4 (what `promtool check metrics` and scrapers that do not ask
/// for OpenMetrics read). prometheus-client writes only OpenMetrics, and this format is a few
/// lines: HELP and TYPE under the sample's full name, no UNIT, no EOF.
struct Text004<'w>(&'w mut String);

impl Sink for Text004<'_> {
    fn io_latency(&mut self, h: &crate::iolat::metrics::Histograms) -> std::fmt::Result {
        crate::iolat::metrics::encode_text004(self.0, h)
    }
    fn family(&mut self, f: Family) -> std::fmt::Result {
        if f.rows.is_empty() {
            return Ok(());
        }
        let out = &mut *self.0;
        let unit = f.unit.as_ref().map(Unit::as_str);
        let total = if f.kind == Kind::Counter {
            "_total"
        } else {
            ""
        };
        let name = |out: &mut String| -> std::fmt::Result {
            out.push_str(f.name);
            if let Some(u) = unit {
                out.push('_');
                out.push_str(u);
            }
            out.push_str(total);
            Ok(())
        };
        out.push_str("# HELP ");
        name(out)?;
        out.push(' ');
        for c in f.help.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push_str("\n# TYPE ");
        name(out)?;
        out.push_str(match f.kind {
            Kind::Counter => " counter\n",
            Kind::Gauge => " gauge\n",
        });
        for (labels, v) in f.rows {
            name(out)?;
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, val)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(k);
                    out.push_str("=\"");
                    for c in val.chars() {
                        match c {
                            '\\' => out.push_str("\\\\"),
                            '"' => out.push_str("\\\""),
                            '\n' => out.push_str("\\n"),
                            c => out.push(c),
                        }
                    }
                    out.push('"');
                }
                out.push('}');
            }
            out.push(' ');
            if v.is_nan() {
                out.push_str("NaN");
            } else if v.is_infinite() {
                out.push_str(if *v > 0.0 { "+Inf" } else { "-Inf" });
            } else {
                write!(out, "{v}")?;
            }
            out.push('\n');
        }
        Ok(())
    }
}

/// Reads the kernel and the daemon's state and hands every family to `sink`.
fn emit(shared: &Shared, sink: &mut dyn Sink) -> std::fmt::Result {
    let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
    let (policy, layout) = &*view;
    shared.kept.refresh();
    let sample = status::collect(
        &shared.fs,
        layout,
        policy,
        &[],
        None,
        status::Resident::Skip,
        Some(&shared.kept),
    );
    drop(view);
    shared.kept.sweep();
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
    let mut omitted = Vec::new();
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
    let (mut waiting, mut stalled) = (Vec::new(), Vec::new());
    let (mut protect_step, mut protect_actions) = (Vec::new(), Vec::new());
    for t in &sample.tenants {
        if let Some(p) = &t.pressure {
            for (resource, psi) in [("cpu", p.cpu), ("io", p.io), ("memory", p.memory)] {
                let Some(psi) = psi else { continue };
                let labels = || vec![("tenant", t.name.as_str()), ("resource", resource)];
                waiting.push((labels(), psi.some_total_seconds));
                if let Some(full) = psi.full_total_seconds {
                    stalled.push((labels(), full));
                }
            }
        }
        procs.push((tenant(t), t.processes as f64));
        if t.devices.len() > MAX_DEVICES_PER_TENANT {
            omitted.push((tenant(t), (t.devices.len() - MAX_DEVICES_PER_TENANT) as f64));
        }
        for d in t.devices.iter().take(MAX_DEVICES_PER_TENANT) {
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
        for g in t.protection.iter().chain(&t.cpu_protection) {
            let mut l = tenant(t);
            l.push(("resource", g.resource.name()));
            protect_step.push((l, f64::from(g.step)));
            for (action, n) in [("lower", g.lowerings), ("restore", g.restores)] {
                let mut l = tenant(t);
                l.push(("resource", g.resource.name()));
                l.push(("action", action));
                protect_actions.push((l, n as f64));
            }
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
    let mut fam = |name, help, unit, kind, rows: &[(Labels, f64)]| {
        sink.family(Family {
            name,
            help,
            unit,
            kind,
            rows,
        })
    };
    fam(
        "dbcage_io",
        "Bytes read and written by a tenant on a device since its group was created",
        Some(Unit::Bytes),
        Counter,
        &bytes,
    )?;
    fam(
        "dbcage_io_operations",
        "IOs completed by a tenant on a device since its group was created",
        None,
        Counter,
        &ios,
    )?;
    fam(
        "dbcage_io_limit_bytes_per_second",
        "Bytes/s limit in force for a tenant on a device",
        None,
        Gauge,
        &bps_limit,
    )?;
    fam(
        "dbcage_io_limit_operations_per_second",
        "IOPS limit in force for a tenant on a device",
        None,
        Gauge,
        &iops_limit,
    )?;
    fam(
        "dbcage_io_share_ratio",
        "Share of the tenant's instance total given to a device under io.split = demand (direction: read_bps, write_bps, read_iops, write_iops)",
        None,
        Gauge,
        &io_share,
    )?;
    fam(
        "dbcage_devices_omitted",
        "Devices of a tenant past the per-tenant bound whose per-device series are not exported",
        None,
        Gauge,
        &omitted,
    )?;
    fam(
        "dbcage_processes",
        "Processes in the tenant's groups",
        None,
        Gauge,
        &procs,
    )?;
    fam(
        "dbcage_cpu_usage",
        "CPU time used by a tenant",
        Some(Unit::Seconds),
        Counter,
        &cpu,
    )?;
    fam(
        "dbcage_cpu_throttled",
        "Time a tenant's runnable threads were held back by its cpu quota, summed over CPUs",
        Some(Unit::Seconds),
        Counter,
        &throttled,
    )?;
    fam(
        "dbcage_cpu_quota_cores",
        "CPU quota in force for a tenant, in cores",
        None,
        Gauge,
        &quota,
    )?;
    fam(
        "dbcage_memory_usage",
        "Memory in use by a tenant",
        Some(Unit::Bytes),
        Gauge,
        &mem,
    )?;
    fam(
        "dbcage_memory_limit",
        "memory.max in force for a tenant",
        Some(Unit::Bytes),
        Gauge,
        &mem_limit,
    )?;
    fam(
        "dbcage_memory_oom_kills",
        "Processes of a tenant killed by the OOM killer",
        None,
        Counter,
        &ooms,
    )?;
    fam(
        "dbcage_memory_numa_local_ratio",
        "Share of a NUMA-pinned tenant's processes' resident pages on its own nodes (numa_maps)",
        None,
        Gauge,
        &numa_local,
    )?;
    fam(
        "dbcage_pressure_waiting",
        "Time some of a tenant's tasks waited for a resource (PSI `some`; cgroup v2 only)",
        Some(Unit::Seconds),
        Counter,
        &waiting,
    )?;
    fam(
        "dbcage_pressure_stalled",
        "Time all of a tenant's non-idle tasks stalled on a resource at once (PSI `full`; cgroup v2 only)",
        Some(Unit::Seconds),
        Counter,
        &stalled,
    )?;
    fam(
        "dbcage_replication_lag",
        "Replication lag the guard last measured for a tenant (a standby: behind its primary; a primary: its furthest standby)",
        Some(Unit::Bytes),
        Gauge,
        &lag_bytes,
    )?;
    fam(
        "dbcage_replication_lag",
        "Replication lag in time the guard last measured for a tenant",
        Some(Unit::Seconds),
        Gauge,
        &lag_seconds,
    )?;
    fam(
        "dbcage_replication_behind",
        "1 while the tenant's lag has been past its guard's threshold",
        None,
        Gauge,
        &behind,
    )?;
    fam(
        "dbcage_protect_step",
        "Halvings of the donors' io.weight (or io caps, protect_lever = caps; cpu.weight for resource=\"cpu\") the protection guard of a tenant holds (0: none, at most 3), by the pressure it watches (resource: io, cpu)",
        None,
        Gauge,
        &protect_step,
    )?;
    fam(
        "dbcage_protect_actions",
        "Writes of a tenant's protection guard to its donors' io.weight, io caps or cpu.weight since the daemon started, by the pressure it watches (resource: io, cpu) and action (lower, restore)",
        None,
        Counter,
        &protect_actions,
    )?;
    fam(
        "dbcage_replication_raised",
        "1 while the guard holds the tenant's write limits raised",
        None,
        Gauge,
        &raised,
    )?;

    let state = shared
        .policy
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let overrides: Vec<(Labels, f64)> = state
        .overrides
        .iter()
        .map(|o| {
            (
                vec![
                    ("tenant", o.tenant.as_str()),
                    ("key", o.key.as_str()),
                    ("source", o.source.as_str()),
                ],
                1.0,
            )
        })
        .collect();
    fam(
        "dbcage_override_info",
        "A limit in force that is not the policy files' value: set at run time (`dbcage set`) or by a schedule window",
        None,
        Gauge,
        &overrides,
    )?;
    let hash_labels = vec![("hash", state.hash.as_str())];
    let one = |labels: Labels<'static>| -> [(Labels<'static>, f64); 1] { [(labels, 1.0)] };
    fam(
        "dbcage_build_info",
        "The dbcage build serving these metrics (value 1)",
        None,
        Gauge,
        &one(vec![("version", env!("CARGO_PKG_VERSION"))]),
    )?;
    if !state.hash.is_empty() {
        fam(
            "dbcage_policy_info",
            "Digest of the policy files in force (names and text; value 1): equal on hosts that run the same policy",
            None,
            Gauge,
            &[(hash_labels, 1.0)],
        )?;
    }
    if let Some(config) = &state.config {
        // The files on disk now: an edit not reloaded, or a reload refused, shows here.
        let on_disk = crate::policy::read_sources(&config.path, config.trust)
            .map(|s| policy_hash(&s))
            .unwrap_or_default();
        fam(
            "dbcage_policy_stale",
            "1 while the policy files on disk differ from the policy in force (edited and not reloaded, a reload refused, or unreadable)",
            None,
            Gauge,
            &[(Vec::new(), f64::from(u8::from(on_disk != state.hash)))],
        )?;
    }
    fam(
        "dbcage_policy_last_reload_successful",
        "1 if the last reload was accepted (or none was asked for), 0 if it was refused",
        None,
        Gauge,
        &[(Vec::new(), f64::from(u8::from(state.last_reload_ok)))],
    )?;
    if state.loaded_at > 0.0 {
        fam(
            "dbcage_policy_loaded_timestamp",
            "Unix time the policy in force was loaded",
            Some(Unit::Seconds),
            Gauge,
            &[(Vec::new(), state.loaded_at)],
        )?;
    }

    let h = &shared.health;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let daemon: [(&'static str, &'static str, Option<Unit>, Kind, f64); 12] = [
        (
            "dbcage_events",
            "Process events handled by the daemon",
            None,
            Counter,
            get(&h.events),
        ),
        (
            "dbcage_events_lost",
            "Times process events were lost (socket overrun); each caused a rescan",
            None,
            Counter,
            get(&h.events_lost),
        ),
        (
            "dbcage_events_connected",
            "1 while the daemon receives process events, 0 in rescan-only mode",
            None,
            Gauge,
            get(&h.events_connected),
        ),
        (
            "dbcage_rescans",
            "Rescans (the periodic safety net, and one after lost events)",
            None,
            Counter,
            get(&h.rescans),
        ),
        (
            "dbcage_rescan_processes_read",
            "Processes the rescans read from /proc: named by a process event since the rescan before last, swept in turn (a tenth), or new",
            None,
            Counter,
            get(&h.rescan_procs_read),
        ),
        (
            "dbcage_rescan_processes_kept",
            "Processes the rescans kept from the scan before: no process event named them",
            None,
            Counter,
            get(&h.rescan_procs_kept),
        ),
        (
            "dbcage_moves",
            "Processes moved into tenant groups",
            None,
            Counter,
            get(&h.moves),
        ),
        (
            "dbcage_kernel_corrections",
            "Control-file values a periodic rescan rewrote because the kernel's differed from the policy in force",
            None,
            Counter,
            get(&h.corrections),
        ),
        (
            "dbcage_apply_errors",
            "Control-file writes and process moves that failed",
            None,
            Counter,
            get(&h.apply_errors),
        ),
        (
            "dbcage_reload_failures",
            "Reloads refused because the new policy was invalid",
            None,
            Counter,
            get(&h.reload_failures),
        ),
        (
            "dbcage_systemd_repairs",
            "Unit properties, and IO limit files of delegated units' leaves, that differed from the plan (daemon-reload, set-property or a write by someone else, a package upgrade) and were set again",
            None,
            Counter,
            get(&h.systemd_repairs),
        ),
        (
            "dbcage_last_scan_timestamp",
            "Unix time of the last full scan",
            Some(Unit::Seconds),
            Gauge,
            get(&h.last_scan_ms) / 1000.0,
        ),
    ];
    for (name, help, unit, kind, v) in daemon {
        fam(name, help, unit, kind, &[(Vec::new(), v)])?;
    }
    if let Some(prog) = shared.iolat.get() {
        let snap = prog.read();
        let mut kept = shared.owners.lock().unwrap_or_else(|e| e.into_inner());
        let owners = kept.of(&snap, || {
            let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
            let (policy, layout) = &*view;
            let names: Vec<String> = policy.tenants.iter().map(|t| t.name.clone()).collect();
            crate::iolat::command::owners(layout, &names)
        });
        let by = snap.by_tenant(owners);
        drop(kept);
        fam(
            "dbcage_io_latency_uncounted",
            "IO requests the latency program saw complete but did not record: reason=full when all of its 1024 histograms (cgroup, disk, operation) are taken, raced when CPUs raced for a new one",
            None,
            Counter,
            &[
                (vec![("reason", "full")], snap.dropped as f64),
                (vec![("reason", "raced")], snap.raced as f64),
            ],
        )?;
        sink.io_latency(&crate::iolat::metrics::Histograms::new(
            &shared.fs.path("/sys"),
            &by,
            prog.no_throttle_split().is_none(),
        ))?;
    }
    Ok(())
}

impl Collector for TenantCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        emit(&self.0, &mut OpenMetrics(&mut enc))
    }
}

/// The two exposition formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (the default).
    Text004,
    /// OpenMetrics 1.0, for scrapers that ask for it.
    OpenMetrics,
}

impl Format {
    /// Chooses by the request's Accept header as Prometheus' own client libraries do: OpenMetrics
    /// when it is asked for (with a non-zero q), otherwise the text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|range| {
                let mut parts = range.split(';').map(str::trim);
                let media = parts.next().unwrap_or("");
                let q_zero = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                media.eq_ignore_ascii_case("application/openmetrics-text") && !q_zero
            })
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The exposition text for the current state in OpenMetrics (also used by tests and the scrape
/// benchmark).
pub fn render(shared: &Arc<Shared>) -> String {
    render_as(shared, Format::OpenMetrics)
}

/// The exposition text for the current state in `format`.
pub fn render_as(shared: &Arc<Shared>, format: Format) -> String {
    let mut out = String::new();
    let result = match format {
        Format::OpenMetrics => {
            let mut registry = Registry::default();
            registry.register_collector(Box::new(TenantCollector(shared.clone())));
            prometheus_client::encoding::text::encode(&mut out, &registry)
        }
        Format::Text004 => emit(shared, &mut Text004(&mut out)),
    };
    if let Err(e) = result {
        tracing::warn!("encoding metrics failed: {e}");
    }
    out
}

/// Serves `/metrics` on `addr` from a background thread, with the web configuration's TLS and
/// basic auth when there is one (`web`).
pub fn serve(
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    web: Option<crate::web::Settings>,
) -> anyhow::Result<()> {
    let handler = move |path: &str, accept: Option<&str>| {
        (path == "/metrics").then(|| {
            let format = Format::negotiate(accept);
            (format.content_type(), render_as(&shared, format))
        })
    };
    crate::web::serve(addr, web, Arc::new(handler)).map_err(|e| anyhow::anyhow!("metrics: {e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_the_accept_header() {
        use Format::*;
        // What Prometheus 2.x sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), OpenMetrics);
        assert_eq!(Format::negotiate(None), Text004);
        assert_eq!(Format::negotiate(Some("*/*")), Text004);
        assert_eq!(Format::negotiate(Some("text/plain;version=0.0.4")), Text004);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0, text/plain")),
            Text004
        );
    }

    #[test]
    fn the_text_format_escapes_and_names_counters_with_total() {
        let mut out = String::new();
        let rows = [
            (vec![("tenant", "a\"b\\c\nd")], 1.5),
            (vec![("tenant", "x")], f64::INFINITY),
        ];
        Text004(&mut out)
            .family(Family {
                name: "dbcage_cpu_usage",
                help: "CPU time \\ used\nby a tenant",
                unit: Some(Unit::Seconds),
                kind: Kind::Counter,
                rows: &rows,
            })
            .unwrap();
        assert_eq!(
            out,
            "# HELP dbcage_cpu_usage_seconds_total CPU time \\\\ used\\nby a tenant\n\
             # TYPE dbcage_cpu_usage_seconds_total counter\n\
             dbcage_cpu_usage_seconds_total{tenant=\"a\\\"b\\\\c\\nd\"} 1.5\n\
             dbcage_cpu_usage_seconds_total{tenant=\"x\"} +Inf\n"
        );
        let mut out = String::new();
        Text004(&mut out)
            .family(Family {
                name: "dbcage_events_connected",
                help: "h",
                unit: None,
                kind: Kind::Gauge,
                rows: &[(Vec::new(), 1.0)],
            })
            .unwrap();
        assert!(out.ends_with("\ndbcage_events_connected 1\n"), "{out}");
    }

    #[test]
    fn the_policy_hash_depends_on_names_and_text_not_directories() {
        let a = [
            (
                PathBuf::from("/etc/dbcage/dbcage.toml"),
                "x = 1\n".to_string(),
            ),
            (
                PathBuf::from("/etc/dbcage/conf.d/10-a.toml"),
                "y = 2\n".into(),
            ),
        ];
        let b = [
            (PathBuf::from("/srv/p/dbcage.toml"), "x = 1\n".to_string()),
            (PathBuf::from("/srv/p/conf.d/10-a.toml"), "y = 2\n".into()),
        ];
        assert_eq!(policy_hash(&a), policy_hash(&b));
        assert_eq!(policy_hash(&a).len(), 16);
        let mut c = a.clone();
        c[1].1 = "y = 3\n".into();
        assert_ne!(policy_hash(&a), policy_hash(&c));
        // The boundary between files counts: the same bytes split differently differ.
        let d = [
            (PathBuf::from("dbcage.toml"), "x = 1\ny".to_string()),
            (PathBuf::from("10-a.toml"), " = 2\n".into()),
        ];
        assert_ne!(policy_hash(&a), policy_hash(&d));
    }
}
