//! `dbcage top`: a full-screen view of every tenant, refreshed every second, with its limits
//! beside its usage (value/limit, IOPS too); tenants at a limit are marked. A head line with
//! the clock, the controllers and the daemon's state; sortable by column, the sort column marked
//! with ▼/▲; fits 80 columns (a narrower terminal is told so rather than silently cut).
//! Only reads (the same `status` sampler as `dbcage status`).

use std::time::{Duration, Instant};

use anyhow::Result;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout as Split};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use crate::cgroup::Layout;
use crate::hostfs::HostFs;
use crate::policy::Policy;
use crate::status::{self, Sample, TenantStatus};

/// Columns, in display order; the sort key of each.
const COLUMNS: [&str; 8] = [
    "TENANT",
    "PROC",
    "READ MiB/s",
    "WRITE MiB/s",
    "READ IOPS",
    "WRITE IOPS",
    "CPU",
    "MEM MiB",
];

/// Column widths: 73 plus 7 spaces between them make 80.
const WIDTHS: [u16; 8] = [9, 4, 11, 11, 10, 10, 9, 9];

fn sort_key(t: &TenantStatus, col: usize) -> f64 {
    let r = t.io.rates.unwrap_or_default();
    match col {
        1 => t.processes as f64,
        2 => r.read_bytes_per_second,
        3 => r.write_bytes_per_second,
        4 => r.read_iops,
        5 => r.write_iops,
        6 => t.cpu_cores_used.unwrap_or(0.0),
        7 => t.memory.current_bytes.unwrap_or(0) as f64,
        _ => 0.0,
    }
}

struct View {
    sort: usize,
    reverse: bool,
}

fn with_limit(v: Option<f64>, limit: Option<f64>, prec: usize) -> String {
    let v = v
        .map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".into());
    match limit {
        Some(l) => format!("{v}/{l:.prec$}"),
        None => v,
    }
}

fn row(t: &TenantStatus) -> Row<'static> {
    let r = t.io.rates;
    let mib = |b: Option<u64>| b.map(|b| b as f64 / 1048576.0);
    let at_limit = !t.at_limit.is_empty();
    let name = if at_limit {
        format!("*{}", t.name)
    } else {
        t.name.clone()
    };
    let cells = vec![
        Cell::from(name),
        Cell::from(t.processes.to_string()),
        Cell::from(with_limit(
            r.map(|r| r.read_bytes_per_second / 1048576.0),
            mib(t.io.limits.read_bps),
            1,
        )),
        Cell::from(with_limit(
            r.map(|r| r.write_bytes_per_second / 1048576.0),
            mib(t.io.limits.write_bps),
            1,
        )),
        Cell::from(with_limit(
            r.map(|r| r.read_iops),
            t.io.limits.read_iops.map(|l| l as f64),
            0,
        )),
        Cell::from(with_limit(
            r.map(|r| r.write_iops),
            t.io.limits.write_iops.map(|l| l as f64),
            0,
        )),
        Cell::from(with_limit(t.cpu_cores_used, t.cpu_quota_cores, 2)),
        Cell::from(with_limit(
            t.memory.current_bytes.map(|b| b as f64 / 1048576.0),
            mib(t.memory_limit_bytes),
            0,
        )),
    ];
    let style = if at_limit {
        Style::default().add_modifier(Modifier::BOLD).red()
    } else {
        Style::default()
    };
    Row::new(cells).style(style)
}

/// The head line: the time of the sample, the controllers, the daemon's state.
pub struct Head<'a> {
    pub clock: String,
    pub controllers: &'a str,
    pub daemon: String,
}

