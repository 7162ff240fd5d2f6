//! Loads iolat.bpf.c (embedded, CO-RE) into the kernel with libbpf-rs, attaches it, and reads
//! its maps into a `Snapshot`. Loading needs the kernel's BTF (/sys/kernel/btf/vmlinux) and
//! CAP_BPF with CAP_PERFMON (or CAP_SYS_ADMIN); each missing piece is one `Unavailable`
//! that says what to do. The program detaches when `IoLatency` is dropped.

use libbpf_rs::{Link, MapCore, MapFlags, Object, ObjectBuilder};

use crate::bpf::{take_log, NotLoadable, BTF};

use super::{Dev, Hist, Key, Op, Snapshot, Stages, FINE, SLOTS};

/// The compiled program (build.rs).
const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/iolat.bpf.o"));

/// The fentry program that stamps a bio before blk-throttle (see iolat.bpf.c).
const SUBMIT_HOOK: &str = "iolat_submit";
/// Where it attaches, first choice first: `__blk_throtl_bio` sees only the bios of groups with
/// a limit on their disk (the others cannot wait in the throttle and cost no map update);
/// kernels that inline it into its caller get `submit_bio_noacct`, every bio.
const SUBMIT_TARGETS: [&str; 2] = ["__blk_throtl_bio", "submit_bio_noacct"];

/// Indices of the `counters` map (iolat.bpf.c `CNT_*`).
const CNT_UNMATCHED: u32 = 0;
const CNT_DROPPED: u32 = 1;
const CNT_RACED: u32 = 2;

/// Why the histograms are not available. Callers report it once and go on without them.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error(
        "the kernel has no BTF ({BTF} is missing): IO latency histograms need a kernel built \
         with CONFIG_DEBUG_INFO_BTF=y (Debian, Ubuntu, RHEL 8.2+ and Fedora kernels are)"
    )]
    NoBtf,
    #[error(
        "this process lacks {missing} (effective capabilities {have:#x}): IO latency histograms \
         need CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN); run as root or add them to the \
         service's AmbientCapabilities"
    )]
    NoCapability { missing: String, have: u64 },
    #[error("the kernel refused the IO latency program ({step}): {source}{log}")]
    Refused {
        step: &'static str,
        source: libbpf_rs::Error,
        /// The last lines libbpf logged (verifier or relocation messages).
        log: String,
    },
}

/// The loaded, attached program.
pub struct IoLatency {
    // Links first: they detach before the object is closed.
    _links: Vec<Link>,
    object: Object,
    no_throttle_split: Option<String>,
}

impl std::fmt::Debug for IoLatency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoLatency")
            .field("no_throttle_split", &self.no_throttle_split)
            .finish_non_exhaustive()
    }
}

impl IoLatency {
    /// Checks BTF and capabilities, loads the program and attaches its three hooks.
    pub fn load() -> Result<IoLatency, Unavailable> {
        crate::bpf::prepare().map_err(|e| match e {
            NotLoadable::NoBtf => Unavailable::NoBtf,
            NotLoadable::NoCapability { missing, have } => {
                Unavailable::NoCapability { missing, have }
            }
        })?;
        // First with the submission hook (fentry), which measures the throttle's wait; a
        // kernel that refuses it still gets the two tracepoints.
        let first = match Self::load_with(Some(SUBMIT_TARGETS[0])) {
            Ok(loaded) => return Ok(loaded),
            Err(e) => e,
        };
        tracing::debug!("iolat: no hook on {}: {first}", SUBMIT_TARGETS[0]);
        match Self::load_with(Some(SUBMIT_TARGETS[1])) {
            Ok(loaded) => Ok(loaded),
            Err(first) => {
                let mut loaded = Self::load_with(None).map_err(|e| match e {
                    Unavailable::Refused { step, source, log } => Unavailable::Refused {
                        step,
                        source,
                        log: format!("{log}; with the submission hook first: {first}"),
                    },
                    other => other,
                })?;
                loaded.no_throttle_split = Some(first.to_string());
                Ok(loaded)
            }
        }
    }

