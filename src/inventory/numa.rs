//! NUMA nodes and their cpus, from /sys/devices/system/node. A host without that directory (a
//! kernel built without NUMA) is one node holding every online cpu.

use std::collections::BTreeMap;

use crate::hostfs::HostFs;
use crate::kernel::CpuSet;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumaTopology {
    /// node number → its cpus
    pub nodes: BTreeMap<u32, CpuSet>,
    pub online_cpus: CpuSet,
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
            }
        }
        if nodes.is_empty() {
            nodes.insert(0, online_cpus.clone());
        }
        Ok(NumaTopology { nodes, online_cpus })
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
        let t = NumaTopology::read(&fs).unwrap();
        assert_eq!(t.nodes.len(), 2);
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
