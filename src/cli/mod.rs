//! The command line: parse, run, print the error chain once, exit with a documented code.
//!
//! Exit codes: 0 success; 1 a runtime failure (a kernel write failed, a file could not be read);
//! 2 the policy or the command line is invalid (nothing was changed).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::Serialize;

pub mod args;
mod manual;
mod view;

use crate::usage::Invalid;
pub use args::{generate_completions, generate_man, Cli, Command};
use view::daemon::DaemonState;
use view::plan::{print_apply, print_plan};
use view::status::{print_status, StatusText, V1_WRITE_NOTE};

use crate::cgroup::{self, apply};
use crate::classify::{Classifier, Leaf};
use crate::engine::{self, Adjustments};
use crate::hostfs::HostFs;
use crate::inventory;
use crate::plan::{Plan, Step};
use crate::policy::{self, FileTrust, PolicyErrors, PolicyPath};
use crate::status;

pub fn main() -> ExitCode {
    args::complete_if_asked();
    let cli = Cli::parse();
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
    let trust = if cli.allow_insecure_policy {
        FileTrust::Any
    } else {
        FileTrust::RootOnly
    };
    let config = PolicyPath::new(cli.config.clone(), trust);
    match cli.command {
        Command::Check => check(&config, &mut out),
        Command::Plan {
            json,
            migrate_memory,
        } => {
            let ctx = engine::prepare(&config)?;
            let adjust = Adjustments {
                migrate_memory,
                ..Adjustments::default()
            };
            let plan = engine::plan(&ctx, &adjust)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &plan)?;
                writeln!(out)?;
            } else {
                print_plan(&mut out, &ctx, &plan, &mut std::io::stderr())?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Apply {
            json,
            migrate_memory,
        } => {
            let ctx = engine::prepare(&config)?;
            let adjust = Adjustments {
                migrate_memory,
                ..Adjustments::default()
            };
            let plan = engine::plan(&ctx, &adjust)?;
            let outcome = engine::execute(&plan);
            // Processes adopted into a scope that did not run yet are in its own group: the
            // plan after the adoption makes the scope's leaves and moves them in.
            let follow_up = if outcome.errors.is_empty() && plan.adopts_before_leaves() {
                let ctx = engine::prepare(&config)?;
                let plan = engine::plan(&ctx, &adjust)?;
                let outcome = engine::execute(&plan);
                Some((plan, outcome))
            } else {
                None
            };
            #[derive(Serialize)]
            struct Report<'a> {
                plan: &'a Plan,
                outcome: &'a engine::Outcome,
                /// The plan run after it, when it adopted processes before their scope's
                /// leaves could be made.
                #[serde(skip_serializing_if = "Option::is_none")]
                then: Option<Box<Report<'a>>>,
            }
            if json {
                let then = follow_up.as_ref().map(|(plan, outcome)| {
                    Box::new(Report {
                        plan,
                        outcome,
                        then: None,
                    })
                });
                serde_json::to_writer_pretty(
                    &mut out,
                    &Report {
                        plan: &plan,
                        outcome: &outcome,
                        then,
                    },
                )?;
                writeln!(out)?;
            } else {
                print_apply(&mut out, &plan, &outcome, &mut std::io::stderr())?;
                if let Some((plan, outcome)) = &follow_up {
                    writeln!(out, "then, the scopes' leaves for the adopted processes:")?;
                    print_apply(&mut out, plan, outcome, &mut std::io::stderr())?;
                }
            }
            let errors = outcome.errors.len() + follow_up.as_ref().map_or(0, |f| f.1.errors.len());
            if errors == 0 {
                Ok(ExitCode::SUCCESS)
            } else {
                out.flush()?;
                bail!("{errors} of the plan's steps failed (listed above)")
            }
        }
        Command::Status {
            tenants,
            verbose,
            devices,
            interval,
            json,
        } => show_status(
            &config,
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
            let view = layout_or_running(&config)?;
            let (policy, socket) = (&view.loaded.policy, cli.socket.as_deref());
            let daemon = || ask_daemon(&policy.agent.root_name, socket).0.to_string();
            crate::top::run(&view.fs, &view.layout, policy, interval, &daemon)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::SystemdSetup { dry_run } => systemd_setup(&config, dry_run, &mut out),
        Command::Release { tenants, all } => {
            release(&config, cli.socket.as_deref(), &tenants, all, &mut out)
        }
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
            favordynmods_dir,
            metrics,
            web_config_file,
            metrics_insecure,
        } => {
            crate::agent::run(crate::agent::AgentOptions {
                config: config.clone(),
                rescan: rescan_interval,
                fallback_rescan: fallback_interval,
                stats_out,
                event_buffer,
                favordynmods_dir,
                metrics: metrics.map(|m| m.0),
                web_config: web_config_file,
                metrics_insecure,
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
            dry_run,
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
                let mut groups = crate::control::parse_tenant_assignments(&tenant, &values)
                    .map_err(Invalid)?
                    .into_iter();
                let (tenant, values) = groups.next().expect("the first tenant");
                crate::control::Op::Set {
                    tenant,
                    values,
                    also: groups.collect(),
                    persist,
                    dry_run,
                }
            };
            control_request(&config, cli.socket.as_deref(), op, direct, json, &mut out)
        }
        Command::Reload => control_request(
            &config,
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
        } => exec_in(&config, &tenant, exempt, &command),
        Command::Probe(args) => {
            crate::probe::probe_command(&args, &mut out).map(|()| ExitCode::SUCCESS)
        }
        Command::Verify(args) => crate::probe::verify::verify_command(&config, &args, &mut out)
            .map(|()| ExitCode::SUCCESS),
        Command::Iolat(args) => crate::iolat::command::iolat_command(&config, &args, &mut out)
            .map(|()| ExitCode::SUCCESS),
        Command::Iocost(args) => {
            crate::iocost::command::iocost_command(&args, &mut out).map(|()| ExitCode::SUCCESS)
        }
    }
}