    /// Loads the tracepoints, and the submission hook on `submit_target` when given.
    fn load_with(submit_target: Option<&str>) -> Result<IoLatency, Unavailable> {
        let submit_hook = submit_target.is_some();
        take_log();
        let refused = |step, source| Unavailable::Refused {
            step,
            source,
            log: take_log(),
        };
        let mut open = ObjectBuilder::default()
            .open_memory(OBJECT)
            .map_err(|e| refused("opening the object", e))?;
        for mut prog in open.progs_mut() {
            if prog.name() == SUBMIT_HOOK {
                prog.set_autoload(submit_hook);
                if let Some(target) = submit_target {
                    prog.set_attach_target(0, Some(target.to_owned()))
                        .map_err(|e| refused("choosing the submission hook's function", e))?;
                }
            }
        }
        // `const volatile bool submit_hook` in its own section (iolat.bpf.c).
        for mut map in open.maps_mut() {
            if map.name().to_string_lossy().ends_with(".rodata.hook") {
                if let Some(value) = map.initial_value_mut() {
                    value[0] = u8::from(submit_hook);
                }
            }
        }
        let object = open
            .load()
            .map_err(|e| refused("loading and verifying", e))?;
        let mut links = Vec::new();
        for prog in object.progs_mut() {
            if prog.name() == SUBMIT_HOOK && !submit_hook {
                continue;
            }
            links.push(prog.attach().map_err(|e| refused("attaching", e))?);
        }
        Ok(IoLatency {
            _links: links,
            object,
            no_throttle_split: None,
        })
    }

    /// Why the throttle's wait is not measured (the kernel refused the submission hook), or
    /// `None` when it is. Without it latency counts from the block layer's queue.
    pub fn no_throttle_split(&self) -> Option<&str> {
        self.no_throttle_split.as_deref()
    }

    /// Asks the kernel to time every run of its BPF programs (BPF_ENABLE_STATS: on while the
    /// returned descriptor is open, for every program on the host; a few tens of ns per run).
    pub fn enable_run_stats() -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall wrapper; a non-negative result is a new descriptor we own.
        let fd = unsafe {
            libbpf_rs::libbpf_sys::bpf_enable_stats(libbpf_rs::libbpf_sys::BPF_STATS_RUN_TIME)
        };
        if fd < 0 {
            return Err(std::io::Error::from_raw_os_error(-fd));
        }
        // SAFETY: fd is a fresh descriptor returned by the kernel.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// Per loaded program: (name, runs, total run time in ns), as the kernel counted them
    /// while run statistics were enabled.
    pub fn run_stats(&self) -> Vec<(String, u64, u64)> {
        use std::os::fd::AsRawFd;
        let mut out = Vec::new();
        for prog in self.object.progs() {
            if !prog.autoload() {
                continue;
            }
            let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
            let mut len = std::mem::size_of_val(&info) as u32;
            // SAFETY: info is a properly sized, zeroed bpf_prog_info and len says its size.
            let rc = unsafe {
                libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                    std::os::fd::AsFd::as_fd(&prog).as_raw_fd(),
                    &mut info,
                    &mut len,
                )
            };
            if rc == 0 {
                out.push((
                    prog.name().to_string_lossy().into_owned(),
                    info.run_cnt,
                    info.run_time_ns,
                ));
            }
        }
        out
    }

    fn map(&self, name: &str) -> Option<libbpf_rs::Map<'_>> {
        self.object.maps().find(|m| m.name() == name)
    }

    /// Everything counted since the program was loaded.
    pub fn read(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        // `slots` names each (cgroup, disk, op) seen and its index in the `hists` array.
        if let (Some(slots), Some(hists)) = (self.map("slots"), self.map("hists")) {
            for key in slots.keys() {
                let Some(key_parsed) = parse_key(&key) else {
                    continue;
                };
                let Ok(Some(slot)) = slots.lookup(&key, MapFlags::ANY) else {
                    continue;
                };
                let Ok(Some(value)) = hists.lookup(&slot, MapFlags::ANY) else {
                    continue;
                };
                let Some(mut stages) = parse_stages(&value) else {
                    continue;
                };
                if self.no_throttle_split.is_some() {
                    // The program records only the total then (see iolat.bpf.c).
                    stages.service = stages.total.clone();
                }
                snap.entries.insert(key_parsed, stages);
            }
        }
        if let Some(map) = self.map("counters") {
            let at = |i: u32| {
                map.lookup(&i.to_ne_bytes(), MapFlags::ANY)
                    .ok()
                    .flatten()
                    .and_then(|v| u64_at(&v, 0))
                    .unwrap_or(0)
            };
            snap.unmatched = at(CNT_UNMATCHED);
            snap.dropped = at(CNT_DROPPED);
            snap.raced = at(CNT_RACED);
        }
        snap
    }
}

