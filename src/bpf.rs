//! What dbcage's eBPF programs share (the IO latency histograms of `iolat`, the task iterator of
//! `inventory::tasks`): libbpf's messages caught for the error a caller reports instead of
//! printed on stderr, and the checks of the kernel's BTF and of the capabilities loading needs.

use std::sync::Mutex;

use libbpf_rs::PrintLevel;

/// The kernel's own BTF, which CO-RE relocations and BTF-typed attachments resolve against.
pub const BTF: &str = "/sys/kernel/btf/vmlinux";
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Why no eBPF program can be loaded by this process, known before libbpf is asked.
#[derive(Debug, thiserror::Error)]
pub enum NotLoadable {
    #[error("the kernel has no BTF ({BTF} is missing)")]
    NoBtf,
    #[error("this process lacks {missing} (effective capabilities {have:#x})")]
    NoCapability { missing: String, have: u64 },
}

/// What every loader checks first: the kernel's BTF, and CAP_BPF with CAP_PERFMON (or
/// CAP_SYS_ADMIN). On success libbpf's messages go to `take_log` from then on (a process-wide
/// setting of libbpf's) instead of stderr.
pub fn prepare() -> Result<(), NotLoadable> {
    if !std::path::Path::new(BTF).exists() {
        return Err(NotLoadable::NoBtf);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(have) = effective_caps(&status) {
        if let Some(missing) = missing_caps(have) {
            return Err(NotLoadable::NoCapability { missing, have });
        }
    }
    libbpf_rs::set_print(Some((PrintLevel::Info, libbpf_print)));
    Ok(())
}

/// libbpf's own messages, kept so a refusal can say what libbpf saw.
static LIBBPF_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn libbpf_print(level: PrintLevel, msg: String) {
    let msg = msg.trim_end().to_string();
    tracing::debug!(target: "libbpf", "{msg}");
    // A verifier log is thousands of lines; its last ones say why (run with
    // DBCAGE_LOG=libbpf=debug for all of it).
    let msg = match msg.rsplit_once("-- END PROG LOAD LOG --") {
        Some((log, _)) => {
            let tail: Vec<&str> = log.trim_end().lines().rev().take(3).collect();
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        }
        None => msg,
    };
    if level != PrintLevel::Debug {
        if let Ok(mut log) = LIBBPF_LOG.lock() {
            log.push(msg);
            let excess = log.len().saturating_sub(8);
            log.drain(..excess);
        }
    }
}

/// What libbpf said since the last call (its last 8 messages above debug level), as
/// ` (libbpf: ...)` for an error message; empty when it said nothing.
pub fn take_log() -> String {
    let lines = LIBBPF_LOG
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    if lines.is_empty() {
        String::new()
    } else {
        format!(" (libbpf: {})", lines.join("; "))
    }
}

/// Effective capabilities from /proc/self/status (`CapEff`).
fn effective_caps(proc_status: &str) -> Option<u64> {
    proc_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// What is missing for loading, by the capability bits; `None` when loading may go ahead.
fn missing_caps(caps: u64) -> Option<String> {
    let has = |c: u32| caps & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        return None;
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| n)
        .collect();
    Some(missing.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_read_from_proc_status() {
        assert_eq!(
            effective_caps("Name:\tx\nCapEff:\t000001ffffffffff\n"),
            Some(0x1ff_ffff_ffff)
        );
        assert_eq!(missing_caps(0x1ff_ffff_ffff), None);
        assert_eq!(missing_caps(1 << CAP_SYS_ADMIN), None);
        assert_eq!(
            missing_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)),
            None,
            "CAP_BPF with CAP_PERFMON suffices without CAP_SYS_ADMIN"
        );
        assert_eq!(missing_caps(1 << CAP_BPF).as_deref(), Some("CAP_PERFMON"));
        assert_eq!(missing_caps(0).as_deref(), Some("CAP_BPF and CAP_PERFMON"));
    }
}
