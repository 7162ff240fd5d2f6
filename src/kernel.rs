//! Typed kernel values that round-trip through their text form: device numbers (`8:0`) and
//! cpu/memory-node lists (`0-3,8`). Everything that ends up in a control file passes through one
//! of these types, so a value that reaches a write has already been validated.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// A block device number, printed as the kernel prints it: `MAJ:MIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub fn new(major: u32, minor: u32) -> Self {
        DevNum { major, minor }
    }

    /// From a `dev_t` as returned by stat(2).
    pub fn from_dev_t(dev: u64) -> Self {
        DevNum {
            major: nix::sys::stat::major(dev) as u32,
            minor: nix::sys::stat::minor(dev) as u32,
        }
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a {what}: {why}")]
pub struct ParseKernelValueError {
    text: String,
    what: &'static str,
    why: String,
}

impl FromStr for DevNum {
    type Err = ParseKernelValueError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| ParseKernelValueError {
            text: s.to_string(),
            what: "device number",
            why: why.to_string(),
        };
        let (maj, min) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| err("expected MAJ:MIN"))?;
        let major = maj.parse().map_err(|_| err("major is not a number"))?;
        let minor = min.parse().map_err(|_| err("minor is not a number"))?;
        Ok(DevNum { major, minor })
    }
}

/// A set of cpu or memory-node numbers in the kernel's list format (`0-3,8`, empty for none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

/// The highest cpu number we accept; far above any real machine, low enough that a typo such as
/// `0-4000000` cannot make us build a huge set.
const MAX_CPU: u32 = 65_535;

impl CpuSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl FromStr for CpuSet {
    type Err = ParseKernelValueError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: String| ParseKernelValueError {
            text: s.to_string(),
            what: "cpu list",
            why,
        };
        let mut set = BTreeSet::new();
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Ok(CpuSet(set));
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let lo: u32 = lo
                .parse()
                .map_err(|_| err(format!("`{part}` is not a number or range")))?;
            let hi: u32 = hi
                .parse()
                .map_err(|_| err(format!("`{part}` is not a number or range")))?;
            if lo > hi {
                return Err(err(format!("range `{part}` runs backwards")));
            }
            if hi > MAX_CPU {
                return Err(err(format!(
                    "{hi} is above the highest supported number {MAX_CPU}"
                )));
            }
            set.extend(lo..=hi);
        }
        Ok(CpuSet(set))
    }
}

/// As text (`"7:0"`): device numbers are map keys in plans, and JSON keys must be strings.
impl serde::Serialize for DevNum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DevNum {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpuset_parse_and_print() {
        let set: CpuSet = "0-3,8, 10-11".parse().unwrap();
        assert_eq!(set.to_string(), "0-3,8,10-11");
        assert_eq!(set.len(), 7);
        assert!("3-1".parse::<CpuSet>().is_err());
        assert!("a".parse::<CpuSet>().is_err());
        assert!("0-99999999".parse::<CpuSet>().is_err());
        assert_eq!("".parse::<CpuSet>().unwrap().to_string(), "");
    }

    #[test]
    fn devnum_parse_and_print() {
        let d: DevNum = "8:16".parse().unwrap();
        assert_eq!(d, DevNum::new(8, 16));
        assert_eq!(d.to_string(), "8:16");
        assert!("8".parse::<DevNum>().is_err());
        assert!("8:x".parse::<DevNum>().is_err());
    }

    proptest! {
        #[test]
        fn cpuset_round_trips(cpus in proptest::collection::btree_set(0u32..512, 0..64)) {
            let set = CpuSet(cpus);
            let text = set.to_string();
            prop_assert_eq!(text.parse::<CpuSet>().unwrap(), set);
        }

        #[test]
        fn devnum_round_trips(major in 0u32..4096, minor in 0u32..1_048_576) {
            let d = DevNum::new(major, minor);
            prop_assert_eq!(d.to_string().parse::<DevNum>().unwrap(), d);
        }
    }
}
