//! The command line: parse, run, print the error chain once, exit with a documented code.
//!
//! Exit codes: 0 success; 1 a runtime failure (a kernel write failed, a file could not be read);
//! 2 the policy or the command line is invalid (nothing was changed).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::cgroup::{self, apply};
use crate::classify::{claims, Leaf};
use crate::engine::{self, Adjustments};
use crate::hostfs::HostFs;
use crate::inventory;
use crate::plan::{Plan, Step};
use crate::policy::{self, PolicyErrors};
use crate::status;
use crate::units::HumanBytes;

#[derive(Parser, Debug)]
#[command(
    name = "dbcage",
    version,
    about = "Resource governor for database instances sharing one Linux host"
)]
pub struct Cli {
    /// Policy file; drop-ins are read from conf.d/ beside it.
    #[arg(short, long, global = true, default_value = policy::DEFAULT_POLICY, env = "DBCAGE_CONFIG")]
    pub config: PathBuf,
    /// Read policy files that are not root's or that group or others may write (development
    /// only: whoever can write the policy controls what a root daemon does).
    #[arg(long, global = true)]
    pub allow_insecure_policy: bool,
    /// The daemon's control socket [default: /run/dbcage/<agent.root>.sock].
    #[arg(long, global = true, env = "DBCAGE_SOCKET")]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate the policy against this host and show warnings; changes nothing.
    Check,
    /// Show what `apply` would do: groups, control-file writes, process moves, with reasons.
    Plan {
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the kernel match the policy: create groups, write limits, move processes.
    Apply {
        /// Print the plan and the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show what each tenant uses: IO rates against its limits, CPU against its quota, memory
    /// against its limits, OOM events and pressure, measured over a short interval.
    Status {
        /// Only these tenants.
        tenants: Vec<String>,
        /// List processes with the rule that placed them.
        #[arg(short, long)]
        verbose: bool,
        /// Break IO down per device.
        #[arg(long)]
        devices: bool,
        /// Interval over which rates are measured; 0 prints counters only.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
        #[arg(long)]
        json: bool,
    },
    /// A full-screen view of every tenant's usage against its limits, refreshed every second.
    Top {
        /// Refresh interval.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
    },
    /// Run the daemon: apply, then place every process the moment it appears (kernel process
    /// events), with a periodic rescan as safety net. SIGHUP reloads; SIGTERM stops and leaves
    /// every limit in place.
    Run {
        /// Period of the full rescan (the safety net).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        rescan_interval: std::time::Duration,
        /// Rescan period when process events are unavailable (no CAP_NET_ADMIN, no connector).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        fallback_interval: std::time::Duration,
        /// Write the run's statistics (events, overruns, move latency) as JSON here on exit.
        #[arg(long)]
        stats_out: Option<PathBuf>,
        /// Receive buffer of the process-event socket, in bytes (tests shrink it to force
        /// overruns).
        #[arg(long, hide = true, default_value_t = 8 << 20)]
        event_buffer: usize,
        /// Serve Prometheus metrics here (IP:PORT), or `off`; overrides `agent.metrics`.
        #[arg(long, value_parser = parse_metrics_addr)]
        metrics: Option<MetricsAddr>,
    },
    /// Change a tenant's limits live: the running daemon validates the values as it validates
    /// the policy and applies them at once. They last until `reload` or a restart, or, with
    /// `--persist`, are written to conf.d/90-set-TENANT.toml.
    #[command(
        after_help = "Keys: io.read_bps io.write_bps io.read_iops io.write_iops cpu.cores cpu.weight cpu.cpus cpu.numa_nodes memory.max memory.high memory.low memory.swap_max\n\nExamples:\n  dbcage set DEMO io.read_bps=200MiB cpu.cores=8\n  dbcage set DEMO cpu.cpus=0-31 --persist\n  dbcage set DEMO --reset io.read_bps\n  dbcage set DEMO --reset"
    )]
    Set {
        tenant: String,
        /// KEY=VALUE pairs, e.g. io.read_bps=200MiB cpu.cpus=0-31 memory.high=30GiB (with
        /// --reset: the keys to drop).
        #[arg(required_unless_present = "reset")]
        values: Vec<String>,
        /// Until the next reload or restart (the default).
        #[arg(long, conflicts_with = "persist")]
        runtime: bool,
        /// Also write the values to conf.d/90-set-TENANT.toml, so they survive a restart; with
        /// --reset, remove that file.
        #[arg(long)]
        persist: bool,
        /// Drop the tenant's runtime overrides (with --persist also the persisted ones); given
        /// keys (`--reset io.read_bps`), only those.
        #[arg(long)]
        reset: bool,
        /// No daemon: apply once from this process (a later `dbcage run` or `apply` starts from
        /// the files again unless --persist is given).
        #[arg(long)]
        direct: bool,
        #[arg(long)]
        json: bool,
    },
    /// Make the running daemon re-read the policy (as SIGHUP does) and report the outcome: on
    /// any error the running policy stays and the errors are printed (file:line:col).
    Reload,
    /// Start a command already inside a tenant's group (as cgexec does), so no window is left.
    Exec {
        tenant: String,
        /// Start it in the tenant's exempt leaf (no IO limits).
        #[arg(long)]
        exempt: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Measure a disk or file with direct IO as parallelism grows: IOPS, MiB/s, latency
    /// percentiles, and the knee where p99 crosses the latency target.
    Probe(crate::probe::ProbeArgs),
    /// Check a tenant's IO limits by probing its devices from inside its limited group.
    Verify(crate::probe::verify::VerifyArgs),
    /// Write the man pages (dbcage(8), one per subcommand) into DIR; used when packaging.
    #[command(hide = true)]
    GenerateMan { dir: PathBuf },
    /// Write bash, zsh and fish completions into DIR; used when packaging.
    #[command(hide = true)]
    GenerateCompletions { dir: PathBuf },
    /// Convert a libcgroup setup (cgconfig.conf groups, cgrules.conf rules) into a dbcage policy,
    /// printed on stdout; what has no equivalent becomes a comment that says why. Lines that
    /// cannot be read are reported as FILE:LINE, and then nothing is printed unless --force.
    /// Without options, reads /etc/cgconfig.conf and /etc/cgrules.conf (those that exist).
    ImportLibcgroup {
        /// cgconfig.conf to read.
        #[arg(long, value_name = "FILE")]
        cgconfig: Option<PathBuf>,
        /// cgrules.conf to read.
        #[arg(long, value_name = "FILE")]
        cgrules: Option<PathBuf>,
        /// Print the policy even when some lines could not be read.
        #[arg(long)]
        force: bool,
    },
    /// Move a tenant's processes back to the parent cgroup and remove its groups.
    Release {
        /// Tenants to release.
        tenants: Vec<String>,
        /// Release every tenant and remove dbcage's root group.
        #[arg(long, conflicts_with = "tenants")]
        all: bool,
    },
}

/// `--metrics`: an address, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct MetricsAddr(Option<std::net::SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("`{s}` is not an address; use IP:PORT such as 127.0.0.1:9477, or off"))
}

