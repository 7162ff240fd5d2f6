//! `dbcage status` as a table.

use anyhow::Result;

use super::daemon::DaemonState;
use crate::control::OverrideInfo;
use crate::status;
use crate::units::HumanBytes;

fn mib(bytes_per_s: f64) -> String {
    format!("{:.1}", bytes_per_s / 1048576.0)
}

/// `rate/limit (share%)`, or the rate alone without a limit.
fn against(rate: Option<f64>, limit: Option<f64>, fmt: fn(f64) -> String) -> String {
    match (rate, limit) {
        (Some(r), Some(l)) if l > 0.0 => format!("{}/{} ({:.0}%)", fmt(r), fmt(l), 100.0 * r / l),
        (Some(r), _) => fmt(r),
        (None, Some(l)) => format!("-/{}", fmt(l)),
        (None, None) => "-".into(),
    }
}

pub fn print_status_table(
    out: &mut impl std::io::Write,
    rows: &[status::TenantStatus],
    devices: bool,
) -> Result<()> {
    writeln!(
        out,
        "{:<12} {:>5}  {:<20} {:<20} {:<14} {:<14} {:<16} {:<20} NOTES",
        "TENANT",
        "PROCS",
        "READ MiB/s",
        "WRITE MiB/s",
        "READ IOPS",
        "WRITE IOPS",
        "CPU cores",
        "MEM charged MiB",
    )?;
    let f0 = |v: f64| format!("{v:.0}");
    let f2 = |v: f64| format!("{v:.2}");
    for r in rows {
        let rates = r.io.rates;
        let lim = |v: Option<u64>| v.map(|v| v as f64);
        let mut notes = Vec::new();
        if !r.units.is_empty() {
            // Under systemd: the units it is governed in, by name (`systemctl status NAME`).
            let names: Vec<&str> = r
                .units
                .iter()
                .map(|g| g.rsplit('/').next().unwrap_or(g))
                .collect();
            notes.push(format!("in {}", names.join(", ")));
        }
        if !r.not_limited.is_empty() {
            notes.push(format!(
                "NOT LIMITED, no controller ({})",
                r.not_limited.join("; ")
            ));
        }
        if !r.at_limit.is_empty() {
            notes.push(format!("AT LIMIT {}", r.at_limit.join(",")));
        }
        if let Some(t) = r.cpu_throttled_share.filter(|t| *t > 0.0) {
            notes.push(format!("cpu throttled {:.0}%", t * 100.0));
        }
        if let Some(k) = r.memory.oom_kills.filter(|k| *k > 0) {
            notes.push(crate::units::count(k as usize, "OOM kill", "OOM kills"));
        }
        if crate::status::charged_below_resident(r) {
            notes.push(format!(
                "memory: {} MiB resident, {} MiB charged (memory held before the move is charged elsewhere; memory.max binds only new allocations)",
                r.memory_resident_bytes.unwrap_or(0) >> 20,
                r.memory.current_bytes.unwrap_or(0) >> 20
            ));
        }
        // Only what differs from the kernel's defaults (weight 100, no target).
        if let Some(w) = r.io_weight.filter(|w| *w != 100) {
            notes.push(format!("io weight {w}"));
        }
        if !r.io_latency_target_us.is_empty() {
            let targets: Vec<String> = r
                .io_latency_target_us
                .iter()
                .map(|(d, us)| match us % 1000 {
                    0 => format!("{d} {}ms", us / 1000),
                    _ => format!("{d} {us}us"),
                })
                .collect();
            notes.push(format!("io latency target {}", targets.join(", ")));
        }
        if let Some(l) = r.numa_local_share {
            notes.push(format!("numa local {:.1}%", l * 100.0));
        }
        if let Some(p) = &r.pressure {
            let psi: Vec<String> = [("io", p.io), ("cpu", p.cpu), ("mem", p.memory)]
                .iter()
                .filter_map(|(n, v)| {
                    v.filter(|v| v.some_avg10 > 0.0)
                        .map(|v| match v.full_avg10 {
                            // some/full: the share of the last 10 s some (all) of its tasks stalled
                            Some(full) => format!("{n} {:.0}%/{full:.0}%", v.some_avg10),
                            None => format!("{n} {:.0}%", v.some_avg10),
                        })
                })
                .collect();
            if !psi.is_empty() {
                notes.push(format!("psi {}", psi.join(" ")));
            }
        }
        if let Some(g) = &r.replication {
            notes.push(replication_note(g));
        }
        for g in r.protection.iter().chain(&r.cpu_protection) {
            notes.push(protection_note(g));
        }
        writeln!(
            out,
            "{:<12} {:>5}  {:<20} {:<20} {:<14} {:<14} {:<16} {:<20} {}",
            r.name,
            r.processes,
            against(
                rates.map(|x| x.read_bytes_per_second),
                lim(r.io.limits.read_bps),
                mib
            ),
            against(
                rates.map(|x| x.write_bytes_per_second),
                lim(r.io.limits.write_bps),
                mib
            ),
            against(rates.map(|x| x.read_iops), lim(r.io.limits.read_iops), f0),
            against(rates.map(|x| x.write_iops), lim(r.io.limits.write_iops), f0),
            against(r.cpu_cores_used, r.cpu_quota_cores, f2),
            against(
                r.memory.current_bytes.map(|b| b as f64),
                r.memory_limit_bytes.map(|b| b as f64),
                |b| format!("{:.0}", b / 1048576.0)
            ),
            notes.join("; ")
        )?;
        if devices {
            for d in &r.devices {
                let dr = d.rates;
                writeln!(
                    out,
                    "  {:<10} {:>5}  {:<20} {:<20} {:<14} {:<14} total read {} ({} IOs), write {} ({} IOs)",
                    d.name,
                    d.device,
                    against(dr.map(|x| x.read_bytes_per_second), lim(d.read_bps_limit), mib),
                    against(dr.map(|x| x.write_bytes_per_second), lim(d.write_bps_limit), mib),
                    against(dr.map(|x| x.read_iops), lim(d.read_iops_limit), f0),
                    against(dr.map(|x| x.write_iops), lim(d.write_iops_limit), f0),
                    HumanBytes(d.usage.read_bytes),
                    d.usage.read_ios,
                    HumanBytes(d.usage.write_bytes),
                    d.usage.write_ios,
                )?;
                if let Some(b) = &d.balance {
                    let parts: Vec<String> = b
                        .iter()
                        .map(|(k, v)| {
                            format!(
                                "{k} {:.1}% ({})",
                                v.share * 100.0,
                                match v.reason {
                                    crate::balance::Reason::Demand => "demand",
                                    crate::balance::Reason::Floor => "floor",
                                }
                            )
                        })
                        .collect();
                    writeln!(out, "  {:<10} share of the total: {}", "", parts.join(", "))?;
                }
            }
        }
        for m in &r.members {
            writeln!(
                out,
                "  {:<7} {:>7} {:<16} {}    # {}",
                m.leaf.dir(),
                m.pid,
                m.comm,
                m.cmdline,
                m.rule
            )?;
        }
    }
    Ok(())
}

