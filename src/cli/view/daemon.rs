//! The daemon's state as `status` prints it.

use serde::Serialize;

/// What `status` says of the daemon (`--json`: `daemon.state` is `running`, `not-running` or
/// `unknown`).
#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum DaemonState {
    Running(crate::control::DaemonHealth),
    NotRunning { socket: String },
    Unknown { reason: String },
}

/// `2h03m`, `5m10s`, `42s`, `0.4s`.
pub fn span(seconds: f64) -> String {
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

#[cfg(test)]
mod status_text_tests {
    use super::{span, DaemonState};
    use crate::cli::view::status::replication_note;
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
