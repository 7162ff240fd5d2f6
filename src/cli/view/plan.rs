//! `dbcage plan` and `dbcage apply` as text.

use anyhow::Result;

use crate::engine::{self, Prepared};
use crate::plan::{Plan, Step};
use crate::units::HumanBytes;

pub fn print_plan(out: &mut impl std::io::Write, ctx: &Prepared, plan: &Plan) -> Result<()> {
    writeln!(out, "cgroup controllers: {}", ctx.layout.setup.describe())?;
    for t in &plan.tenants {
        writeln!(out, "tenant {}: {} processes", t.name, t.processes)?;
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
            writeln!(out, "  io {dev}: {}", parts.join(", "))?;
        }
        if let Some(c) = t.settings.cpu_cores {
            writeln!(out, "  cpu quota: {c} cores")?;
        }
        writeln!(
            out,
            "  cpus {} mems {} weight {}",
            t.settings.cpus, t.settings.mems, t.settings.cpu_weight
        )?;
        if let Some(m) = t.settings.memory_max {
            writeln!(out, "  memory max {}", HumanBytes(m))?;
        }
    }
    if plan.is_empty() {
        writeln!(
            out,
            "no changes: every group, limit and process is already in place"
        )?;
    } else {
        writeln!(out, "steps ({}):", plan.steps.len())?;
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
            Step::Move {
                pid,
                comm,
                tenant,
                leaf,
                targets,
                reason,
            } => writeln!(
                out,
                "  move pid {pid} ({comm}) to {tenant}/{} in {} hierarchies    # {reason}",
                leaf.dir(),
                targets.len()
            )?,
        }
    }
    for w in &plan.warnings {
        writeln!(out, "warning: {w}")?;
    }
    Ok(())
}

/// What `apply` did: the plan's warnings, the counts, the errors.
pub fn print_apply(
    out: &mut impl std::io::Write,
    plan: &Plan,
    outcome: &engine::Outcome,
) -> Result<()> {
    for w in &plan.warnings {
        writeln!(out, "warning: {w}")?;
    }
    if plan.is_empty() {
        writeln!(
            out,
            "nothing to do: every group, limit and process is already in place"
        )?;
    } else {
        writeln!(
            out,
            "applied: {} groups created, {} values written, {} processes moved{}",
            outcome.created,
            outcome.written,
            outcome.moved,
            if outcome.vanished > 0 {
                format!(", {} exited before their move", outcome.vanished)
            } else {
                String::new()
            }
        )?;
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
