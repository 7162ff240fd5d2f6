//! What the drivers read back as usage: the counter types every driver fills (`IoCounters`,
//! `CpuUsage`, `MemoryUsage`, `PressureSet`) and the parsers of the text formats v1 and v2
//! share. Reading only; a missing file is `None`, never an error (a group may be half-created,
//! or a controller absent). The per-version readers are in the drivers (`v1.rs`, `v2.rs`).

use std::collections::BTreeMap;

use crate::hostfs::OpenDir;

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoCounters {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ios: u64,
    pub write_ios: u64,
}

/// `key value` lines (cpu.stat, memory.stat, memory.oom_control) into a map.
pub fn parse_flat_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuUsage {
    pub usage_seconds: Option<f64>,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub throttled_seconds: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryUsage {
    pub current_bytes: Option<u64>,
    pub peak_bytes: Option<u64>,
    /// v1 memory.failcnt; v2 the `max` event (times usage was about to pass memory.max).
    pub limit_hits: Option<u64>,
    pub oom_kills: Option<u64>,
    /// v2 only: the `oom` event (the limit was reached and reclaim failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ooms: Option<u64>,
    /// v2 only: the `high` event (times usage passed memory.high and was throttled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high_events: Option<u64>,
}

/// Pressure stall information of one resource: the share of time some (or all) of the group's
/// tasks waited for it, over 10 s and 60 s, and the total stall time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pressure {
    pub some_avg10: f64,
    pub some_avg60: f64,
    pub some_total_seconds: f64,
    pub full_avg10: Option<f64>,
    pub full_avg60: Option<f64>,
    pub full_total_seconds: Option<f64>,
}

/// Parses a PSI file (`io.pressure`, `cpu.pressure`, `memory.pressure`, /proc/pressure/*):
/// `some avg10=0.66 avg60=5.58 avg300=6.58 total=149617732` and an optional `full` line.
pub fn parse_pressure(text: &str) -> Option<Pressure> {
    let line = |kind: &str| -> Option<(f64, f64, f64)> {
        let l = text.lines().find(|l| l.starts_with(kind))?;
        let field = |key: &str| -> Option<f64> {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        };
        Some((field("avg10")?, field("avg60")?, field("total")? / 1e6))
    };
    let (some_avg10, some_avg60, some_total_seconds) = line("some")?;
    let full = line("full");
    Some(Pressure {
        some_avg10,
        some_avg60,
        some_total_seconds,
        full_avg10: full.map(|f| f.0),
        full_avg60: full.map(|f| f.1),
        full_total_seconds: full.map(|f| f.2),
    })
}

/// PSI of a cgroup per resource, where the kernel keeps it per cgroup (v2).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PressureSet {
    pub io: Option<Pressure>,
    pub cpu: Option<Pressure>,
    pub memory: Option<Pressure>,
}

