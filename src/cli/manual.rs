//! The man pages: dbcage(8) and one dbcage-SUBCOMMAND(8) per subcommand, rendered from the clap
//! definition by clap_mangen, in the section order of man-pages(7): NAME, SYNOPSIS,
//! DESCRIPTION, OPTIONS, SUBCOMMANDS, EXIT STATUS, ENVIRONMENT, FILES, NOTES, EXAMPLES, SEE ALSO.
//!
//! clap_mangen puts a command's `after_help` under a section it calls EXTRA, which no man reader
//! looks for. Here the `after_help` text is split into paragraphs instead: one that starts with
//! `Examples:` becomes EXAMPLES, any other NOTES. The sections that describe the program as a
//! whole (exit status, environment, files, examples) are written here, once.

use std::io::Write;

/// The exit codes, as `cli::main` returns them.
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success (also when a pipe such as `dbcage status | head` closes early)."),
    ("1", "A runtime failure: a kernel write failed (the message names the file, the value and the kernel's error), a file could not be read, the daemon could not be reached."),
    ("2", "The policy or the command line is invalid, or the request was refused; nothing was changed. Every problem of the policy is listed, each as FILE:LINE:COL."),
];

const ENVIRONMENT: &[(&str, &str)] = &[
    ("DBCAGE_CONFIG", "The policy file, as \\-\\-config (default /etc/dbcage/dbcage.toml)."),
    ("DBCAGE_SOCKET", "The daemon's control socket, as \\-\\-socket (default /run/dbcage/AGENT_ROOT.sock)."),
    ("DBCAGE_LOG", "Log filter in tracing's EnvFilter syntax (`info`, `dbcage=debug`); the daemon logs at info by default, other commands only warnings."),
    ("DBCAGE_COMM_SOURCE", "Where a scan reads process names for rules on `comm`: `iterator` (an eBPF task iterator, one pass for every process) or `proc` (/proc/PID/comm each). Unset: the iterator from 2,000 processes on, where it loads; for comparing the two."),
];

const FILES: &[(&str, &str)] = &[
    ("/etc/dbcage/dbcage.toml", "The policy (root, mode 0600); see dbcage.toml(5)."),
    ("/etc/dbcage/conf.d/*.toml", "Drop-ins, merged in name order after the main file; `dbcage set \\-\\-persist` writes 90\\-set\\-TENANT.toml here."),
    ("/run/dbcage/AGENT_ROOT.sock", "The running daemon's control socket (`set`, `reload`, `status`)."),
    ("/sys/fs/cgroup/CONTROLLER/dbcage/TENANT/{limited,exempt}", "The groups dbcage creates, per hierarchy (under `agent.parent`, named `agent.root`)."),
    ("/lib/systemd/system/dbcage.service", "The unit that runs the daemon."),
];

const EXAMPLES: &str = "\
dbcage check                       # validate the policy against this host
dbcage plan                        # what apply would do, with reasons
dbcage apply                       # make the kernel match the policy
systemctl enable --now dbcage      # or keep it in place with the daemon
dbcage status -v                   # per tenant: processes, limits, usage
dbcage set DEMO io.read_bps=200MiB # change a limit live
dbcage exec DEMO -- rman target /  # start a command inside a tenant
dbcage probe /dev/sdb --bs 8k      # what the disk delivers, and its knee";

/// Escapes text for roff: backslashes, hyphens (so that `--json` is not a dash), and a leading
/// `.` or `'` (a request otherwise).
fn escape(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

fn tagged(out: &mut String, heading: &str, items: &[(&str, &str)]) {
    out.push_str(&format!(".SH \"{heading}\"\n"));
    for (tag, text) in items {
        // Already escaped where they hold hyphens; only backticks become plain quotes here.
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            tag.replace('-', "\\-"),
            text.replace('`', "\"")
        ));
    }
}

/// The `after_help` of a command as NOTES and EXAMPLES (see the module doc).
fn after_help_sections(cmd: &clap::Command) -> (Vec<String>, Vec<String>) {
    let text = cmd
        .get_after_long_help()
        .or(cmd.get_after_help())
        .map(|t| t.to_string())
        .unwrap_or_default();
    let (mut notes, mut examples) = (Vec::new(), Vec::new());
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        match para.strip_prefix("Examples:") {
            Some(rest) => examples.extend(rest.lines().map(|l| l.trim().to_string())),
            None => notes.push(para.to_string()),
        }
    }
    examples.retain(|l| !l.is_empty());
    (notes, examples)
}

