//! The command line's definition: subcommands, options, help text (clap), and the man pages and
//! completions generated from it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};

use crate::policy;

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
        /// Show the plan `apply --migrate-memory` would carry out.
        #[arg(long)]
        migrate_memory: bool,
    },
    /// Make the kernel match the policy: create groups, write limits, move processes.
    Apply {
        /// Print the plan and the outcome as JSON.
        #[arg(long)]
        json: bool,
        /// Move the memory of running tenants whose NUMA nodes change, now (the kernel copies
        /// their pages to the new nodes). Without it they keep their nodes until they restart.
        #[arg(long)]
        migrate_memory: bool,
    },
    /// Show what each tenant uses: IO rates against its limits, CPU against its quota, memory
    /// against its limits, OOM events and pressure, measured over a short interval.
    Status {
        /// Only these tenants.
        #[arg(add = ArgValueCandidates::new(tenant_candidates))]
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
        /// Print the status as JSON: one object per tenant with its limits, usage and
        /// processes, and the daemon's state (the fields are listed in README.md).
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
        /// Period of the rescan (the safety net): it reads the processes the events named since
        /// the one before, and the command line of a tenth of the others in turn (every process
        /// at least every ten rescans); every tenth rescan lists /proc for a process no event
        /// named.
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
        /// Where `agent.favordynmods = true` mounts its hierarchy (named after the directory;
        /// tests use their own).
        #[arg(long, hide = true, default_value = crate::favordynmods::DEFAULT_DIR)]
        favordynmods_dir: PathBuf,
        /// Serve Prometheus metrics here (IP:PORT), or `off`; overrides `agent.metrics`.
        #[arg(long, value_parser = parse_metrics_addr)]
        metrics: Option<MetricsAddr>,
        /// The metrics endpoint's TLS certificate and basic-auth users, in the web configuration
        /// format Prometheus exporters share (tls_server_config, basic_auth_users with bcrypt
        /// hashes). Without it the endpoint serves plain HTTP to anyone who can connect.
        #[arg(long, env = "DBCAGE_WEB_CONFIG_FILE", value_name = "web-config.yml")]
        web_config_file: Option<PathBuf>,
        /// Serve metrics on an address other than loopback (0.0.0.0, ::, a routable address)
        /// without a web configuration: no TLS, no authentication. Refused otherwise.
        #[arg(long)]
        metrics_insecure: bool,
    },
    /// Change tenants' limits live: the running daemon validates the values as it validates
    /// the policy and applies them at once, for all the tenants named or for none. They last
    /// until `reload` or a restart, or, with `--persist`, are written to
    /// conf.d/90-set-TENANT.toml. `numa = "auto"` tenants are placed again: those whose nodes
    /// still hold them stay, the others move (cpus at once, memory as `apply --migrate-memory`
    /// or cpu.migrate_memory says), and the answer says who moved where.
    #[command(
        after_help = "Keys: io.read_bps io.write_bps io.read_iops io.write_iops cpu.cores cpu.weight cpu.cpus cpu.numa_nodes cpu.migrate_memory memory.max memory.high memory.low memory.swap_max\n\nExamples:\n  dbcage set DEMO io.read_bps=200MiB cpu.cores=8\n  dbcage set ORA1 cpu.cores=4 ORA2 cpu.cores=32 --dry-run   # a live swap: see who moves\n  dbcage set ORA1 cpu.cores=4 ORA2 cpu.cores=32             # both or neither\n  dbcage set DEMO cpu.cpus=0-31 --persist\n  dbcage set DEMO --reset io.read_bps\n  dbcage set DEMO --reset"
    )]
    Set {
        /// The tenant whose limits change (its `name` in the policy).
        #[arg(add = ArgValueCandidates::new(tenant_candidates))]
        tenant: String,
        /// KEY=VALUE pairs, e.g. io.read_bps=200MiB cpu.cpus=0-31 memory.high=30GiB; a word
        /// without `=` names the next tenant, whose pairs follow (`A cpu.cores=4 B
        /// cpu.cores=32`). With --reset: the keys to drop.
        #[arg(required_unless_present = "reset", add = ArgValueCandidates::new(key_candidates))]
        values: Vec<String>,
        /// Validate and plan the change and say what it would do (which tenants move to which
        /// NUMA nodes, how much memory would move); change nothing.
        #[arg(long, conflicts_with = "reset")]
        dry_run: bool,
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
        /// Print the daemon's answer as JSON (ok, message, applied_us, errors, overrides).
        #[arg(long)]
        json: bool,
    },
    /// Make the running daemon re-read the policy (as SIGHUP does) and report the outcome: on
    /// any error the running policy stays and the errors are printed (file:line:col).
    Reload,
    /// Start a command already inside a tenant's group (as cgexec does), so no window is left.
    /// Creates the groups and writes the policy's values first, unless a daemon is running and
    /// the tenant's groups exist: then it only joins them (the daemon holds the values).
    Exec {
        /// The tenant to start the command in (its `name` in the policy).
        #[arg(add = ArgValueCandidates::new(tenant_candidates))]
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
    /// Record each tenant's IO latency in the kernel (eBPF) for a while: per tenant and
    /// operation p50/p99 and the share spent waiting in the throttle, or one tenant's
    /// histogram. Needs a kernel with BTF and CAP_BPF with CAP_PERFMON (root has them).
    Iolat(crate::iolat::command::IolatArgs),
    /// Turn on the kernel's iocost (cgroup v2) for disks so that `[tenant.io] weight` acts:
    /// measure each disk with the probe, propose io.cost.model and io.cost.qos lines, show
    /// them, and write them only with --apply (--revert puts back what was there).
    Iocost(crate::iocost::command::IocostArgs),
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
    /// Under systemd: write the drop-in that delegates a tenant's service its cgroup subtree
    /// (`/etc/systemd/system/UNIT.d/50-dbcage-delegate.conf`, `Delegate=yes`) for every unit
    /// whose exempt processes would otherwise run under the unit's IO limits, and reload
    /// systemd. dbcage then keeps them in an `exempt` leaf inside the unit. It never restarts
    /// a unit: `plan` says which ones need a restart first.
    SystemdSetup {
        /// Show the drop-ins it would write, and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Move a tenant's processes back to the parent cgroup and remove its groups.
    Release {
        /// Tenants to release.
        #[arg(add = ArgValueCandidates::new(tenant_candidates))]
        tenants: Vec<String>,
        /// Release every tenant and remove dbcage's root group.
        #[arg(long, conflicts_with = "tenants")]
        all: bool,
    },
}

/// `--metrics`: an address, or `off` (`None`).
#[derive(Debug, Clone, Copy)]
pub struct MetricsAddr(pub Option<std::net::SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("`{s}` is not an address; use IP:PORT such as 127.0.0.1:9477, or off"))
}