/// The protection guard's state in one `status` note: `protecting: batch io.weight 25 (step 2
/// of 3), 2 lowerings 0 restores` (a cpu guard's: `cpu protection armed, ...`, `protecting:
/// batch cpu.weight 50 ...`).
pub fn protection_note(g: &crate::protect::GuardState) -> String {
    let cpu = g.resource == crate::policy::Resource::Cpu;
    let now = if !g.armed {
        let what = if cpu { "cpu protection" } else { "protection" };
        format!("{what} guard not armed (see the daemon's log)")
    } else if g.lowered.is_empty() && g.capped.is_empty() {
        match (cpu, g.lever) {
            (true, _) => "cpu protection armed, donors at their cpu.weight",
            (false, crate::policy::GuardLever::Weight) => {
                "protection armed, donors at their weight"
            }
            (false, crate::policy::GuardLever::Caps) => "protection armed, donors at their caps",
        }
        .to_string()
    } else {
        let weight = if cpu { "cpu.weight" } else { "io.weight" };
        let donors: Vec<String> = g
            .lowered
            .iter()
            .map(|(d, w)| format!("{d} {weight} {w}"))
            .chain(g.capped.iter().map(|(d, c)| format!("{d} io caps {c}")))
            .collect();
        format!(
            "protecting: {} (step {} of {})",
            donors.join(", "),
            g.step,
            crate::protect::MAX_STEPS
        )
    };
    format!("{now}, {} lowerings {} restores", g.lowerings, g.restores)
}

