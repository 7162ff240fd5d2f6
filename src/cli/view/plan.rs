//! `dbcage plan` and `dbcage apply` as text.

use anyhow::Result;

use crate::engine::{self, Prepared};
use crate::plan::{Plan, Step};
use crate::units::{count, HumanBytes};

pub fn print_plan(
    out: &mut impl std::io::Write,
    ctx: &Prepared,
    plan: &Plan,
    warn: &mut dyn std::io::Write,
) -> Result<()> {
    writeln!(out, "cgroup controllers: {}", ctx.layout.setup.describe())?;
    let device_name = |dev: &crate::kernel::DevNum| {
        ctx.inventory
            .tenants
            .iter()
            .flat_map(|t| &t.devices)
            .find(|d| d.devnum == *dev)
            .map(|d| format!("{} ({dev})", d.name))
            .unwrap_or_else(|| dev.to_string())
    };
    for t in &plan.tenants {
        writeln!(
            out,
            "tenant {}: {}",
            t.name,
            count(t.processes, "process", "processes")
        )?;
        for (dev, l) in &t.settings.io {
            let mut parts = Vec::new();
            if let Some(v) = l.read_bps {
                parts.push(format!("read {}/s", HumanBytes(v)));
            }
            if let Some(v) = l.write_bps {
                parts.push(format!("write {}/s", HumanBytes(v)));
            }
            if let Some(v) = l.read_iops {
                parts.push(format!("read {v} IOPS"));
            }
            if let Some(v) = l.write_iops {
                parts.push(format!("write {v} IOPS"));
            }
            writeln!(out, "  io {}: {}", device_name(dev), parts.join(", "))?;
        }
        if let Some(line) = units_line(&ctx.loaded.policy, t) {
            writeln!(out, "  {line}")?;
        }
        if let Some(c) = t.settings.cpu_cores {
            writeln!(
                out,
                "  cpu quota: {c} {}",
                if c == 1.0 { "core" } else { "cores" }
            )?;
        }
        if let Some(c) = plan.numa.iter().find(|c| c.tenant == t.name) {
            writeln!(out, "  numa = auto: nodes {} ({})", c.nodes, c.reason)?;
        }
        if let Some(m) = plan.memory_moves.iter().find(|m| m.tenant == t.name) {
            writeln!(out, "  {}", memory_move_line(m))?;
        }
        writeln!(
            out,
            "  cpus {} mems {} weight {}",
            t.settings.cpus, t.settings.mems, t.settings.cpu_weight
        )?;
        let memory: Vec<String> = [
            ("max", t.settings.memory_max),
            ("high", t.settings.memory_high),
            ("low", t.settings.memory_low),
            ("swap_max", t.settings.memory_swap_max),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} {}", HumanBytes(v))))
        .collect();
        if !memory.is_empty() {
            writeln!(out, "  memory {}", memory.join(", "))?;
        }
    }
    if plan.is_empty() {
        writeln!(
            out,
            "no changes: every group, limit and process is already in place"
        )?;
    } else {
        writeln!(out, "{}:", count(plan.steps.len(), "step", "steps"))?;
    }
    for s in &plan.steps {
        match s {
            Step::Mkdir { path, reason } => {
                writeln!(out, "  mkdir {}    # {reason}", path.display())?
            }
            Step::Write {
                path,
                value,
                current,
                reason,
            } => writeln!(
                out,
                "  write {} = {:?} (now {})    # {reason}",
                path.display(),
                value,
                current
                    .as_deref()
                    .map(|c| format!("{:?}", c.replace('\n', "; ")))
                    .unwrap_or_else(|| "absent".into())
            )?,
            Step::SetUnitProperties {
                unit,
                set,
                was,
                reason,
                ..
            } => {
                for (s, w) in set.iter().zip(was) {
                    writeln!(out, "  set-property {unit} {s} (now {w})    # {reason}")?;
                }
            }
            Step::Adopt {
                tenant,
                pids,
                leaf,
                reason,
                ..
            } => writeln!(
                out,
                "  adopt pids {pids:?} into {}{} (dbcage.slice)    # {reason}",
                crate::systemd::scope_name(tenant),
                leaf.map_or(String::new(), |l| format!("/{}", l.dir()))
            )?,
            Step::Move {
                pid,
                comm,
                tenant,
                leaf,
                targets,
                leave,
                reason,
            } => {
                let into = (!targets.is_empty()).then(|| {
                    format!(
                        "to {tenant}/{} in {}",
                        leaf.dir(),
                        count(targets.len(), "hierarchy", "hierarchies")
                    )
                });
                // the hierarchies its tenant has no group in (see `Step::Move::leave`)
                let out_of = (!leave.is_empty()).then(|| {
                    format!(
                        "back to dbcage's parent in {} ({tenant} has no group there)",
                        count(leave.len(), "hierarchy", "hierarchies")
                    )
                });
                let what: Vec<String> = into.into_iter().chain(out_of).collect();
                writeln!(
                    out,
                    "  move pid {pid} ({comm}) {}    # {reason}",
                    what.join(", ")
                )?
            }
            Step::Remove { path, to, reason } => writeln!(
                out,
                "  remove {} (its processes to {})    # {reason}",
                path.display(),
                to.display()
            )?,
        }
    }
    print_warnings(warn, plan)?;
    Ok(())
}