/// The control socket for this policy: `--socket`, or the one of its `agent.root`. A caller who
/// may not read the policy (a member of the control group) gets the default root's.
fn socket_for(config: &Path, socket: Option<&Path>) -> PathBuf {
    socket_of(socket, || lenient_root(config))
}

/// `--socket`, or the control socket of the `agent.root` that `root` gives.
fn socket_of(socket: Option<&Path>, root: impl FnOnce() -> String) -> PathBuf {
    socket.map_or_else(|| crate::control::socket_path(&root()), Path::to_path_buf)
}

/// `agent.root` of a policy that may be broken now (for `reload`, and for `status` and `top`
/// while the files on disk do not validate): that one key from each file that parses, the last
/// one wins as in a merge.
fn lenient_root(config: &Path) -> String {
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
    root
}

/// What `status` and `top` read: the policy, its layout, the host, and the overrides the files
/// and the clock give (persisted `set` values, schedule windows open now), shown when no daemon
/// answers with the overrides it has in force.
struct ReadView {
    loaded: policy::Loaded,
    layout: cgroup::Layout,
    fs: HostFs,
    file_overrides: Vec<crate::control::OverrideInfo>,
}

/// The policy, layout and host for `status` and `top`. When the files on disk do not validate
/// while a daemon runs, these show what the daemon runs (the policy it published, see
/// `agent`), with a warning, rather than nothing: the operator needs the running state most when
/// an edit went wrong. Without a daemon the policy's errors are the answer.
///
/// Under systemd the layout also names the units each tenant's limits and usage are read from
/// (`Layout::units`); when they cannot be found, a warning says why.
fn layout_or_running(config: &PolicyPath) -> Result<ReadView> {
    let mut view = policy_and_layout(config)?;
    match engine::tenant_units(&view.loaded, &view.fs) {
        Ok(units) => view.layout.units = units,
        Err(e) => eprintln!(
            "warning: cannot find the systemd units that govern the tenants ({e:#}); their limits and usage are not shown"
        ),
    }
    Ok(view)
}