/// The replication guard's state in one `status` note: `replication lag 12.0 MiB 1.5 s` plus
/// `BEHIND` past the threshold and the raised write limits while they hold.
pub fn replication_note(g: &crate::replication::GuardStatus) -> String {
    let mut s = format!(
        "replication lag {:.1} MiB {:.1} s",
        g.lag_bytes as f64 / 1048576.0,
        g.lag_seconds
    );
    if g.behind {
        s.push_str(" BEHIND");
    }
    if let Some(b) = g.raised_write_bps {
        s.push_str(&format!(
            ", write_bps raised to {:.0} MiB/s",
            b as f64 / 1048576.0
        ));
    }
    if let Some(i) = g.raised_write_iops {
        s.push_str(&format!(", write_iops raised to {i}"));
    }
    s
}

pub const V1_WRITE_NOTE: &str = "cgroup v1 write limits bind only O_DIRECT and fsync'd writes; buffered writes without fsync are not charged to the writer and pass the limit";

/// Everything `status` prints as text.
pub struct StatusText<'a> {
    pub controllers: &'a str,
    pub daemon: &'a DaemonState,
    pub tenants: &'a [status::TenantStatus],
    /// Break IO down per device.
    pub devices: bool,
    pub overrides: &'a [OverrideInfo],
    /// Tell that v1 write limits pass buffered writes.
    pub write_note: bool,
}

pub fn print_status(out: &mut impl std::io::Write, s: &StatusText) -> Result<()> {
    writeln!(out, "cgroup controllers: {}", s.controllers)?;
    writeln!(out, "daemon: {}", s.daemon)?;
    print_status_table(out, s.tenants, s.devices)?;
    if let Some(why) = pressure_unavailable(s.tenants) {
        writeln!(
            out,
            "pressure: not available per tenant on this host: {why}"
        )?;
    }
    if !s.overrides.is_empty() {
        writeln!(
            out,
            "overrides in force (not from the tenant tables of the policy):"
        )?;
        for o in s.overrides {
            writeln!(
                out,
                "  {:<12} {:<16} {:<12} {}{}",
                o.tenant,
                o.key,
                o.value,
                o.source,
                if o.detail.is_empty() {
                    String::new()
                } else {
                    format!(" {}", o.detail)
                }
            )?;
        }
    }
    if s.write_note {
        writeln!(out, "note: {V1_WRITE_NOTE}")?;
    }
    Ok(())
}