pub fn read_pressure(dir: &OpenDir) -> PressureSet {
    let read = |f: &str| dir.read(f).ok().and_then(|t| parse_pressure(&t));
    PressureSet {
        io: read("io.pressure"),
        cpu: read("cpu.pressure"),
        memory: read("memory.pressure"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::v1::{parse_v1_blkio, v1_cpu, v1_io, v1_memory};
    use crate::cgroup::v2::{parse_v2_cpu_stat, parse_v2_io_stat, v2_cpu, v2_io, v2_memory_from};
    use crate::kernel::DevNum;

    #[test]
    fn v1_blkio_lines() {
        let text = "7:3 Read 16777216\n7:3 Write 4096\n7:3 Sync 0\n7:3 Async 0\n7:3 Discard 0\n7:3 Total 16781312\nTotal 16781312\n";
        let m = parse_v1_blkio(text);
        assert_eq!(m.get(&DevNum::new(7, 3)), Some(&(16_777_216, 4096)));
        assert_eq!(m.len(), 1);
    }

    // Copied from the cgroup v2 test VM (Debian 6.1), tests/vm/scenarios.sh: a tenant whose
    // limited leaf read 17 MiB from vdc and nothing from vdb (a device line with no keys).
    #[test]
    fn v2_io_stat() {
        let text = "254:32 rbytes=18022400 wbytes=0 rios=275 wios=0 dbytes=0 dios=0\n254:16 \n";
        let m = parse_v2_io_stat(text);
        assert_eq!(
            m[&DevNum::new(254, 32)],
            IoCounters {
                read_bytes: 18_022_400,
                write_bytes: 0,
                read_ios: 275,
                write_ios: 0
            }
        );
        assert_eq!(m[&DevNum::new(254, 16)], IoCounters::default());
    }

    #[test]
    fn v2_cpu_stat() {
        let text = "usage_usec 8782940\nuser_usec 6360248\nsystem_usec 2422691\nnr_periods 198\nnr_throttled 138\nthrottled_usec 7372427\nnr_bursts 0\nburst_usec 0\n";
        let c = parse_v2_cpu_stat(text);
        assert_eq!(c.usage_seconds, Some(8.78294));
        assert_eq!(c.nr_periods, Some(198));
        assert_eq!(c.nr_throttled, Some(138));
        assert_eq!(c.throttled_seconds, Some(7.372427));
        // without the cpu controller enabled, cpu.stat has the usage lines only
        let c = parse_v2_cpu_stat("usage_usec 120\nuser_usec 100\nsystem_usec 20\n");
        assert_eq!((c.usage_seconds, c.nr_periods), (Some(0.00012), None));
    }

    #[test]
    fn v2_memory_events() {
        // after one OOM kill under memory.max = 32 MiB
        let text = "low 0\nhigh 0\nmax 35\noom 1\noom_kill 1\noom_group_kill 0\n";
        let m = v2_memory_from(Some(262_144), Some(33_554_432), &parse_flat_keyed(text));
        assert_eq!(m.oom_kills, Some(1));
        assert_eq!(m.ooms, Some(1));
        assert_eq!(m.limit_hits, Some(35));
        assert_eq!(m.high_events, Some(0));
        assert_eq!(m.peak_bytes, Some(33_554_432));
    }

    #[test]
    fn flat_keyed() {
        let m = parse_flat_keyed("nr_periods 10\nnr_throttled 4\nthrottled_time 123456\n");
        assert_eq!(m["nr_throttled"], 4);
        let o = parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
        assert_eq!(o["oom_kill"], 2);
    }

    #[test]
    fn pressure_some_and_full() {
        // /proc/pressure/io of this host
        let text = "some avg10=0.66 avg60=5.58 avg300=6.58 total=149617732\nfull avg10=0.64 avg60=5.18 avg300=5.23 total=93419899\n";
        let p = parse_pressure(text).unwrap();
        assert_eq!(p.some_avg10, 0.66);
        assert_eq!(p.some_avg60, 5.58);
        assert!((p.some_total_seconds - 149.617732).abs() < 1e-9);
        assert_eq!(p.full_avg10, Some(0.64));
        // cpu.pressure of a v2 cgroup on older kernels has no `full` line
        let cpu = parse_pressure("some avg10=1.00 avg60=0.50 avg300=0.10 total=2000000\n").unwrap();
        assert_eq!(cpu.full_avg10, None);
        assert!(parse_pressure("").is_none());
        assert!(parse_pressure("some avg10=x").is_none());
    }

    #[test]
    fn missing_files_read_as_unknown_not_as_errors() {
        let gone = &OpenDir::open("/nonexistent/dbcage-test-group");
        assert!(v1_io(gone).is_empty());
        assert!(v2_io(gone).is_empty());
        let m = v1_memory(gone);
        assert_eq!(
            (m.current_bytes, m.peak_bytes, m.limit_hits, m.oom_kills),
            (None, None, None, None)
        );
        let c = v1_cpu(Some(gone), Some(gone));
        assert_eq!((c.usage_seconds, c.nr_throttled), (None, None));
        let c2 = v2_cpu(gone);
        assert_eq!(c2.usage_seconds, None);
        assert!(read_pressure(gone).io.is_none());
    }
}