/// The policy is read once here (at 1,000 tenants a read is ~130 ms of CPU): the overrides the
/// files give come from the same reading.
fn policy_and_layout(config: &PolicyPath) -> Result<ReadView> {
    let disk = match engine::live_layout_for(config) {
        Ok((live, loaded, layout, fs)) => {
            return Ok(ReadView {
                file_overrides: live.overrides(&loaded.policy),
                loaded,
                layout,
                fs,
            })
        }
        Err(e) => e,
    };
    let Some(errors) = disk.downcast_ref::<PolicyErrors>() else {
        return Err(disk);
    };
    let root = lenient_root(&config.path);
    let published = crate::rundir::state_path(&root, "policy");
    let Some(sources) = crate::rundir::read_owned::<Vec<(PathBuf, String)>>(&published) else {
        return Err(disk);
    };
    let Ok(loaded) = policy::from_sources_with(
        &sources,
        &policy::Overlay::default(),
        &policy::SystemAccounts,
    ) else {
        return Err(disk);
    };
    let (layout, fs) = engine::layout_of(&loaded)?;
    let n = errors.0.len();
    eprintln!(
        "warning: the policy files on disk do not validate ({}; `dbcage check` lists {}, and a reload would be refused); shown: the policy the running daemon uses",
        crate::units::count(n, "error", "errors"),
        if n == 1 { "it" } else { "them" }
    );
    // The daemon that published this policy answers with its own overrides.
    Ok(ReadView {
        loaded,
        layout,
        fs,
        file_overrides: Vec::new(),
    })
}