fn u64_at(b: &[u8], i: usize) -> Option<u64> {
    b.get(i * 8..i * 8 + 8)
        .map(|s| u64::from_ne_bytes(s.try_into().expect("8 bytes")))
}

/// `struct hist_key { u64 cgroup_id; u32 dev; u32 op; }`
fn parse_key(b: &[u8]) -> Option<Key> {
    if b.len() != 16 {
        return None;
    }
    let word = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    Some(Key {
        cgroup_id: u64_at(b, 0)?,
        dev: Dev::from_kernel(word(8)),
        op: Op::from_raw(word(12))?,
    })
}

/// `struct hist { u64 fine[SLOTS * SUB]; u64 slot_ns[SLOTS]; u64 count; u64 sum_ns; }`
const HIST_WORDS: usize = FINE + SLOTS + 2;

fn parse_hist(b: &[u8], first: usize) -> Option<Hist> {
    let mut fine = [0u64; FINE];
    for (i, f) in fine.iter_mut().enumerate() {
        *f = u64_at(b, first + i)?;
    }
    let mut h = Hist::from_fine(fine);
    for i in 0..SLOTS {
        h.slot_ns[i] = u64_at(b, first + FINE + i)?;
    }
    h.count = u64_at(b, first + FINE + SLOTS)?;
    h.sum_ns = u64_at(b, first + FINE + SLOTS + 1)?;
    Some(h)
}

/// `struct hist_val { struct hist total, queued, service; }`
fn parse_stages(b: &[u8]) -> Option<Stages> {
    if b.len() != 3 * HIST_WORDS * 8 {
        return None;
    }
    Some(Stages {
        total: parse_hist(b, 0)?,
        throttled: parse_hist(b, HIST_WORDS)?,
        service: parse_hist(b, 2 * HIST_WORDS)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_entries_parse_as_the_program_lays_them_out() {
        let mut key = Vec::new();
        key.extend_from_slice(&4242u64.to_ne_bytes());
        key.extend_from_slice(&((7u32 << 20) | 3).to_ne_bytes());
        key.extend_from_slice(&1u32.to_ne_bytes());
        let k = parse_key(&key).unwrap();
        assert_eq!(k.cgroup_id, 4242);
        assert_eq!(k.dev, Dev { major: 7, minor: 3 });
        assert_eq!(k.op, Op::Write);

        let mut val = vec![0u8; 3 * HIST_WORDS * 8];
        let mut put =
            |word: usize, v: u64| val[word * 8..word * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        put(5 * 8 + 3, 10); // total.fine[slot 5, part 3]
        put(FINE + 5, 400_000); // total.slot_ns[5]
        put(FINE + SLOTS, 10); // total.count
        put(HIST_WORDS + FINE + SLOTS + 1, 99); // throttled.sum_ns
        put(2 * HIST_WORDS + FINE - 1, 1); // service.fine[last]
        let s = parse_stages(&val).unwrap();
        assert_eq!(s.total.slots[5], 10);
        assert_eq!(s.total.fine[43], 10);
        assert_eq!(s.total.slot_ns[5], 400_000);
        assert_eq!(s.total.count, 10);
        assert_eq!(s.throttled.sum_ns, 99);
        assert_eq!(s.service.slots[23], 1);
        assert!(parse_stages(&val[1..]).is_none());
    }
}