fn draw(frame: &mut Frame, sample: &Sample, view: &View, head_line: &Head) {
    let [head, body, foot] = Split::vertical([
        Constraint::Length(2),
        Constraint::Min(3),
        Constraint::Length(2),
    ])
    .areas(frame.area());
    let narrow = if frame.area().width < 80 {
        "(needs 80 columns: some are cut) "
    } else {
        ""
    };
    frame.render_widget(
        Paragraph::new(vec![
            Line::from(format!(
                "dbcage top {narrow}{} — {}",
                head_line.clock, head_line.controllers
            ))
            .bold(),
            Line::from(format!("daemon: {}", head_line.daemon)),
        ]),
        head,
    );
    let mut tenants: Vec<&TenantStatus> = sample.tenants.iter().collect();
    if view.sort == 0 {
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
    } else {
        tenants.sort_by(|a, b| sort_key(b, view.sort).total_cmp(&sort_key(a, view.sort)));
    }
    if view.reverse {
        tenants.reverse();
    }
    let header = Row::new(COLUMNS.iter().enumerate().map(|(i, c)| {
        if i == view.sort {
            // Name ascending by default, figures descending; `r` turns it round.
            let descending = (i != 0) != view.reverse;
            Cell::from(format!("{c}{}", if descending { "▼" } else { "▲" }))
                .style(Style::default().add_modifier(Modifier::REVERSED))
        } else {
            Cell::from(*c)
        }
    }))
    .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = WIDTHS.map(Constraint::Length);
    let table = Table::new(tenants.into_iter().map(row), widths)
        .header(header)
        .column_spacing(1);
    frame.render_widget(table, body);
    let keys = Line::from(vec![
        "q".bold(),
        " quit  ".into(),
        "←/→".bold(),
        " sort column  ".into(),
        "r".bold(),
        " reverse  ".into(),
        "*".bold(),
        " at a limit (value/limit)".into(),
    ]);
    let notes: Vec<String> = sample
        .tenants
        .iter()
        .filter(|t| !t.at_limit.is_empty())
        .map(|t| format!("{}: {}", t.name, t.at_limit.join(",")))
        .collect();
    frame.render_widget(
        Paragraph::new(vec![keys, Line::from(notes.join("  "))]),
        foot,
    );
}

/// Runs the view until `q` (or Esc, or Ctrl-C). The terminal is restored on every exit path.
/// `daemon` says how the daemon is doing (asked once per refresh).
pub fn run(
    fs: &HostFs,
    layout: &Layout,
    policy: &Policy,
    interval: Duration,
    daemon: &dyn Fn() -> String,
) -> Result<()> {
    let controllers = layout.setup.describe();
    let clock = || chrono::Local::now().format("%H:%M:%S").to_string();
    let mut head = Head {
        clock: clock(),
        controllers: &controllers,
        daemon: daemon(),
    };
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        let mut view = View {
            sort: 0,
            reverse: false,
        };
        let mut prev = status::collect(fs, layout, policy, &[], None);
        let mut cur = prev.clone();
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                let mut s = status::collect(fs, layout, policy, &[], None);
                status::with_rates(&prev, &mut s);
                prev = s.clone();
                cur = s;
                head.clock = clock();
                head.daemon = daemon();
                next = Instant::now() + interval;
            }
            terminal.draw(|f| draw(f, &cur, &view, &head))?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c')
                            if k.modifiers.contains(event::KeyModifiers::CONTROL) =>
                        {
                            return Ok(())
                        }
                        KeyCode::Right | KeyCode::Char('>') | KeyCode::Tab => {
                            view.sort = (view.sort + 1) % COLUMNS.len()
                        }
                        KeyCode::Left | KeyCode::Char('<') => {
                            view.sort = (view.sort + COLUMNS.len() - 1) % COLUMNS.len()
                        }
                        KeyCode::Char('r') => view.reverse = !view.reverse,
                        KeyCode::Char(c @ '1'..='8') => view.sort = c as usize - '1' as usize,
                        _ => {}
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_snapshot::assert_snapshot;
    use ratatui::backend::TestBackend;

    fn screen(width: u16, sample: &Sample, view: &View) -> String {
        let mut t = ratatui::Terminal::new(TestBackend::new(width, 8)).unwrap();
        let head = Head {
            clock: "04:20:31".into(),
            controllers: "blkio=v1 cpu=v1 cpuacct=v1 cpuset=v1 memory=v1",
            daemon: "running (pid 812, up 2h03m), placing processes as they start".into(),
        };
        t.draw(|f| draw(f, sample, view, &head)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..buf.area.height {
            let line: String = (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect();
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// IOPS against their limits, the clock and the daemon in the head, the sort column marked;
    /// every header whole at 80 columns, and a narrower terminal told (issue 21).
    #[test]
    fn top_at_80_and_60_columns() {
        let mut t = crate::status::tests::tenant(8 << 20, 11.0);
        t.io.limits.read_iops = Some(2000);
        t.io.limits.write_iops = Some(500);
        t.io.rates = Some(crate::status::IoRates {
            read_bytes_per_second: 4.0 * 1048576.0,
            write_bytes_per_second: 0.0,
            read_iops: 41.0,
            write_iops: 7.0,
        });
        t.cpu_cores_used = Some(0.5);
        t.at_limit = vec!["cpu.cores".into()];
        let sample = Sample {
            at: Instant::now(),
            tenants: vec![t],
        };
        let view = View {
            sort: 4,
            reverse: false,
        };
        let wide = screen(80, &sample, &view);
        for c in COLUMNS {
            assert!(wide.contains(c), "header `{c}` cut:\n{wide}");
        }
        let narrow = screen(60, &sample, &view);
        assert_snapshot("top", &format!("{wide}=== 60 columns\n{narrow}"));
    }
}