/// Writes dbcage.8 and one dbcage-SUBCOMMAND.8 per visible subcommand into `dir`, generated
/// from the clap definition (clap_mangen). Returns the files written.
pub fn generate_man(dir: &Path) -> Result<Vec<PathBuf>> {
    use clap::CommandFactory;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    let mut render = |cmd: clap::Command, see_also: &str, top: bool| -> Result<()> {
        let name = match cmd.get_name() {
            "dbcage" => "dbcage".to_string(),
            sub => format!("dbcage-{sub}"),
        };
        let path = dir.join(format!("{name}.8"));
        let page = super::manual::render(cmd, "8", see_also, top);
        std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
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
        .map(|s| format!("\\fBdbcage\\-{}\\fR(8)", s.get_name().replace('-', "\\-")))
        .collect();
    refs.push("\\fBdbcage.toml\\fR(5)".into());
    refs.push("\\fBsystemctl\\fR(1)".into());
    render(cmd.clone(), &refs.join(",\n"), true)?;
    for sub in subs {
        render(sub, "\\fBdbcage\\fR(8), \\fBdbcage.toml\\fR(5)", false)?;
    }
    Ok(written)
}

/// Writes the bash (`dbcage.bash`), zsh (`_dbcage`) and fish (`dbcage.fish`) completions into
/// `dir`. They are clap_complete's dynamic registrations: at each TAB the shell asks
/// `COMPLETE=<shell> dbcage -- WORDS...`, which answers from the same clap definition, so
/// tenant names (`dbcage set <TAB>`, `status`, `exec`, `release`) and the keys after
/// `dbcage set TENANT` are completed, not only subcommands and options. Returns the files
/// written.
pub fn generate_completions(dir: &Path) -> Result<Vec<PathBuf>> {
    use clap_complete::env::{Bash, EnvCompleter, Fish, Zsh};
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let shells: [(&dyn EnvCompleter, &str); 3] = [
        (&Bash, "dbcage.bash"),
        (&Zsh, "_dbcage"),
        (&Fish, "dbcage.fish"),
    ];
    shells
        .into_iter()
        .map(|(shell, file)| {
            let path = dir.join(file);
            let mut buf = Vec::new();
            shell.write_registration("COMPLETE", "dbcage", "dbcage", "dbcage", &mut buf)?;
            std::fs::write(&path, buf)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// Answers a shell's completion request (`COMPLETE=bash dbcage -- ...`) and exits; returns at
/// once otherwise.
pub fn complete_if_asked() {
    use clap::CommandFactory;
    clap_complete::CompleteEnv::with_factory(|| {
        let full = Cli::command();
        // Without the hidden packaging subcommands.
        clap::Command::new("dbcage")
            .args(full.get_arguments().cloned())
            .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
    })
    .complete();
}

/// Tenant names for completion: from the policy when this user may read it (`DBCAGE_CONFIG` or
/// the default), else the groups dbcage created under its default root (cgroupfs is readable
/// by everyone; the policy is root's, mode 0600).
fn tenant_candidates() -> Vec<CompletionCandidate> {
    let config = std::env::var_os("DBCAGE_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(policy::DEFAULT_POLICY));
    let mut names: Vec<String> = match policy::load(&config, &policy::SystemAccounts) {
        Ok(l) => l.policy.tenants.iter().map(|t| t.name.clone()).collect(),
        Err(_) => [
            "/sys/fs/cgroup/*/dbcage/*/limited",
            "/sys/fs/cgroup/dbcage/*/limited",
        ]
        .iter()
        .filter_map(|p| glob::glob(p).ok())
        .flatten()
        .flatten()
        .filter_map(|p| Some(p.parent()?.file_name()?.to_string_lossy().into_owned()))
        .collect(),
    };
    names.sort();
    names.dedup();
    names.into_iter().map(CompletionCandidate::new).collect()
}

/// The keys `dbcage set TENANT` takes, as `KEY=` (the shell adds no space after `=`).
fn key_candidates() -> Vec<CompletionCandidate> {
    crate::engine::live::KEYS
        .iter()
        .map(|(k, _)| CompletionCandidate::new(format!("{k}=")))
        .collect()
}