/// An error that means "the input is wrong, nothing was changed" (exit 2).
#[derive(Debug)]
struct Invalid(String);
impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Invalid {}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    policy::allow_insecure_files(cli.allow_insecure_policy);
    // The daemon logs its decisions (moves, lost events, reloads); commands only warnings.
    let default_level = if matches!(cli.command, Command::Run { .. }) {
        "info"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DBCAGE_LOG")
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A closed pipe (`dbcage status | head`) is not an error.
            let broken_pipe = e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                    || c.downcast_ref::<serde_json::Error>()
                        .is_some_and(|j| j.io_error_kind() == Some(std::io::ErrorKind::BrokenPipe))
            });
            if broken_pipe {
                return ExitCode::SUCCESS;
            }
            if e.downcast_ref::<PolicyErrors>().is_some() || e.downcast_ref::<Invalid>().is_some() {
                eprintln!("dbcage: {}", error_chain(&e).trim_end());
                return ExitCode::from(2);
            }
            eprintln!("dbcage: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes, each once: our error types already print their kernel error, so a
/// cause whose text is already in the message is not repeated.
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}

fn import_libcgroup(
    cgconfig: Option<PathBuf>,
    cgrules: Option<PathBuf>,
    force: bool,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    // Explicit files must exist; the defaults are read when they do.
    let defaults = cgconfig.is_none() && cgrules.is_none();
    let pick = |given: Option<PathBuf>, default: &str| -> Result<Option<(PathBuf, String)>> {
        let path = match given {
            Some(p) => p,
            None if defaults && Path::new(default).exists() => PathBuf::from(default),
            None => return Ok(None),
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Some((path, text)))
    };
    let cfg = pick(cgconfig, "/etc/cgconfig.conf")?;
    let rules = pick(cgrules, "/etc/cgrules.conf")?;
    if cfg.is_none() && rules.is_none() {
        anyhow::bail!("neither /etc/cgconfig.conf nor /etc/cgrules.conf exists; name the files with --cgconfig and --cgrules");
    }
    fn input(f: &Option<(PathBuf, String)>) -> Option<crate::import::Input<'_>> {
        f.as_ref().map(|(path, text)| crate::import::Input {
            path: path.as_path(),
            text: text.as_str(),
        })
    }
    let imported = crate::import::convert(input(&cfg), input(&rules), &HostFs::default());
    for e in &imported.errors {
        eprintln!("{e}");
    }
    if !imported.errors.is_empty() && !force {
        eprintln!(
            "dbcage: {} line{} could not be read; nothing was printed (--force prints the policy without them)",
            imported.errors.len(),
            if imported.errors.len() == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::from(1));
    }
    out.write_all(imported.policy.as_bytes())?;
    Ok(if imported.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Check => check(&cli.config, &mut out),
        Command::Plan { json } => {
            let ctx = engine::prepare(&cli.config)?;
            let plan = engine::plan(&ctx, &Adjustments::default())?;
            if json {
                serde_json::to_writer_pretty(&mut out, &plan)?;
                writeln!(out)?;
            } else {
                print_plan(&mut out, &ctx, &plan)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Apply { json } => {
            let ctx = engine::prepare(&cli.config)?;
            let plan = engine::plan(&ctx, &Adjustments::default())?;
            let outcome = engine::execute(&plan);
            if json {
                #[derive(Serialize)]
                struct Report<'a> {
                    plan: &'a Plan,
                    outcome: &'a engine::Outcome,
                }
                serde_json::to_writer_pretty(
                    &mut out,
                    &Report {
                        plan: &plan,
                        outcome: &outcome,
                    },
                )?;
                writeln!(out)?;
            } else {
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
            }
            if outcome.errors.is_empty() {
                Ok(ExitCode::SUCCESS)
            } else {
                out.flush()?;
                bail!(
                    "{} of the plan's steps failed (listed above)",
                    outcome.errors.len()
                )
            }
        }
        Command::Status {
            tenants,
            verbose,
            devices,
            interval,
            json,
        } => show_status(
            &cli.config,
            &StatusArgs {
                socket: cli.socket.clone(),
                only: tenants,
                verbose,
                devices,
                interval,
                json,
            },
            &mut out,
        ),
        Command::Top { interval } => {
            let (loaded, layout, fs) = engine::layout_for(&cli.config)?;
            crate::top::run(&fs, &layout, &loaded.policy, interval)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Release { tenants, all } => release(&cli.config, &tenants, all, &mut out),
        Command::ImportLibcgroup {
            cgconfig,
            cgrules,
            force,
        } => import_libcgroup(cgconfig, cgrules, force, &mut out),
        Command::GenerateMan { dir } => {
            for path in generate_man(&dir)? {
                writeln!(out, "{}", path.display())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::GenerateCompletions { dir } => {
            for path in generate_completions(&dir)? {
                writeln!(out, "{}", path.display())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            rescan_interval,
            fallback_interval,
            stats_out,
            event_buffer,
            metrics,
        } => {
            crate::agent::run(crate::agent::AgentOptions {
                config: cli.config.clone(),
                rescan: rescan_interval,
                fallback_rescan: fallback_interval,
                stats_out,
                event_buffer,
                metrics: metrics.map(|m| m.0),
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Set {
            tenant,
            values,
            runtime: _,
            persist,
            reset,
            direct,
            json,
        } => {
            let op = if reset {
                if let Some(w) = values.iter().find(|w| w.contains('=')) {
                    return Err(Invalid(format!(
                        "`{w}`: with --reset, name the keys to drop (e.g. io.read_bps), not KEY=VALUE"
                    ))
                    .into());
                }
                crate::control::Op::Reset {
                    tenant,
                    persist,
                    keys: values,
                }
            } else {
                crate::control::Op::Set {
                    tenant,
                    values: crate::control::parse_assignments(&values).map_err(Invalid)?,
                    persist,
                }
            };
            control_request(
                &cli.config,
                cli.socket.as_deref(),
                op,
                direct,
                json,
                &mut out,
            )
        }
        Command::Reload => control_request(
            &cli.config,
            cli.socket.as_deref(),
            crate::control::Op::Reload {},
            false,
            false,
            &mut out,
        ),
        Command::Exec {
            tenant,
            exempt,
            command,
        } => exec_in(&cli.config, &tenant, exempt, &command),
        Command::Probe(args) => crate::probe::probe_command(&args, &mut out)
            .map(|()| ExitCode::SUCCESS)
            .map_err(probe_invalid),
        Command::Verify(args) => crate::probe::verify::verify_command(&cli.config, &args, &mut out)
            .map(|()| ExitCode::SUCCESS)
            .map_err(probe_invalid),
    }
}

/// The control socket for this policy: `--socket`, or the one of its `agent.root`. A caller who
/// may not read the policy (a member of the control group) gets the default root's.
fn socket_for(config: &Path, socket: Option<&Path>) -> PathBuf {
    if let Some(s) = socket {
        return s.to_path_buf();
    }
    // Only `agent.root` is needed, and `reload` is for policies that may be broken now: read
    // that one key from each file that parses, the last one wins as in a merge.
    let mut files = vec![config.to_path_buf()];
    files.extend(policy::dropin_files(config).unwrap_or_default());
    let mut root = policy::DEFAULT_ROOT.to_string();
    for f in files {
        let table = std::fs::read_to_string(&f)
            .ok()
            .and_then(|t| t.parse::<toml::Table>().ok());
        if let Some(r) = table
            .as_ref()
            .and_then(|t| t.get("agent")?.get("root")?.as_str())
            .filter(|r| policy::check_group_name(r).is_ok())
        {
            root = r.to_string();
        }
    }
    crate::control::socket_path(&root)
}

/// `set` and `reload`: send the request to the daemon (or, with `--direct`, apply it here).
fn control_request(
    config: &Path,
    socket: Option<&Path>,
    op: crate::control::Op,
    direct: bool,
    json: bool,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    use crate::control::{client, Request, Response};
    let reply: Response = if direct {
        let (live, loaded) = crate::control::Live::load(config)?;
        let prepared = engine::read_host(loaded, engine::Scan::Full)?;
        let mut g = crate::control::Direct { live, prepared };
        crate::control::handle(&mut g, &op, std::time::Instant::now())
    } else {
        let path = socket_for(config, socket);
        match client::send(&path, &Request::new(op)) {
            Ok(r) => r,
            Err(e @ client::ClientError::NoDaemon { .. }) => bail!("{e}"),
            Err(e) => return Err(e.into()),
        }
    };
    if json {
        serde_json::to_writer_pretty(&mut *out, &reply)?;
        writeln!(out)?;
    } else if reply.ok {
        write!(out, "{}", reply.message)?;
        match reply.applied_us {
            Some(us) => writeln!(out, " (applied in {:.1} ms)", us as f64 / 1000.0)?,
            None => writeln!(out)?,
        }
    }
    if reply.ok {
        return Ok(ExitCode::SUCCESS);
    }
    out.flush()?;
    let mut msg = reply.message.clone();
    for e in &reply.errors {
        msg.push_str(&format!("\n  {e}"));
    }
    if reply.errors.is_empty() {
        Err(Invalid(msg).into())
    } else {
        bail!("{msg}")
    }
}

/// A probe's bad input is the command line's: exit 2.
fn probe_invalid(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<crate::probe::BadInput>() {
        Ok(b) => Invalid(b.0).into(),
        Err(e) => e,
    }
}

fn check(config: &Path, out: &mut impl std::io::Write) -> Result<ExitCode> {
    let ctx = engine::prepare(config)?;
    let plan = engine::plan(&ctx, &Adjustments::default())?;
    let policy = &ctx.loaded.policy;
    writeln!(
        out,
        "policy OK: {} ({} tenants)",
        policy
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        policy.tenants.len()
    )?;
    writeln!(out, "cgroup controllers: {}", ctx.layout.setup.describe())?;
    for t in &plan.tenants {
        let devices = &ctx.inventory.tenants[policy
            .tenants
            .iter()
            .position(|x| x.name == t.name)
            .unwrap()]
        .devices;
        writeln!(
            out,
            "tenant {}: {} processes match now; devices: {}",
            t.name,
            t.processes,
            if devices.is_empty() {
                "none".to_string()
            } else {
                devices
                    .iter()
                    .map(|d| format!("{} ({})", d.name, d.devnum))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )?;
    }
    let mut warnings: Vec<String> = ctx.loaded.warnings.iter().map(|w| w.to_string()).collect();
    warnings.extend(plan.warnings.iter().cloned());
    // Overlaps seen on live processes: rules of two tenants that both match one process now.
    let mut seen = std::collections::BTreeMap::new();
    for p in &ctx.inventory.procs {
        let c = claims(&policy.tenants, p);
        if c.len() > 1 {
            seen.entry(c.clone())
                .or_insert_with(Vec::new)
                .push(format!("{} ({})", p.pid, p.comm));
        }
    }
    for (tenants, procs) in seen {
        let names: Vec<&str> = tenants
            .iter()
            .map(|i| policy.tenants[*i].name.as_str())
            .collect();
        warnings.push(format!(
            "rules of tenants {} overlap on {} running process(es), e.g. {}; they go to `{}`, the first in file order",
            names.join(", "),
            procs.len(),
            procs.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            names[0]
        ));
    }
    for w in &warnings {
        writeln!(out, "warning: {w}")?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_plan(out: &mut impl std::io::Write, ctx: &engine::Prepared, plan: &Plan) -> Result<()> {
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

struct StatusArgs {
    socket: Option<PathBuf>,
    only: Vec<String>,
    verbose: bool,
    devices: bool,
    interval: std::time::Duration,
    json: bool,
}

fn show_status(
    config: &Path,
    args: &StatusArgs,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    let (loaded, layout, fs) = engine::layout_for(config)?;
    let policy = &loaded.policy;
    for name in &args.only {
        if !policy.tenants.iter().any(|t| &t.name == name) {
            return Err(
                Invalid(format!("no tenant named `{name}` in {}", config.display())).into(),
            );
        }
    }
    let procs = if args.verbose {
        policy.refresh_pid_files(&fs);
        Some(inventory::procs::scan(&fs)?)
    } else {
        None
    };
    let mut sample = status::collect(&fs, &layout, policy, &args.only, procs.as_deref());
    if !args.interval.is_zero() {
        std::thread::sleep(args.interval);
        let first = sample;
        sample = status::collect(&fs, &layout, policy, &args.only, procs.as_deref());
        status::with_rates(&first, &mut sample);
    }
    let write_note = layout.setup.write_limits_pass_buffered_writes()
        && policy.tenants.iter().any(|t| t.sets_write_limits());
    let (daemon, overrides) = ask_daemon(config, args.socket.as_deref());
    let overrides: Vec<_> = overrides
        .into_iter()
        .filter(|o| args.only.is_empty() || args.only.contains(&o.tenant))
        .collect();
    if args.json {
        #[derive(Serialize)]
        struct Report<'a> {
            controllers: String,
            interval_seconds: f64,
            tenants: &'a [status::TenantStatus],
            notes: Vec<&'static str>,
            /// Values in force that come from `set`, a persisted `set` or a schedule window.
            overrides: &'a [crate::control::OverrideInfo],
            daemon: &'a DaemonState,
        }
        let notes = if write_note {
            vec![V1_WRITE_NOTE]
        } else {
            vec![]
        };
        serde_json::to_writer_pretty(
            &mut *out,
            &Report {
                controllers: layout.setup.describe(),
                interval_seconds: args.interval.as_secs_f64(),
                tenants: &sample.tenants,
                notes,
                overrides: &overrides,
                daemon: &daemon,
            },
        )?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "cgroup controllers: {}", layout.setup.describe())?;
    writeln!(out, "daemon: {daemon}")?;
    print_status_table(out, &sample.tenants, args.devices)?;
    if !overrides.is_empty() {
        writeln!(
            out,
            "overrides in force (not from the tenant tables of the policy):"
        )?;
        for o in &overrides {
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
    if write_note {
        writeln!(out, "note: {V1_WRITE_NOTE}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What `status` says of the daemon (`--json`: `daemon.state` is `running`, `not-running` or
/// `unknown`).
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
enum DaemonState {
    Running(crate::control::DaemonHealth),
    NotRunning { socket: String },
    Unknown { reason: String },
}

/// One request to the daemon for `status`: its health and the overrides it has in force.
/// Without an answer, the overrides are those the files and the clock give (persisted `set`
/// values, schedule windows open now).
fn ask_daemon(
    config: &Path,
    socket: Option<&Path>,
) -> (DaemonState, Vec<crate::control::OverrideInfo>) {
    use crate::control::{client, Op, Request};
    let path = socket_for(config, socket);
    let state = match client::send(&path, &Request::new(Op::Health {})) {
        Ok(r) => match r.daemon {
            Some(h) if r.ok => return (DaemonState::Running(h), r.overrides),
            // A daemon from before `health` refuses it as unknown.
            _ => DaemonState::Unknown {
                reason: format!(
                    "the daemon on {} did not report its health: {}",
                    path.display(),
                    r.message
                ),
            },
        },
        Err(client::ClientError::NoDaemon { .. }) => DaemonState::NotRunning {
            socket: path.display().to_string(),
        },
        Err(e) => DaemonState::Unknown {
            reason: e.to_string(),
        },
    };
    let overrides = match crate::control::Live::load(config) {
        Ok((live, loaded)) => live.overrides(&loaded.policy),
        Err(_) => Vec::new(),
    };
    (state, overrides)
}

/// `2h03m`, `5m10s`, `42s`, `0.4s`.
fn span(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 10.0 {
        return format!("{s:.1}s");
    }
    let s = s as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

impl std::fmt::Display for DaemonState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DaemonState::Running(h) => {
                write!(f, "running (pid {}, up {}), ", h.pid, span(h.uptime_seconds))?;
                if h.mode == crate::control::DaemonMode::Events {
                    write!(f, "placing processes as they start")?;
                } else {
                    write!(
                        f,
                        "RESCAN-ONLY (no process events: a new process waits up to {} to be placed)",
                        span(h.rescan_interval_seconds)
                    )?;
                }
                write!(f, "; {} moves", h.moves)?;
                if h.events_lost > 0 {
                    write!(
                        f,
                        ", event overruns: {} (each followed by a rescan)",
                        h.events_lost
                    )?;
                }
                if let Some(ago) = h.last_scan_seconds_ago {
                    write!(f, ", last full scan {} ago", span(ago))?;
                }
                if h.reload_failures > 0 {
                    write!(
                        f,
                        ", reloads refused: {} (the log says why)",
                        h.reload_failures
                    )?;
                }
                Ok(())
            }
            DaemonState::NotRunning { socket } => write!(
                f,
                "NOT RUNNING (nothing listens on {socket}): processes that start now stay unplaced until `dbcage run` starts (or the next `dbcage apply`)"
            ),
            DaemonState::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

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

fn print_status_table(
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
        "MEMORY MiB",
    )?;
    let f0 = |v: f64| format!("{v:.0}");
    let f2 = |v: f64| format!("{v:.2}");
    for r in rows {
        let rates = r.io.rates;
        let lim = |v: Option<u64>| v.map(|v| v as f64);
        let mut notes = Vec::new();
        if !r.at_limit.is_empty() {
            notes.push(format!("AT LIMIT {}", r.at_limit.join(",")));
        }
        if let Some(t) = r.cpu_throttled_share.filter(|t| *t > 0.0) {
            notes.push(format!("cpu throttled {:.0}%", t * 100.0));
        }
        if let Some(k) = r.memory.oom_kills.filter(|k| *k > 0) {
            notes.push(format!("{k} OOM kills"));
        }
        if let Some(p) = &r.pressure {
            let psi: Vec<String> = [("io", p.io), ("cpu", p.cpu), ("mem", p.memory)]
                .iter()
                .filter_map(|(n, v)| {
                    v.filter(|v| v.some_avg10 > 0.0)
                        .map(|v| format!("{n} {:.0}%", v.some_avg10))
                })
                .collect();
            if !psi.is_empty() {
                notes.push(format!("psi {}", psi.join(" ")));
            }
        }
        if let Some(g) = &r.replication {
            notes.push(replication_note(g));
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
                "  {} {:>7} {:<16} {}    # {}",
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

/// The replication guard's state in one `status` note: `replication lag 12.0 MiB 1.5 s` plus
/// `BEHIND` past the threshold and the raised write limits while they hold.
fn replication_note(g: &crate::replication::GuardStatus) -> String {
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

const V1_WRITE_NOTE: &str = "cgroup v1 write limits bind only O_DIRECT and fsync'd writes; buffered writes without fsync are not charged to the writer and pass the limit";

/// Creates the tenant's groups and limits if needed (without moving anyone else), puts this
/// process in the leaf in every hierarchy, then replaces it with the command.
fn exec_in(config: &Path, tenant: &str, exempt: bool, command: &[String]) -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    policy::check_group_name(tenant).map_err(|e| Invalid(format!("tenant name: {e}")))?;
    let ctx = engine::prepare(config)?;
    if !ctx.loaded.policy.tenants.iter().any(|t| t.name == tenant) {
        return Err(Invalid(format!(
            "no tenant named `{tenant}` in {}",
            config.display()
        ))
        .into());
    }
    let mut plan = engine::plan(&ctx, &Adjustments::default())?;
    plan.steps.retain(|s| !matches!(s, Step::Move { .. }));
    let outcome = engine::execute(&plan);
    if let Some(e) = outcome.errors.into_iter().next() {
        return Err(e).context(format!("preparing the groups of tenant `{tenant}`"));
    }
    let leaf = if exempt { Leaf::Exempt } else { Leaf::Limited };
    let me = std::process::id().to_string();
    for h in 0..ctx.layout.setup.hierarchies.len() {
        let procs = ctx.layout.leaf_procs(h, tenant, leaf);
        apply::write_file(&procs, &me).with_context(|| format!("joining tenant `{tenant}`"))?;
    }
    let err = std::process::Command::new(&command[0])
        .args(&command[1..])
        .exec();
    Err(anyhow::Error::new(err).context(format!("starting `{}`", command[0])))
}

fn release(
    config: &Path,
    only: &[String],
    all: bool,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    if only.is_empty() && !all {
        return Err(Invalid("name the tenants to release, or give --all".into()).into());
    }
    let (_loaded, layout, _fs) = engine::layout_for(config)?;
    let existing = layout.existing_tenants();
    let names: Vec<String> = if all {
        existing.iter().cloned().collect()
    } else {
        only.to_vec()
    };
    for n in &names {
        policy::check_group_name(n).map_err(|e| Invalid(format!("tenant name: {e}")))?;
        if !existing.contains(n) {
            return Err(Invalid(format!(
                "tenant `{n}` has no groups under `{}`; nothing to release",
                layout.root_name
            ))
            .into());
        }
    }
    let mut moved = 0;
    for n in &names {
        moved += cgroup::release_tenant(&layout, n)
            .with_context(|| format!("releasing tenant `{n}`"))?;
        writeln!(out, "released {n}")?;
    }
    if all {
        cgroup::remove_root(&layout)?;
    }
    writeln!(out, "{moved} processes moved back to the parent cgroup")?;
    Ok(ExitCode::SUCCESS)
}

/// Writes dbcage.8 and one dbcage-SUBCOMMAND.8 per visible subcommand into `dir`, generated
/// from the clap definition (clap_mangen). Returns the files written.
pub fn generate_man(dir: &Path) -> Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    let mut render = |cmd: clap::Command, see_also: &str| -> Result<()> {
        let man = clap_mangen::Man::new(cmd)
            .section("8")
            .manual("System Administration")
            .source(format!("dbcage {}", env!("CARGO_PKG_VERSION")));
        let path = dir.join(man.get_filename());
        let mut buf = Vec::new();
        man.render(&mut buf)?;
        buf.extend_from_slice(format!(".SH \"SEE ALSO\"\n{see_also}\n").as_bytes());
        std::fs::write(&path, buf).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let mut refs: Vec<String> = subs
        .iter()
        .map(|s| format!("\\fBdbcage\\-{}\\fR(8)", s.get_name()))
        .collect();
    refs.push("\\fBdbcage.toml\\fR(5)".into());
    refs.push("\\fBsystemctl\\fR(1)".into());
    render(cmd.clone(), &refs.join(",\n"))?;
    for sub in subs {
        render(sub, "\\fBdbcage\\fR(8), \\fBdbcage.toml\\fR(5)")?;
    }
    Ok(written)
}

/// Writes the bash (`dbcage.bash`), zsh (`_dbcage`) and fish (`dbcage.fish`) completions into
/// `dir`, generated from the clap definition (clap_complete). Returns the files written.
pub fn generate_completions(dir: &Path) -> Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // The same command without the hidden packaging subcommands.
    let full = Cli::command();
    let mut cmd = clap::Command::new("dbcage")
        .version(env!("CARGO_PKG_VERSION"))
        .about(full.get_about().cloned().unwrap_or_default())
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
        .subcommand_required(true);
    [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|shell| {
            clap_complete::generate_to(shell, &mut cmd, "dbcage", dir)
                .with_context(|| format!("cannot write {shell} completions to {}", dir.display()))
        })
        .collect()
}

#[cfg(test)]
mod status_text_tests {
    use super::{replication_note, span, DaemonState};
    use crate::control::{DaemonHealth, DaemonMode};
    use crate::replication::GuardStatus;

    #[test]
    fn spans_read_as_a_person_would_say_them() {
        assert_eq!(span(0.42), "0.4s");
        assert_eq!(span(42.9), "42s");
        assert_eq!(span(310.0), "5m10s");
        assert_eq!(span(7380.0), "2h03m");
        assert_eq!(span(-1.0), "0.0s");
    }

    #[test]
    fn the_daemon_line_says_what_a_new_process_can_expect() {
        let mut h = DaemonHealth {
            pid: 812,
            uptime_seconds: 7380.0,
            mode: DaemonMode::Events,
            rescan_interval_seconds: 30.0,
            moves: 1532,
            last_scan_seconds_ago: Some(12.0),
            ..DaemonHealth::default()
        };
        assert_eq!(
            DaemonState::Running(h.clone()).to_string(),
            "running (pid 812, up 2h03m), placing processes as they start; 1532 moves, last full scan 12s ago"
        );
        h.mode = DaemonMode::RescanOnly;
        h.rescan_interval_seconds = 1.0;
        h.events_lost = 2;
        h.reload_failures = 1;
        assert_eq!(
            DaemonState::Running(h).to_string(),
            "running (pid 812, up 2h03m), RESCAN-ONLY (no process events: a new process waits up to 1.0s to be placed); 1532 moves, event overruns: 2 (each followed by a rescan), last full scan 12s ago, reloads refused: 1 (the log says why)"
        );
        let gone = DaemonState::NotRunning {
            socket: "/run/dbcage/dbcage.sock".into(),
        };
        assert!(gone.to_string().starts_with(
            "NOT RUNNING (nothing listens on /run/dbcage/dbcage.sock): processes that start now stay unplaced"
        ));
    }

    #[test]
    fn replication_note_says_lag_behind_and_raises() {
        let calm = GuardStatus {
            lag_bytes: 3 << 20,
            lag_seconds: 0.25,
            ..GuardStatus::default()
        };
        assert_eq!(replication_note(&calm), "replication lag 3.0 MiB 0.2 s");
        let raised = GuardStatus {
            lag_bytes: 200 << 20,
            lag_seconds: 12.0,
            behind: true,
            raised_write_bps: Some(64 << 20),
            raised_write_iops: Some(800),
            actions: 2,
        };
        assert_eq!(
            replication_note(&raised),
            "replication lag 200.0 MiB 12.0 s BEHIND, write_bps raised to 64 MiB/s, write_iops raised to 800"
        );
    }
}
