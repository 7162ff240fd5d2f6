//! `dbcage top`: a full-screen view of every tenant, refreshed every second, with its limits
//! beside its usage; tenants at a limit are marked. Sortable by column; fits 80 columns.
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
const COLUMNS: [&str; 7] = [
    "TENANT",
    "PROC",
    "READ MiB/s",
    "WRITE MiB/s",
    "IOPS r/w",
    "CPU",
    "MEM MiB",
];

fn sort_key(t: &TenantStatus, col: usize) -> f64 {
    let r = t.io.rates.unwrap_or_default();
    match col {
        1 => t.processes as f64,
        2 => r.read_bytes_per_second,
        3 => r.write_bytes_per_second,
        4 => r.read_iops + r.write_iops,
        5 => t.cpu_cores_used.unwrap_or(0.0),
        6 => t.memory.current_bytes.unwrap_or(0) as f64,
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
        Cell::from(
            r.map(|r| format!("{:.0}/{:.0}", r.read_iops, r.write_iops))
                .unwrap_or_else(|| "-".into()),
        ),
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

fn draw(frame: &mut Frame, sample: &Sample, view: &View, controllers: &str) {
    let [head, body, foot] = Split::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(2),
    ])
    .areas(frame.area());
    frame.render_widget(
        Paragraph::new(format!("dbcage top — {controllers}")).bold(),
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
        let c = Cell::from(*c);
        if i == view.sort {
            c.style(Style::default().add_modifier(Modifier::REVERSED))
        } else {
            c
        }
    }))
    .style(Style::default().add_modifier(Modifier::BOLD));
    let widths = [
        Constraint::Length(12),
        Constraint::Length(4),
        Constraint::Length(12),
        Constraint::Length(12),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(11),
    ];
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
pub fn run(fs: &HostFs, layout: &Layout, policy: &Policy, interval: Duration) -> Result<()> {
    let controllers = layout.setup.describe();
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
                next = Instant::now() + interval;
            }
            terminal.draw(|f| draw(f, &cur, &view, &controllers))?;
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
                        KeyCode::Char(c @ '1'..='7') => view.sort = c as usize - '1' as usize,
                        _ => {}
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}