/// Why no tenant has pressure stall information, when none has: the NOTES column then never
/// shows `psi`, and saying so beats a silent blank.
pub fn pressure_unavailable(rows: &[status::TenantStatus]) -> Option<&'static str> {
    let none = |p: &crate::cgroup::stats::PressureSet| {
        p.io.is_none() && p.cpu.is_none() && p.memory.is_none()
    };
    if rows.is_empty()
        || rows
            .iter()
            .any(|r| r.pressure.as_ref().is_some_and(|p| !none(p)))
    {
        return None;
    }
    Some(if rows.iter().all(|r| r.pressure.is_none()) {
        "cgroup v1 keeps pressure stall information per host only (/proc/pressure); cgroup v2 has it per group"
    } else {
        "the kernel's PSI is off (no io.pressure, cpu.pressure, memory.pressure in the tenants' groups): boot with psi=1"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_snapshot::assert_snapshot;

    #[test]
    fn protection_note_says_what_the_guard_holds() {
        let mut g = crate::protect::GuardState {
            armed: true,
            step: 2,
            lowered: [("batch".to_string(), 25)].into(),
            lowerings: 2,
            restores: 0,
            ..Default::default()
        };
        assert_eq!(
            protection_note(&g),
            "protecting: batch io.weight 25 (step 2 of 3), 2 lowerings 0 restores"
        );
        g.step = 0;
        g.lowered.clear();
        g.restores = 1;
        assert_eq!(
            protection_note(&g),
            "protection armed, donors at their weight, 2 lowerings 1 restores"
        );
        g.lever = crate::policy::GuardLever::Caps;
        g.step = 1;
        g.capped = [("batch".to_string(), "read_iops 1000".to_string())].into();
        assert_eq!(
            protection_note(&g),
            "protecting: batch io caps read_iops 1000 (step 1 of 3), 2 lowerings 1 restores"
        );
        g.armed = false;
        assert!(protection_note(&g).starts_with("protection guard not armed"));
        let mut c = crate::protect::GuardState {
            resource: crate::policy::Resource::Cpu,
            armed: true,
            step: 1,
            lowered: [("batch".to_string(), 50)].into(),
            lowerings: 1,
            ..Default::default()
        };
        assert_eq!(
            protection_note(&c),
            "protecting: batch cpu.weight 50 (step 1 of 3), 1 lowerings 0 restores"
        );
        c.step = 0;
        c.lowered.clear();
        c.restores = 1;
        assert_eq!(
            protection_note(&c),
            "cpu protection armed, donors at their cpu.weight, 1 lowerings 1 restores"
        );
        c.armed = false;
        assert!(protection_note(&c).starts_with("cpu protection guard not armed"));
    }

    /// No tenant with pressure: the reason is v1 (no per-group PSI) or PSI off (v2, no files).
    #[test]
    fn pressure_unavailable_says_why() {
        use crate::cgroup::stats::{Pressure, PressureSet};
        let mut t = crate::status::tests::tenant(0, 10.0);
        t.pressure = None;
        let why = pressure_unavailable(std::slice::from_ref(&t)).unwrap();
        assert!(why.contains("cgroup v1"), "{why}");
        t.pressure = Some(PressureSet::default());
        let why = pressure_unavailable(std::slice::from_ref(&t)).unwrap();
        assert!(why.contains("PSI is off") && why.contains("psi=1"), "{why}");
        t.pressure = Some(PressureSet {
            io: Some(Pressure {
                some_avg10: 12.0,
                full_avg10: Some(3.0),
                ..Pressure::default()
            }),
            ..PressureSet::default()
        });
        assert_eq!(pressure_unavailable(std::slice::from_ref(&t)), None);
        let mut out = Vec::new();
        print_status_table(&mut out, &[t], false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("psi io 12%/3%"), "{text}");
    }

    /// An instance moved in while running: 213 MiB resident, nothing charged to the tenant
    /// (issue 21): the table says both, and why.
    #[test]
    fn memory_charged_and_resident() {
        let mut moved = crate::status::tests::tenant(0, 10.0);
        moved.name = "pg15".into();
        moved.processes = 9;
        moved.memory.current_bytes = Some(0);
        moved.memory_limit_bytes = Some(2048 << 20);
        moved.memory_resident_bytes = Some(213 << 20);
        moved.memory.oom_kills = Some(1);
        let mut started = crate::status::tests::tenant(0, 10.0);
        started.memory.current_bytes = Some(200 << 20);
        started.memory_limit_bytes = Some(2048 << 20);
        started.memory_resident_bytes = Some(190 << 20);
        let mut out = Vec::new();
        print_status_table(&mut out, &[moved, started], false).unwrap();
        assert_snapshot("status-memory", &String::from_utf8(out).unwrap());
    }

    /// `status -v`: the pid column lines up whichever leaf a process is in.
    #[test]
    fn members_line_up_across_leaves() {
        use crate::classify::Leaf;
        let mut t = crate::status::tests::tenant(0, 10.0);
        for (pid, comm, leaf, rule) in [
            (
                4711,
                "ora_pmon_BX1",
                Leaf::Limited,
                "match[0] background: cmdline=~^ora_[a-z0-9]+_BX1( |$)",
            ),
            (
                4712,
                "ora_lgwr_BX1",
                Leaf::Exempt,
                "exempt[0] log_writers: cmdline=~^ora_lg[a-z0-9]{2}_BX1( |$)",
            ),
        ] {
            t.members.push(crate::status::Member {
                pid,
                comm: comm.into(),
                cmdline: comm.into(),
                leaf,
                rule: rule.into(),
            });
        }
        let mut out = Vec::new();
        print_status_table(&mut out, &[t], false).unwrap();
        assert_snapshot("status-members", &String::from_utf8(out).unwrap());
    }
}