/// A running tenant's change of memory nodes: what moves, and whether now.
fn memory_move_line(m: &crate::plan::MemoryMove) -> String {
    let bytes = m
        .bytes
        .map_or("an unknown amount".into(), |b| HumanBytes(b).to_string());
    if m.migrate {
        format!(
            "memory moves from nodes {} to {}: {bytes} of the pages of its {}",
            m.from,
            m.to,
            count(m.pids.len(), "process", "processes")
        )
    } else {
        format!(
            "memory nodes stay {} (policy: {}) until the instance restarts: {bytes} would move (--migrate-memory moves it now)",
            m.from, m.to
        )
    }
}

/// The plan's warnings, to `warn` (stderr): the cgroup v1 write-limit caveat only when the plan
/// writes something, in one line (`check` gives it in full).
pub fn print_warnings(warn: &mut dyn std::io::Write, plan: &Plan) -> Result<()> {
    for w in &plan.warnings {
        writeln!(warn, "warning: {w}")?;
    }
    if !plan.is_empty() && !plan.buffered_writes_pass.is_empty() {
        writeln!(
            warn,
            "note: on cgroup v1 the write limits of {} bind only O_DIRECT and fsync'd writes (`dbcage check` explains)",
            plan.buffered_writes_pass.join(", ")
        )?;
    }
    Ok(())
}

/// What `apply` did: the plan's warnings, the counts, the errors.
pub fn print_apply(
    out: &mut impl std::io::Write,
    plan: &Plan,
    outcome: &engine::Outcome,
    warn: &mut dyn std::io::Write,
) -> Result<()> {
    print_warnings(warn, plan)?;
    if plan.is_empty() {
        writeln!(
            out,
            "nothing to do: every group, limit and process is already in place"
        )?;
    } else {
        writeln!(
            out,
            "applied: {} created, {} written, {} moved{}",
            count(outcome.created, "group", "groups"),
            count(outcome.written, "value", "values"),
            count(outcome.moved, "process", "processes"),
            if outcome.vanished > 0 {
                format!(", {} exited before their move", outcome.vanished)
            } else {
                String::new()
            }
        )?;
    }
    for m in plan.memory_moves.iter().filter(|m| m.migrate) {
        writeln!(out, "tenant {}: {}", m.tenant, memory_move_line(m))?;
    }
    for r in &outcome.recovered {
        writeln!(out, "recovered: {r}")?;
    }
    for e in &outcome.errors {
        writeln!(out, "error: {e}")?;
    }
    if outcome.skipped > 0 {
        writeln!(
            out,
            "error: the plan's other {} steps were not attempted: without the controllers enabled there are no limit files to write, and moved processes would run unlimited",
            outcome.skipped
        )?;
    }
    Ok(())
}

/// The systemd units a tenant is governed in (under systemd) and the units its rules name
/// (`unit =`), for `plan` and `check`: `systemd units: postgresql@15-main.service (policy:
/// unit = postgresql@*.service)`. `None` when there are neither.
pub fn units_line(
    policy: &crate::policy::Policy,
    t: &crate::plan::TenantSummary,
) -> Option<String> {
    let named: Vec<&str> = policy
        .tenants
        .iter()
        .find(|p| p.name == t.name)
        .into_iter()
        .flat_map(|p| p.rules.iter().chain(&p.exempt))
        .filter_map(|r| Some(r.unit.as_ref()?.as_str()))
        .collect();
    let governed: Vec<&str> = t
        .units
        .iter()
        .map(|g| crate::systemd::unit_of_cgroup_path(g).unwrap_or(g))
        .collect();
    if named.is_empty() && governed.is_empty() {
        return None;
    }
    let mut line = format!(
        "systemd units: {}",
        if governed.is_empty() {
            "none governed now".to_string()
        } else {
            governed.join(", ")
        }
    );
    if !named.is_empty() {
        line.push_str(&format!(" (policy: unit = {})", named.join(", ")));
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_snapshot::assert_snapshot;

    fn run(plan: &Plan) -> String {
        let outcome = engine::Outcome {
            created: plan.steps.len(),
            ..engine::Outcome::default()
        };
        let (mut out, mut warn) = (Vec::new(), Vec::new());
        print_apply(&mut out, plan, &outcome, &mut warn).unwrap();
        format!(
            "--- stdout\n{}--- stderr\n{}",
            String::from_utf8(out).unwrap(),
            String::from_utf8(warn).unwrap()
        )
    }

    /// `apply` on v1 with write limits: warnings on stderr; the write-limit caveat one line long
    /// when something is written, absent on a no-op (issue 21).
    #[test]
    fn apply_warnings_go_to_stderr_and_the_v1_caveat_is_brief() {
        let mut plan = Plan {
            warnings: vec!["tenant `BX1`: on cgroup v1 memory.high becomes memory.soft_limit_in_bytes, which only guides reclaim under host-wide memory pressure".into()],
            buffered_writes_pass: vec!["BX1".into()],
            ..Plan::default()
        };
        let noop = run(&plan);
        plan.steps.push(crate::plan::Step::Mkdir {
            path: "/sys/fs/cgroup/blkio/dbcage/BX1".into(),
            reason: "tenant BX1".into(),
        });
        let one = run(&plan);
        assert_snapshot(
            "apply-warnings",
            &format!("{noop}=== a plan that writes\n{one}"),
        );
    }
}
