//! Readers of cgroup usage counters for `status`. They only read; a missing file is `None`,
//! never an error (a group may be half-created, or a controller absent).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::kernel::DevNum;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoCounters {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_ios: u64,
    pub write_ios: u64,
}

/// Parses v1 `blkio.throttle.io_service_bytes[_recursive]` / `io_serviced[_recursive]`:
/// `MAJ:MIN Read N`, `MAJ:MIN Write N`, ... and a closing `Total N`.
pub fn parse_v1_blkio(text: &str) -> BTreeMap<DevNum, (u64, u64)> {
    let mut out: BTreeMap<DevNum, (u64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(dev), Ok(v)) = (dev.parse::<DevNum>(), v.parse::<u64>()) else {
            continue;
        };
        let e = out.entry(dev).or_default();
        match op {
            "Read" => e.0 = v,
            "Write" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// Per-device IO of a v1 blkio group, its children included.
pub fn v1_io(dir: &Path) -> BTreeMap<DevNum, IoCounters> {
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .map(|t| parse_v1_blkio(&t))
            .unwrap_or_default()
    };
    let bytes = read("blkio.throttle.io_service_bytes_recursive");
    let ios = read("blkio.throttle.io_serviced_recursive");
    let mut out: BTreeMap<DevNum, IoCounters> = BTreeMap::new();
    for (d, (r, w)) in bytes {
        let e = out.entry(d).or_default();
        e.read_bytes = r;
        e.write_bytes = w;
    }
    for (d, (r, w)) in ios {
        let e = out.entry(d).or_default();
        e.read_ios = r;
        e.write_ios = w;
    }
    out.retain(|_, c| *c != IoCounters::default());
    out
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

pub fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuUsage {
    pub usage_seconds: Option<f64>,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub throttled_seconds: Option<f64>,
}

pub fn v1_cpu(cpu_dir: Option<&Path>, cpuacct_dir: Option<&Path>) -> CpuUsage {
    let stat = cpu_dir
        .and_then(|d| std::fs::read_to_string(d.join("cpu.stat")).ok())
        .map(|t| parse_flat_keyed(&t))
        .unwrap_or_default();
    CpuUsage {
        usage_seconds: cpuacct_dir
            .and_then(|d| read_u64(&d.join("cpuacct.usage")))
            .map(|ns| ns as f64 / 1e9),
        nr_periods: stat.get("nr_periods").copied(),
        nr_throttled: stat.get("nr_throttled").copied(),
        throttled_seconds: stat.get("throttled_time").map(|ns| *ns as f64 / 1e9),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryUsage {
    pub current_bytes: Option<u64>,
    pub peak_bytes: Option<u64>,
    pub limit_hits: Option<u64>,
    pub oom_kills: Option<u64>,
}

pub fn v1_memory(dir: &Path) -> MemoryUsage {
    let oom = std::fs::read_to_string(dir.join("memory.oom_control"))
        .map(|t| parse_flat_keyed(&t))
        .unwrap_or_default();
    MemoryUsage {
        current_bytes: read_u64(&dir.join("memory.usage_in_bytes")),
        peak_bytes: read_u64(&dir.join("memory.max_usage_in_bytes")),
        limit_hits: read_u64(&dir.join("memory.failcnt")),
        oom_kills: oom.get("oom_kill").copied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_blkio_lines() {
        let text = "7:3 Read 16777216\n7:3 Write 4096\n7:3 Sync 0\n7:3 Async 0\n7:3 Discard 0\n7:3 Total 16781312\nTotal 16781312\n";
        let m = parse_v1_blkio(text);
        assert_eq!(m.get(&DevNum::new(7, 3)), Some(&(16_777_216, 4096)));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn flat_keyed() {
        let m = parse_flat_keyed("nr_periods 10\nnr_throttled 4\nthrottled_time 123456\n");
        assert_eq!(m["nr_throttled"], 4);
        let o = parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
        assert_eq!(o["oom_kill"], 2);
    }
}