/// `set` and `reload`: send the request to the daemon (or, with `--direct`, apply it here).
fn control_request(
    config: &PolicyPath,
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

/// `dbcage systemd-setup`: the units the plan names as needing `Delegate=yes`
/// (`TenantSummary::needs_delegate`) get dbcage's drop-in, then one manager reload.
fn systemd_setup(
    config: &PolicyPath,
    dry_run: bool,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    let ctx = engine::prepare(config)?;
    if ctx.manager != crate::systemd::Manager::Systemd {
        anyhow::bail!(
            "systemd-setup: the cgroup manager here is {} (agent.manager = \"{}\"): there is no \
             unit to delegate; dbcage gives exempt processes their own leaf in its own groups",
            ctx.manager.as_str(),
            ctx.loaded.policy.agent.manager.as_str()
        );
    }
    let plan = engine::plan(&ctx, &Adjustments::default())?;
    let mut wrote = 0;
    let mut named = 0;
    let mut failed = Vec::new();
    for t in &plan.tenants {
        for unit in &t.needs_delegate {
            named += 1;
            use crate::systemd::setup::Written;
            match crate::systemd::setup::write(&ctx.fs, unit, dry_run) {
                Ok(Written::New(path)) if dry_run => writeln!(
                    out,
                    "tenant {}: {unit}: would write {} (Delegate=yes)",
                    t.name,
                    path.display()
                )?,
                Ok(Written::New(path)) => {
                    wrote += 1;
                    writeln!(
                        out,
                        "tenant {}: {unit}: wrote {} (Delegate=yes)",
                        t.name,
                        path.display()
                    )?
                }
                Ok(Written::Unchanged(path)) => writeln!(
                    out,
                    "tenant {}: {unit}: {} is there already",
                    t.name,
                    path.display()
                )?,
                Err(e) => failed.push(format!("tenant {}: {e}", t.name)),
            }
        }
    }
    if wrote > 0 {
        crate::systemd::Systemd::connect()
            .and_then(|sd| sd.reload())
            .context(
                "the drop-ins were written, but systemd was not reloaded; run `systemctl daemon-reload`",
            )?;
        writeln!(
            out,
            "systemd reloaded. The next plan (the daemon's rescan, or `dbcage apply`) makes the \
             tenants' leaves in these units; `dbcage plan` shows them, or names a unit to restart \
             first (one whose cgroup offers its subgroups no io controller yet)"
        )?;
    } else if named == 0 {
        writeln!(
            out,
            "nothing to write: no tenant's exempt processes run in a unit without Delegate=yes"
        )?;
    }
    for f in &failed {
        eprintln!("dbcage: {f}");
    }
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn check(config: &PolicyPath, out: &mut impl std::io::Write) -> Result<ExitCode> {
    let ctx = engine::prepare(config)?;
    let plan = engine::plan(&ctx, &Adjustments::default())?;
    let policy = &ctx.loaded.policy;
    writeln!(
        out,
        "policy OK: {} ({})",
        policy
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        crate::units::count(policy.tenants.len(), "tenant", "tenants")
    )?;
    writeln!(out, "cgroup controllers: {}", ctx.layout.setup.describe())?;
    let choice = policy.agent.manager;
    let manager = crate::systemd::resolve(choice, &ctx.fs).map_err(anyhow::Error::msg)?;
    writeln!(
        out,
        "cgroup manager: {} (agent.manager = \"{}\")",
        manager.as_str(),
        choice.as_str()
    )?;
    for t in &plan.tenants {
        let devices = &ctx.inventory.tenants[policy
            .tenants
            .iter()
            .position(|x| x.name == t.name)
            .unwrap()]
        .devices;
        writeln!(
            out,
            "tenant {}: {} now; devices: {}",
            t.name,
            crate::units::count(t.processes, "process matches", "processes match"),
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
        if let Some(line) = view::plan::units_line(policy, t) {
            writeln!(out, "  {line}")?;
        }
    }
    let mut warnings: Vec<String> = ctx.loaded.warnings.iter().map(|w| w.to_string()).collect();
    warnings.extend(plan.warnings.iter().cloned());
    warnings.extend(plan.buffered_writes_note());
    // Overlaps seen on live processes: rules of two tenants that both match one process now.
    let mut seen = std::collections::BTreeMap::new();
    for p in &ctx.inventory.procs {
        let c = policy.matcher.claims_on(p);
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
            "rules of tenants {} overlap on {} running, e.g. {}; they go to `{}`, the first in file order",
            names.join(", "),
            crate::units::count(procs.len(), "process", "processes"),
            procs.iter().take(3).cloned().collect::<Vec<_>>().join(", "),
            names[0]
        ));
    }
    // Warnings go to stderr, so that the report on stdout can be read or parsed alone.
    let mut err = std::io::stderr().lock();
    for w in &warnings {
        writeln!(err, "warning: {w}")?;
    }
    Ok(ExitCode::SUCCESS)
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
    config: &PolicyPath,
    args: &StatusArgs,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    let view = layout_or_running(config)?;
    let (policy, layout, fs) = (&view.loaded.policy, &view.layout, &view.fs);
    for name in &args.only {
        if !policy.tenants.iter().any(|t| &t.name == name) {
            return Err(
                Invalid(format!("no tenant named `{name}` in {}", config.display())).into(),
            );
        }
    }
    let procs = if args.verbose {
        policy.refresh_pid_files(fs);
        Some(inventory::procs::scan(fs)?)
    } else {
        None
    };
    // What processes hold (smaps_rollup) is shown from the last sample only, and in the text
    // view only where it is clearly above the charge.
    let resident = if args.json {
        status::Resident::Every
    } else {
        status::Resident::AboveCharge
    };
    let one_sample = args.interval.is_zero();
    let kept = (!one_sample).then(crate::hostfs::KeptDirs::new);
    let mut sample = status::collect(
        fs,
        layout,
        policy,
        &args.only,
        procs.as_deref(),
        if one_sample {
            resident
        } else {
            status::Resident::Skip
        },
        kept.as_ref(),
    );
    if !one_sample {
        std::thread::sleep(args.interval);
        let first = sample;
        sample = status::collect(
            fs,
            layout,
            policy,
            &args.only,
            procs.as_deref(),
            resident,
            kept.as_ref(),
        );
        status::with_rates(&first, &mut sample);
    }
    let write_note = layout.setup.write_limits_pass_buffered_writes()
        && policy.tenants.iter().any(|t| t.sets_write_limits());
    let (daemon, overrides) = ask_daemon(&policy.agent.root_name, args.socket.as_deref());
    let overrides: Vec<_> = overrides
        .unwrap_or(view.file_overrides)
        .into_iter()
        .filter(|o| args.only.is_empty() || args.only.contains(&o.tenant))
        .collect();
    if args.json {
        #[derive(Serialize)]
        struct Report<'a> {
            /// Controller → `v1`, `v2` or `missing`.
            controllers: std::collections::BTreeMap<&'static str, &'static str>,
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
                controllers: layout.setup.controller_drivers().into_iter().collect(),
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
    print_status(
        out,
        &StatusText {
            controllers: &layout.setup.describe(),
            daemon: &daemon,
            tenants: &sample.tenants,
            devices: args.devices,
            overrides: &overrides,
            write_note,
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

/// One request to the daemon for `status` and `top`: its health and the overrides it has in
/// force (`None` when no daemon answered). The socket is `--socket` or the one of the policy's
/// `agent.root` (the policy is read already: no second reading for the root).
fn ask_daemon(
    root: &str,
    socket: Option<&Path>,
) -> (DaemonState, Option<Vec<crate::control::OverrideInfo>>) {
    use crate::control::{client, Op, Request};
    let path = socket_of(socket, || root.to_string());
    let state = match client::send(&path, &Request::new(Op::Health {})) {
        Ok(r) => match r.daemon {
            Some(h) if r.ok => return (DaemonState::Running(h), Some(r.overrides)),
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
    (state, None)
}

/// Creates the tenant's groups and limits if needed (without moving anyone else), puts this
/// process in the leaf in every hierarchy the tenant has groups in, then replaces it with the
/// command.
fn exec_in(
    config: &PolicyPath,
    tenant: &str,
    exempt: bool,
    command: &[String],
) -> Result<ExitCode> {
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
    let leaf = if exempt { Leaf::Exempt } else { Leaf::Limited };
    let t = ctx.loaded.policy.tenants.iter().find(|t| t.name == tenant);
    let grouped = t.map(|t| ctx.layout.grouped(t)).unwrap_or_default();
    let leaves_exist = (0..grouped.len())
        .filter(|h| grouped[*h])
        .all(|h| ctx.layout.leaf_dir(h, tenant, leaf).is_dir());
    // A running daemon holds the values, with its adjustments (a guard's lowered weights, a
    // replication raise, the demand split): applying the policy file here would put every
    // tenant back to the file's values until its next plan. Join its groups and write nothing.
    if !(leaves_exist && daemon_health(&socket_for(&config.path, None)).is_some()) {
        let mut plan = engine::plan(&ctx, &Adjustments::default())?;
        plan.steps.retain(|s| !matches!(s, Step::Move { .. }));
        let outcome = engine::execute(&plan);
        if let Some(e) = outcome.errors.into_iter().next() {
            return Err(e).context(format!("preparing the groups of tenant `{tenant}`"));
        }
    }
    let me = std::process::id().to_string();
    // only where the tenant has groups: elsewhere it stays where it was started
    for h in (0..grouped.len()).filter(|h| grouped[*h]) {
        let procs = ctx.layout.leaf_procs(h, tenant, leaf);
        apply::write_file(&procs, &me).with_context(|| format!("joining tenant `{tenant}`"))?;
    }
    let err = std::process::Command::new(&command[0])
        .args(&command[1..])
        .exec();
    Err(anyhow::Error::new(err).context(format!("starting `{}`", command[0])))
}

fn release(
    config: &PolicyPath,
    socket: Option<&Path>,
    only: &[String],
    all: bool,
    out: &mut impl std::io::Write,
) -> Result<ExitCode> {
    if only.is_empty() && !all {
        return Err(Invalid("name the tenants to release, or give --all".into()).into());
    }
    let (loaded, layout, fs) = engine::layout_for(config)?;
    if crate::systemd::resolve(loaded.policy.agent.manager, &fs).map_err(anyhow::Error::msg)?
        == crate::systemd::Manager::Systemd
    {
        // Under systemd: the units get systemd's defaults back; every process stays where it
        // is. A running daemon would set them again at its next rescan: refused as below.
        let names: Vec<String> = if all {
            loaded
                .policy
                .tenants
                .iter()
                .map(|t| t.name.clone())
                .collect()
        } else {
            only.to_vec()
        };
        refuse_release_under_daemon(&config.path, socket, &loaded.policy, &names, all)?;
        let prepared = engine::prepare(config)?;
        let (released, from_leaves) =
            engine::systemd_release(&prepared, if all { &[] } else { only })?;
        use crate::systemd::govern::Released;
        for (tenant, unit, how) in &released {
            match how {
                Released::DropinsRemoved(files) if files.is_empty() => writeln!(
                    out,
                    "released {tenant}: {unit} back to its own settings (no runtime drop-in of dbcage's left)"
                )?,
                Released::DropinsRemoved(files) => writeln!(
                    out,
                    "released {tenant}: {unit} back to its own settings (removed {})",
                    files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )?,
                Released::ScopeLeft { processes } => writeln!(
                    out,
                    "released {tenant}: {unit} has systemd's defaults and is left running with its {} (stopping it would end {}: `systemctl stop {unit}`)",
                    crate::units::count(*processes, "process", "processes"),
                    if *processes == 1 { "it" } else { "them" }
                )?,
            }
        }
        if from_leaves == 0 {
            writeln!(out, "{} units released; no process moved", released.len())?;
        } else {
            writeln!(
                out,
                "{} units released; {} back from dbcage's leaves to their unit's own group (none left its unit)",
                released.len(),
                crate::units::count(from_leaves, "process", "processes")
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
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
    refuse_release_under_daemon(&config.path, socket, &loaded.policy, &names, all)?;
    let mut moved = 0;
    for n in &names {
        moved += cgroup::release_tenant(&layout, n)
            .with_context(|| format!("releasing tenant `{n}`"))?;
        writeln!(out, "released {n}")?;
    }
    if all {
        cgroup::remove_root(&layout)?;
    }
    writeln!(
        out,
        "{} back to the parent cgroup",
        crate::units::count(moved, "process moved", "processes moved")
    )?;
    Ok(ExitCode::SUCCESS)
}

/// The health of the daemon that answers on `socket`, if one does.
fn daemon_health(socket: &Path) -> Option<crate::control::DaemonHealth> {
    use crate::control::{client, Op, Request};
    client::send(socket, &Request::new(Op::Health {}))
        .ok()?
        .daemon
}

/// A running daemon puts a released tenant's processes back at its next rescan, so `release`
/// of a tenant the policy names (or `--all`) is refused while one answers on the socket, with
/// what to do instead. A tenant the policy no longer names (a leftover group) is released.
fn refuse_release_under_daemon(
    config: &Path,
    socket: Option<&Path>,
    policy: &policy::Policy,
    names: &[String],
    all: bool,
) -> Result<()> {
    let path = socket_for(config, socket);
    let Some(daemon) = daemon_health(&path) else {
        return Ok(());
    };
    let governed: Vec<&str> = names
        .iter()
        .filter(|n| all || policy.tenants.iter().any(|t| &t.name == *n))
        .map(String::as_str)
        .collect();
    if governed.is_empty() {
        return Ok(());
    }
    Err(Invalid(format!(
        "the dbcage daemon (pid {}, {}) is running and governs {}: it would move the processes back at its next rescan, so nothing was released. Stop it first (`systemctl stop dbcage`; limits stay in place) and release then, or remove the tenant from the policy and `dbcage reload` (the daemon then leaves it alone) and release it",
        daemon.pid,
        path.display(),
        governed
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .into())
}