/// One page: `top` is dbcage(8), which carries the program-wide sections.
pub fn render(cmd: clap::Command, section: &str, see_also: &str, top: bool) -> Vec<u8> {
    let man = clap_mangen::Man::new(cmd.clone())
        .section(section)
        .manual("System Administration")
        .source(format!("dbcage {}", env!("CARGO_PKG_VERSION")));
    let mut buf = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = man.render_title(&mut buf);
    let _ = man.render_name_section(&mut buf);
    let _ = man.render_synopsis_section(&mut buf);
    let _ = man.render_description_section(&mut buf);
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        let _ = man.render_options_section(&mut buf);
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        let _ = man.render_subcommands_section(&mut buf);
    }
    let mut out = String::new();
    if top {
        tagged(&mut out, "EXIT STATUS", EXIT_STATUS);
        tagged(&mut out, "ENVIRONMENT", ENVIRONMENT);
        tagged(&mut out, "FILES", FILES);
    } else {
        out.push_str(
            ".SH \"EXIT STATUS\"\n0 on success, 1 on a runtime failure, 2 when the policy or the command line is invalid and nothing was changed; see \\fBdbcage\\fR(8).\n",
        );
    }
    let (notes, examples) = after_help_sections(&cmd);
    if !notes.is_empty() {
        out.push_str(".SH NOTES\n");
        for n in notes {
            out.push_str(&format!("{}\n.PP\n", escape(&n)));
        }
    }
    if top || !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n.nf\n");
        if top {
            for line in EXAMPLES.lines() {
                out.push_str(&format!("{}\n", escape(line)));
            }
        }
        for e in examples {
            out.push_str(&format!("{}\n", escape(&e)));
        }
        out.push_str(".fi\n");
    }
    out.push_str(&format!(".SH \"SEE ALSO\"\n{see_also}\n"));
    let _ = buf.write_all(out.as_bytes());
    buf
}

#[cfg(test)]
mod tests {
    fn pages() -> Vec<(String, String)> {
        let dir = tempfile::tempdir().unwrap();
        crate::cli::args::generate_man(dir.path())
            .unwrap()
            .into_iter()
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect()
    }

    fn sections(page: &str) -> Vec<&str> {
        page.lines()
            .filter_map(|l| l.strip_prefix(".SH "))
            .map(|s| s.trim_matches('"'))
            .collect()
    }

    /// dbcage(8) has the sections an admin looks for, in man-pages(7) order; no page has the
    /// non-standard EXTRA.
    #[test]
    fn pages_have_the_standard_sections_in_order() {
        let pages = pages();
        let top = &pages.iter().find(|(n, _)| n == "dbcage.8").unwrap().1;
        assert_eq!(
            sections(top),
            [
                "NAME",
                "SYNOPSIS",
                "DESCRIPTION",
                "OPTIONS",
                "SUBCOMMANDS",
                "EXIT STATUS",
                "ENVIRONMENT",
                "FILES",
                "EXAMPLES",
                "SEE ALSO"
            ]
        );
        for var in [
            "DBCAGE_CONFIG",
            "DBCAGE_SOCKET",
            "DBCAGE_LOG",
            "DBCAGE_COMM_SOURCE",
        ] {
            assert!(top.contains(var), "{var} missing from dbcage(8)");
        }
        for (name, page) in &pages {
            let s = sections(page);
            assert!(!s.contains(&"EXTRA"), "{name}: {s:?}");
            assert!(s.contains(&"EXIT STATUS"), "{name}: {s:?}");
        }
        let set = &pages.iter().find(|(n, _)| n == "dbcage-set.8").unwrap().1;
        assert!(sections(set).ends_with(&["EXIT STATUS", "NOTES", "EXAMPLES", "SEE ALSO"]));
        assert!(set.contains("dbcage set DEMO io.read_bps=200MiB"), "{set}");
    }

    /// Every argument of every visible subcommand says what it is (`--json`, `<TENANT>`).
    #[test]
    fn every_argument_is_described() {
        use clap::CommandFactory;
        let cmd = crate::cli::args::Cli::command();
        let mut bare = Vec::new();
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            for a in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                let id = a.get_id().as_str();
                if a.get_help().is_none() && !matches!(id, "help" | "version") {
                    bare.push(format!("{} {id}", sub.get_name()));
                }
            }
        }
        assert!(bare.is_empty(), "arguments without help: {bare:?}");
    }
}
