//! NUMA nodes, their cpus and their memory, from /sys/devices/system/node. A host without that
//! directory (a kernel built without NUMA) is one node holding every online cpu (its memory then
//! unknown: `memory` is empty).

use std::collections::BTreeMap;

use crate::hostfs::HostFs;
use crate::kernel::CpuSet;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaTopology {
    /// node number → its cpus
    pub nodes: BTreeMap<u32, CpuSet>,
    /// node number → its memory in bytes (`MemTotal` of nodeN/meminfo); a node whose meminfo
    /// cannot be read is absent.
    pub memory: BTreeMap<u32, u64>,
    pub online_cpus: CpuSet,
    /// /proc/sys/kernel/numa_balancing is on (non-zero); `None` when the kernel has no such file.
    pub balancing: Option<bool>,
    /// node number → bytes in its huge page pools (`nr_hugepages` times the page size, summed
    /// over `nodeN/hugepages/hugepages-<size>kB`); a node without a pool is absent.
    pub huge_pages: BTreeMap<u32, u64>,
}

/// `MemTotal` in bytes from a node's meminfo (`Node 0 MemTotal:  16318480 kB`).
pub fn parse_node_memtotal(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.split_once("MemTotal:")?.1;
        let kb: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// Bytes per NUMA node of a /proc/PID/numa_maps text: each mapping's `N<node>=<pages>` times
/// its `kernelpagesize_kB` (huge pages included).
pub fn parse_numa_maps(text: &str) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let page_kib = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("kernelpagesize_kB=")?.parse::<u64>().ok())
            .unwrap_or(4);
        for w in line.split_whitespace() {
            let Some((node, pages)) = w
                .strip_prefix('N')
                .and_then(|r| r.split_once('='))
                .and_then(|(n, p)| Some((n.parse::<u32>().ok()?, p.parse::<u64>().ok()?)))
            else {
                continue;
            };
            *out.entry(node).or_default() += pages * page_kib * 1024;
        }
    }
    out
}

/// Bytes per NUMA node of the resident pages of each of `pids` (/proc/PID/numa_maps; it walks
/// the process's page tables, so read it only for the processes that need it). A process that
/// is gone or whose file cannot be read is absent.
pub fn read_process_nodes(fs: &HostFs, pids: &[u32]) -> BTreeMap<u32, BTreeMap<u32, u64>> {
    pids.iter()
        .filter_map(|pid| {
            let text = fs.read_to_string(format!("/proc/{pid}/numa_maps")).ok()?;
            Some((*pid, parse_numa_maps(&text)))
        })
        .collect()
}

/// Bytes in the huge page pools under a node's `hugepages` directory (`hugepages-2048kB/
/// nr_hugepages` and so on); 0 without any.
fn node_huge_pages(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kib: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages: u64 = std::fs::read_to_string(e.path().join("nr_hugepages"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            pages.checked_mul(kib)?.checked_mul(1024)
        })
        .sum()
}

impl NumaTopology {
    pub fn read(fs: &HostFs) -> std::io::Result<NumaTopology> {
        let online_cpus: CpuSet = fs
            .read_to_string("/sys/devices/system/cpu/online")?
            .trim()
            .parse()
            .map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("/sys/devices/system/cpu/online: {e}"),
                )
            })?;
        let mut nodes = BTreeMap::new();
        let mut memory = BTreeMap::new();
        let mut huge_pages = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir(fs.path("/sys/devices/system/node")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(num) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let cpus = std::fs::read_to_string(e.path().join("cpulist"))
                    .ok()
                    .and_then(|t| t.trim().parse::<CpuSet>().ok())
                    .unwrap_or_default();
                nodes.insert(num, cpus);
                if let Some(bytes) = fs
                    .read_to_string(format!("/sys/devices/system/node/node{num}/meminfo"))
                    .ok()
                    .and_then(|t| parse_node_memtotal(&t))
                {
                    memory.insert(num, bytes);
                }
                let pools = node_huge_pages(&e.path().join("hugepages"));
                if pools > 0 {
                    huge_pages.insert(num, pools);
                }
            }
        }
        if nodes.is_empty() {
            nodes.insert(0, online_cpus.clone());
        }
        let balancing = fs
            .read_to_string("/proc/sys/kernel/numa_balancing")
            .ok()
            .map(|t| t.trim() != "0");
        Ok(NumaTopology {
            nodes,
            memory,
            online_cpus,
            balancing,
            huge_pages,
        })
    }

    /// The cpus of these nodes, or the first node that does not exist.
    pub fn cpus_of(&self, nodes: &CpuSet) -> Result<CpuSet, u32> {
        let mut out = CpuSet::default();
        for n in nodes.iter() {
            out = out.union(self.nodes.get(&n).ok_or(n)?);
        }
        Ok(out)
    }

    pub fn node_set(&self) -> CpuSet {
        CpuSet::from_iter(self.nodes.keys().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nodes_from_a_fixture() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        std::fs::create_dir_all(fs.path("/sys/devices/system/cpu")).unwrap();
        std::fs::write(fs.path("/sys/devices/system/cpu/online"), "0-3\n").unwrap();
        for (n, cpus) in [(0, "0,2"), (1, "1,3")] {
            let d = fs.path(format!("/sys/devices/system/node/node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), cpus).unwrap();
        }
        // copied from a 2-node host; node 1 has no meminfo here (memory unknown, not zero)
        std::fs::write(
            fs.path("/sys/devices/system/node/node0/meminfo"),
            "Node 0 MemTotal:       16318480 kB\nNode 0 MemFree:        15101200 kB\nNode 0 MemUsed:         1217280 kB\n",
        )
        .unwrap();
        // node 0: 512 pages of 2 MiB and 1 of 1 GiB (the layout of a real host's node0/hugepages);
        // node 1 has the directories with empty pools
        for (n, size, pages) in [
            (0, "hugepages-2048kB", "512\n"),
            (0, "hugepages-1048576kB", "1\n"),
            (1, "hugepages-2048kB", "0\n"),
            (1, "hugepages-1048576kB", "0\n"),
        ] {
            let d = fs.path(format!("/sys/devices/system/node/node{n}/hugepages/{size}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("nr_hugepages"), pages).unwrap();
            std::fs::write(d.join("free_hugepages"), pages).unwrap();
            std::fs::write(d.join("surplus_hugepages"), "0\n").unwrap();
        }
        let t = NumaTopology::read(&fs).unwrap();
        assert_eq!(t.huge_pages.get(&0), Some(&((512 << 21) + (1 << 30))));
        assert_eq!(t.huge_pages.get(&1), None);
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.memory.get(&0), Some(&(16318480 * 1024)));
        assert_eq!(t.memory.get(&1), None);
        assert_eq!(t.cpus_of(&"1".parse().unwrap()).unwrap().to_string(), "1,3");
        assert_eq!(
            t.cpus_of(&"0-1".parse().unwrap()).unwrap().to_string(),
            "0-3"
        );
        assert_eq!(t.cpus_of(&"2".parse().unwrap()), Err(2));
    }

    #[test]
    fn without_numa_one_node_holds_every_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        std::fs::create_dir_all(fs.path("/sys/devices/system/cpu")).unwrap();
        std::fs::write(fs.path("/sys/devices/system/cpu/online"), "0-1\n").unwrap();
        let t = NumaTopology::read(&fs).unwrap();
        assert_eq!(t.nodes.get(&0).unwrap().to_string(), "0-1");
    }
}
