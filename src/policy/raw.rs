//! The policy exactly as serde reads it: strings where the user wrote strings, every value with
//! its location. `super::validate` turns this into a `Policy`; nothing past that line sees a
//! string that should have been a number. Unknown keys are not refused here (serde would stop at
//! the first): `super::keys` reports every one of them, with suggestions, before this is read.

use serde::Deserialize;

use super::source::Loc;

#[derive(Debug, Default, Deserialize)]
pub struct RawFile {
    pub agent: Option<RawAgent>,
    #[serde(default, rename = "tenant")]
    pub tenants: Vec<Loc<RawTenant>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct RawAgent {
    /// Name of the cgroup under which every tenant lives (default `dbcage`).
    pub root: Option<Loc<String>>,
    /// `"root"` (the hierarchy root), `"self"` (dbcage's own cgroup) or an absolute cgroup path.
    pub parent: Option<Loc<String>>,
    /// Address of the daemon's Prometheus endpoint (`"127.0.0.1:9477"`), or `"off"`.
    pub metrics: Option<Loc<String>>,
    /// A group whose members may use the daemon's control socket (`dbcage set`, `reload`).
    pub control_group: Option<Loc<Name>>,
    /// Who manages the cgroup tree: `"auto"` (default: systemd when it is PID 1 and booted the
    /// host), `"systemd"` or `"cgroupfs"` (dbcage writes the tree itself).
    pub manager: Option<Loc<String>>,
    /// `false`: the daemon loads no eBPF program and serves no IO latency histograms (default
    /// `true` while metrics are on).
    pub io_latency: Option<Loc<bool>>,
    /// Mount the extra named hierarchy with `favordynmods` at the daemon's start (see
    /// `favordynmods`).
    pub favordynmods: Option<Loc<bool>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RawTenant {
    pub name: Loc<String>,
    /// A database preset (`"postgres"`, ...) that adds match rules and storage; see `preset`.
    pub preset: Option<Loc<String>>,
    #[serde(rename = "match")]
    pub rules: Option<Vec<Loc<RawRule>>>,
    pub exempt: Option<Vec<Loc<RawRule>>>,
    pub storage: Option<Vec<Loc<String>>>,
    /// `"device"` (default: dm/md devices themselves) or `"members"` (their member disks).
    pub storage_level: Option<Loc<String>>,
    /// `preset = "postgres"`: the instance's data directory.
    pub data_dir: Option<Loc<String>>,
    /// `preset = "postgres"`: `"exempt"` (default) or `"limited"` for the WAL-critical processes.
    pub wal: Option<Loc<String>>,
    /// `[tenant.replication]`: the replication guard (see the top-level `replication` module).
    pub replication: Option<RawReplication>,
    pub io: Option<RawIo>,
    pub cpu: Option<RawCpu>,
    pub memory: Option<RawMemory>,
    /// Names of preset rules to leave out (`["log_writers"]`); see `preset`.
    pub preset_omit: Option<Loc<Vec<String>>>,
    /// `preset = "oracle"`: the instance's ORACLE_SID.
    pub sid: Option<Loc<String>>,
    /// `preset = "oracle"`: the ASM disks, a glob or a list of globs.
    pub asm_disks: Option<Loc<OneOrMany>>,
    /// `preset = "oracle"`: ASM's discovery string, with `asm_diskgroup`.
    pub asm_diskstring: Option<Loc<String>>,
    /// `preset = "oracle"`: the diskgroup whose disks `asmcmd lsdsk` lists.
    pub asm_diskgroup: Option<Loc<String>>,
    /// `preset = "mysql"`: the server's data directory.
    pub datadir: Option<Loc<String>>,
    /// `preset = "mysql"`: the server's pid file (default `<datadir>/<hostname>.pid`).
    pub pid_file: Option<Loc<String>>,
    /// `preset = "mysql"`: innodb_log_group_home_dir, when not in the datadir.
    pub innodb_log_group_home_dir: Option<Loc<String>>,
    /// `preset = "mysql"`: the server's tmpdir, when its IO counts as the instance's.
    pub tmpdir: Option<Loc<String>>,
    /// Time windows with other limits: `[[tenant.schedule]] days = "Mon-Fri" from = "22:00"`.
    pub schedule: Option<Vec<Loc<RawSchedule>>>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn items(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// One time window and the limit keys that hold inside it (`io.read_bps = "400MiB"`, written as
/// dotted keys, so `io`, `cpu` and `memory` are tables here).
#[derive(Debug, Clone, Deserialize)]
pub struct RawSchedule {
    /// `"Mon-Fri"`, `"Sat,Sun"`, `"Fri-Mon"`; every day when absent.
    pub days: Option<Loc<String>>,
    /// `"22:00"`: local time (the host's time zone) when the window opens.
    pub from: Loc<String>,
    /// `"06:00"`: when it closes; earlier than `from` means the next day.
    pub to: Loc<String>,
    pub io: Option<RawIo>,
    pub cpu: Option<RawCpu>,
    pub memory: Option<RawMemory>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawRule {
    pub cmdline: Option<Loc<String>>,
    pub comm: Option<Loc<String>>,
    pub exe: Option<Loc<String>>,
    pub user: Option<Loc<Name>>,
    pub group: Option<Loc<Name>>,
    /// The process whose PID is the first line of this file (a server's pid file).
    pub pidfile: Option<Loc<String>>,
    /// Processes in this systemd unit (`postgresql@15-main.service`, or a glob over names).
    pub unit: Option<Loc<String>>,
    pub descendants: Option<bool>,
    /// Exempt rules only: decide the leaf of processes the tenant already holds as descendants,
    /// claim none by themselves (a preset's `postgres: walwriter` must not take another
    /// cluster's walwriter).
    pub within_tenant: Option<bool>,
    /// The name a preset gave this rule (`background`), shown in its label; never read from a
    /// file.
    #[serde(skip)]
    pub(crate) preset_name: Option<&'static str>,
}

/// A user or group, by name or by number.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Name {
    Id(i64),
    Text(String),
}

/// A quantity as written: `8388608`, `1.5`, or `"50MiB"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    Int(i64),
    Float(f64),
    Text(String),
}

/// The four IO limits, as they appear both in `[tenant.io]` and in each `[[tenant.io.device]]`.
#[derive(Debug, Clone, Default)]
pub struct RawIoValues {
    pub read_bps: Option<Loc<Quantity>>,
    pub write_bps: Option<Loc<Quantity>>,
    pub read_iops: Option<Loc<Quantity>>,
    pub write_iops: Option<Loc<Quantity>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawIo {
    pub read_bps: Option<Loc<Quantity>>,
    pub write_bps: Option<Loc<Quantity>>,
    pub read_iops: Option<Loc<Quantity>>,
    pub write_iops: Option<Loc<Quantity>>,
    /// Per-device overrides: `[[tenant.io.device]] path = "/dev/sdb" read_bps = "10MiB"`.
    #[serde(default, rename = "device")]
    pub devices: Vec<Loc<RawIoDevice>>,
    /// `"equal"` (default) or `"demand"`.
    pub split: Option<Loc<String>>,
    /// `"1s"`, `"500ms"`: how often the daemon rebalances under `split = "demand"`.
    pub rebalance_interval: Option<Loc<String>>,
    /// `"5%"`: the share of the total each device keeps under `split = "demand"`.
    pub floor: Option<Loc<String>>,
    /// 0..1: weight of the previous usage estimate when a device's usage falls.
    pub smoothing: Option<Loc<Quantity>>,
    /// 1..10000: the tenant's share of a contended disk (cgroup v2 `io.weight`, iocost).
    pub weight: Option<Loc<Quantity>>,
    /// `"5ms"`: the IO completion latency the tenant is protected at (cgroup v2 `io.latency`).
    pub latency_target: Option<Loc<String>>,
    /// `"20%"`: the io pressure (share of time some of the tenant's tasks stall on IO) at which
    /// the protection guard lowers the donors' weights.
    pub protect_pressure: Option<Loc<String>>,
    /// `"1s"`: the window the pressure is measured over (a PSI trigger's window).
    pub protect_window: Option<Loc<String>>,
    /// The tenants whose io.weight the guard lowers while this one is under pressure.
    #[serde(default)]
    pub protect_donors: Vec<Loc<String>>,
    /// `"weight"` (the default) or `"caps"`: what the guard lowers on the donors.
    pub protect_lever: Option<Loc<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RawIoDevice {
    pub path: Loc<String>,
    pub read_bps: Option<Loc<Quantity>>,
    pub write_bps: Option<Loc<Quantity>>,
    pub read_iops: Option<Loc<Quantity>>,
    pub write_iops: Option<Loc<Quantity>>,
}

// serde's `flatten` cannot be combined with `deny_unknown_fields`, so the four keys are spelled
// out in both tables and gathered here.
macro_rules! io_values {
    ($t:ty) => {
        impl $t {
            pub fn values(&self) -> RawIoValues {
                RawIoValues {
                    read_bps: self.read_bps.clone(),
                    write_bps: self.write_bps.clone(),
                    read_iops: self.read_iops.clone(),
                    write_iops: self.write_iops.clone(),
                }
            }
        }
    };
}
io_values!(RawIo);
io_values!(RawIoDevice);

/// `[tenant.replication]`, replaced whole by a drop-in.
#[derive(Debug, Clone, Deserialize)]
pub struct RawReplication {
    /// `"primary"` or `"standby"`.
    pub role: Loc<String>,
    /// libpq connection string of the local server.
    pub conninfo: Loc<String>,
    /// The account psql runs as (default `postgres`).
    pub user: Option<Loc<String>>,
    /// Path of psql (default `/usr/bin/psql`).
    pub psql: Option<Loc<String>>,
    pub lag_bytes: Option<Loc<Quantity>>,
    pub lag_seconds: Option<Loc<f64>>,
    /// How long the lag stays past a threshold before the guard acts (`"10s"`).
    #[serde(rename = "for")]
    pub hold: Option<Loc<String>>,
    pub interval: Option<Loc<String>>,
    /// `"warn"` (default) or `"raise"`.
    pub action: Option<Loc<String>>,
    pub raise_to: Option<Loc<Quantity>>,
    pub raise_iops_to: Option<Loc<Quantity>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawCpu {
    pub cpus: Option<Loc<String>>,
    pub numa_nodes: Option<Loc<Vec<i64>>>,
    pub numa: Option<Loc<String>>,
    pub migrate_memory: Option<Loc<bool>>,
    pub cores: Option<Loc<Quantity>>,
    pub weight: Option<Loc<Quantity>>,
    /// `"20%"`: the cpu pressure (share of time some of the tenant's tasks wait for a cpu) at
    /// which the protection guard lowers the donors' cpu.weight.
    pub protect_pressure: Option<Loc<String>>,
    /// `"1s"`: the window the pressure is measured over (a PSI trigger's window).
    pub protect_window: Option<Loc<String>>,
    /// The tenants whose cpu.weight the guard lowers while this one is under pressure.
    #[serde(default)]
    pub protect_donors: Vec<Loc<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RawMemory {
    pub max: Option<Loc<Quantity>>,
    pub high: Option<Loc<Quantity>>,
    pub low: Option<Loc<Quantity>>,
    pub swap_max: Option<Loc<Quantity>>,
    pub huge_pages: Option<Loc<Quantity>>,
}

/// Replaces `into` with `from` when `from` is set: the drop-in merge rule for one key.
fn take<T>(into: &mut Option<T>, from: Option<T>) {
    if from.is_some() {
        *into = from;
    }
}

impl RawAgent {
    pub fn merge(&mut self, later: RawAgent) {
        take(&mut self.root, later.root);
        take(&mut self.parent, later.parent);
        take(&mut self.metrics, later.metrics);
        take(&mut self.control_group, later.control_group);
        take(&mut self.manager, later.manager);
        take(&mut self.io_latency, later.io_latency);
        take(&mut self.favordynmods, later.favordynmods);
    }
}

impl RawTenant {
    /// A drop-in that names an existing tenant changes only the keys it sets; lists (`match`,
    /// `exempt`, `storage`, `io.device`) are replaced whole, since merging rule lists item by
    /// item would make the result hard to predict.
    pub fn merge(&mut self, later: RawTenant) {
        take(&mut self.preset, later.preset);
        take(&mut self.rules, later.rules);
        take(&mut self.exempt, later.exempt);
        take(&mut self.storage, later.storage);
        take(&mut self.storage_level, later.storage_level);
        take(&mut self.preset_omit, later.preset_omit);
        take(&mut self.sid, later.sid);
        take(&mut self.asm_disks, later.asm_disks);
        take(&mut self.asm_diskstring, later.asm_diskstring);
        take(&mut self.asm_diskgroup, later.asm_diskgroup);
        take(&mut self.datadir, later.datadir);
        take(&mut self.pid_file, later.pid_file);
        take(
            &mut self.innodb_log_group_home_dir,
            later.innodb_log_group_home_dir,
        );
        take(&mut self.tmpdir, later.tmpdir);
        take(&mut self.data_dir, later.data_dir);
        take(&mut self.wal, later.wal);
        take(&mut self.replication, later.replication);
        take(&mut self.schedule, later.schedule);
        self.merge_limits(later.io, later.cpu, later.memory);
    }

    /// The limit tables of a drop-in, a schedule window or a `set` override, key by key.
    pub fn merge_limits(
        &mut self,
        io: Option<RawIo>,
        cpu: Option<RawCpu>,
        memory: Option<RawMemory>,
    ) {
        match (&mut self.io, io) {
            (Some(io), Some(l)) => {
                take(&mut io.read_bps, l.read_bps);
                take(&mut io.write_bps, l.write_bps);
                take(&mut io.read_iops, l.read_iops);
                take(&mut io.write_iops, l.write_iops);
                take(&mut io.split, l.split);
                take(&mut io.rebalance_interval, l.rebalance_interval);
                take(&mut io.floor, l.floor);
                take(&mut io.smoothing, l.smoothing);
                take(&mut io.weight, l.weight);
                take(&mut io.latency_target, l.latency_target);
                take(&mut io.protect_pressure, l.protect_pressure);
                take(&mut io.protect_window, l.protect_window);
                take(&mut io.protect_lever, l.protect_lever);
                if !l.protect_donors.is_empty() {
                    io.protect_donors = l.protect_donors;
                }
                if !l.devices.is_empty() {
                    io.devices = l.devices;
                }
            }
            (slot, l) => take(slot, l),
        }
        match (&mut self.cpu, cpu) {
            (Some(c), Some(l)) => {
                take(&mut c.cpus, l.cpus);
                // a later layer that names the nodes replaces `numa = "auto"`, and the reverse
                // (`dbcage set T cpu.numa_nodes=1` on an auto tenant pins it)
                if l.numa_nodes.is_some() {
                    c.numa = None;
                }
                if l.numa.is_some() {
                    c.numa_nodes = None;
                }
                take(&mut c.numa_nodes, l.numa_nodes);
                take(&mut c.numa, l.numa);
                take(&mut c.migrate_memory, l.migrate_memory);
                take(&mut c.cores, l.cores);
                take(&mut c.weight, l.weight);
                take(&mut c.protect_pressure, l.protect_pressure);
                take(&mut c.protect_window, l.protect_window);
                if !l.protect_donors.is_empty() {
                    c.protect_donors = l.protect_donors;
                }
            }
            (slot, l) => take(slot, l),
        }
        match (&mut self.memory, memory) {
            (Some(m), Some(l)) => {
                take(&mut m.max, l.max);
                take(&mut m.high, l.high);
                take(&mut m.low, l.low);
                take(&mut m.swap_max, l.swap_max);
                take(&mut m.huge_pages, l.huge_pages);
            }
            (slot, l) => take(slot, l),
        }
    }
}
