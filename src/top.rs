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
use crate::iolat::{self, loader::IoLatency};
use crate::policy::Policy;
use crate::status::{self, Sample, TenantStatus};

/// Columns, in display order; the sort key of each.
const COLUMNS: [&str; 9] = [
    "TENANT", "PROC", "RD MiB/s", "WR MiB/s", "RD IOPS", "WR IOPS", "CPU", "MEM MiB", "NUMA",
];

/// Column widths: 71 plus 8 spaces between them make 79.
const WIDTHS: [u16; 9] = [9, 4, 9, 9, 9, 9, 9, 9, 4];

/// The IOPS columns' other face (key `l`): each tenant's IO latency over the last interval.
const LATENCY_COLUMNS: [&str; 2] = ["IO p50 ms", "IO p99 ms"];

/// The IOPS columns' third face (key `p`): pressure stall (PSI avg10, % of time) per tenant:
/// io `some/full`, and `some` of cpu and memory.
const PRESSURE_COLUMNS: [&str; 2] = ["IO s/f %", "CPU/MEM %"];

/// `io some/full` and `cpu some/memory some` avg10 percentages, or `-` where the host has none.
fn pressure_cells(t: &TenantStatus) -> (String, String) {
    let Some(p) = &t.pressure else {
        return ("-".into(), "-".into());
    };
    let pct = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
    (
        format!(
            "{}/{}",
            pct(p.io.as_ref().map(|x| x.some_avg10)),
            pct(p.io.as_ref().and_then(|x| x.full_avg10))
        ),
        format!(
            "{}/{}",
            pct(p.cpu.as_ref().map(|x| x.some_avg10)),
            pct(p.memory.as_ref().map(|x| x.some_avg10))
        ),
    )
}

/// p50 and p99 of each tenant's IO in the last interval, in seconds, over its own disks.
type Latencies = std::collections::BTreeMap<String, (f64, f64)>;

fn sort_key(t: &TenantStatus, col: usize, lat: Option<&Latencies>, pressure: bool) -> f64 {
    let r = t.io.rates.unwrap_or_default();
    let psi = |p: Option<&crate::cgroup::stats::Pressure>| p.map_or(0.0, |p| p.some_avg10);
    let pr = t.pressure.as_ref();
    let p = |i: usize| {
        lat.and_then(|l| l.get(&t.name))
            .map_or(0.0, |p| if i == 0 { p.0 } else { p.1 })
    };
    match col {
        1 => t.processes as f64,
        2 => r.read_bytes_per_second,
        3 => r.write_bytes_per_second,
        4 if pressure => psi(pr.and_then(|p| p.io.as_ref())),
        5 if pressure => psi(pr.and_then(|p| p.cpu.as_ref())),
        4 if lat.is_some() => p(0),
        5 if lat.is_some() => p(1),
        4 => r.read_iops,
        5 => r.write_iops,
        6 => t.cpu_cores_used.unwrap_or(0.0),
        7 => t.memory.current_bytes.unwrap_or(0) as f64,
        8 => t.numa_local_share.unwrap_or(-1.0),
        _ => 0.0,
    }
}

struct View {
    sort: usize,
    reverse: bool,
    /// Show IO latency instead of IOPS.
    latency: bool,
    /// Show pressure instead of IOPS (wins over `latency`).
    pressure: bool,
}

/// The IO latency program while `top` runs, or why there is none (said in the footer).
struct LatencySource {
    prog: Result<IoLatency, String>,
    prev: iolat::Snapshot,
    owners: iolat::KeptOwners,
    /// Where the tenants' groups are, for walking them again (`KeptOwners`).
    layout: Layout,
    names: Vec<String>,
}

impl LatencySource {
    fn start(layout: &Layout, policy: &Policy) -> LatencySource {
        let prog = IoLatency::load().map_err(|e| e.to_string());
        let prev = prog.as_ref().map(IoLatency::read).unwrap_or_default();
        LatencySource {
            prog,
            prev,
            owners: iolat::KeptOwners::default(),
            layout: layout.clone(),
            names: policy.tenants.iter().map(|t| t.name.clone()).collect(),
        }
    }

    /// p50/p99 per tenant since the last call, over the disks `status` lists for the tenant
    /// (its storage; a disk below, such as a loop device's file, would count twice).
    fn sample(&mut self, sample: &Sample) -> Latencies {
        let Ok(prog) = &self.prog else {
            return Latencies::new();
        };
        let snap = prog.read();
        let delta = snap.since(&self.prev);
        let (layout, names) = (&self.layout, &self.names);
        let owners = (self.owners).of(&snap, || iolat::command::owners(layout, names));
        let by_tenant = delta.by_tenant(owners);
        self.prev = snap;
        let mut per: std::collections::BTreeMap<&str, iolat::Hist> = Default::default();
        for (k, s) in by_tenant {
            let Some(t) = sample.tenants.iter().find(|t| t.name == k.tenant) else {
                continue;
            };
            let dev = k.dev.to_string();
            if t.devices.is_empty() || t.devices.iter().any(|d| d.device == dev) {
                per.entry(t.name.as_str()).or_default().add(&s.total);
            }
        }
        per.into_iter()
            .filter_map(|(t, h)| Some((t.to_string(), (h.quantile(0.5)?, h.quantile(0.99)?))))
            .collect()
    }
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

fn row(t: &TenantStatus, lat: Option<&Latencies>, pressure: bool) -> Row<'static> {
    let r = t.io.rates;
    let mib = |b: Option<u64>| b.map(|b| b as f64 / 1048576.0);
    let at_limit = !t.at_limit.is_empty();
    let name = if at_limit {
        format!("*{}", t.name)
    } else {
        t.name.clone()
    };
    let mut cells = vec![
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
        Cell::from(match lat {
            Some(l) => l
                .get(&t.name)
                .map_or("-".into(), |p| format!("{:.2}", p.0 * 1e3)),
            None => with_limit(
                r.map(|r| r.read_iops),
                t.io.limits.read_iops.map(|l| l as f64),
                0,
            ),
        }),
        Cell::from(match lat {
            Some(l) => l
                .get(&t.name)
                .map_or("-".into(), |p| format!("{:.2}", p.1 * 1e3)),
            None => with_limit(
                r.map(|r| r.write_iops),
                t.io.limits.write_iops.map(|l| l as f64),
                0,
            ),
        }),
        Cell::from(with_limit(t.cpu_cores_used, t.cpu_quota_cores, 2)),
        Cell::from(with_limit(
            t.memory.current_bytes.map(|b| b as f64 / 1048576.0),
            mib(t.memory_limit_bytes),
            0,
        )),
        // the share of a NUMA-pinned tenant's memory on its own nodes
        Cell::from(
            t.numa_local_share
                .map_or("-".into(), |l| format!("{:.0}%", (l * 100.0).floor())),
        ),
    ];
    if pressure {
        let (io, cpu_mem) = pressure_cells(t);
        cells[4] = Cell::from(io);
        cells[5] = Cell::from(cpu_mem);
    }
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

fn draw(
    frame: &mut Frame,
    sample: &Sample,
    view: &View,
    head_line: &Head,
    latency: (&Latencies, Option<&str>),
) {
    let lat = (view.latency && !view.pressure).then_some(latency.0);
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
        tenants.sort_by(|a, b| {
            sort_key(b, view.sort, lat, view.pressure).total_cmp(&sort_key(
                a,
                view.sort,
                lat,
                view.pressure,
            ))
        });
    }
    if view.reverse {
        tenants.reverse();
    }
    let header = Row::new(COLUMNS.iter().enumerate().map(|(i, c)| {
        let c = match (lat, i) {
            _ if view.pressure && (i == 4 || i == 5) => &PRESSURE_COLUMNS[i - 4],
            (Some(_), 4 | 5) => &LATENCY_COLUMNS[i - 4],
            _ => c,
        };
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
    let table = Table::new(
        tenants.into_iter().map(|t| row(t, lat, view.pressure)),
        widths,
    )
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
        "l".bold(),
        " latency  ".into(),
        "p".bold(),
        " PSI  ".into(),
        "*".bold(),
        " at a limit (value/limit)".into(),
    ]);
    let mut notes: Vec<String> = sample
        .tenants
        .iter()
        .filter(|t| !t.at_limit.is_empty())
        .map(|t| format!("{}: {}", t.name, t.at_limit.join(",")))
        .collect();
    if view.pressure && sample.tenants.iter().all(|t| t.pressure.is_none()) {
        notes.insert(0, "no pressure: the kernel keeps it per group only on cgroup v2 with PSI on (CONFIG_PSI, not psi=0)".into());
    }
    if let (true, false, Some(why)) = (view.latency, view.pressure, latency.1) {
        notes.insert(0, format!("no IO latency: {why}"));
    }
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
            latency: false,
            pressure: false,
        };
        let mut latency_source: Option<LatencySource> = None;
        let mut latencies = Latencies::new();
        // The groups stay open from one sample to the next.
        let kept = crate::hostfs::KeptDirs::new();
        let sample = || {
            let s = status::collect(
                fs,
                layout,
                policy,
                &[],
                None,
                status::Resident::Skip,
                Some(&kept),
            );
            kept.sweep();
            s
        };
        let mut prev = sample();
        let mut cur = prev.clone();
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                let mut s = sample();
                status::with_rates(&prev, &mut s);
                prev = s.clone();
                if let Some(src) = &mut latency_source {
                    latencies = src.sample(&s);
                }
                cur = s;
                head.clock = clock();
                head.daemon = daemon();
                next = Instant::now() + interval;
            }
            let why = latency_source
                .as_ref()
                .and_then(|s| s.prog.as_ref().err().map(String::as_str));
            terminal.draw(|f| draw(f, &cur, &view, &head, (&latencies, why)))?;
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
                        KeyCode::Char('p') => view.pressure = !view.pressure,
                        KeyCode::Char('l') => {
                            view.latency = !view.latency;
                            // Loaded on first use; it stays for the rest of the run.
                            if latency_source.is_none() {
                                latency_source = Some(LatencySource::start(layout, policy));
                            }
                        }
                        KeyCode::Char(c @ '1'..='9') => view.sort = c as usize - '1' as usize,
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
        t.draw(|f| draw(f, sample, view, &head, (&Latencies::new(), None)))
            .unwrap();
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
        t.numa_local_share = Some(0.9913);
        t.at_limit = vec!["cpu.cores".into()];
        let sample = Sample {
            at: Instant::now(),
            tenants: vec![t],
        };
        let view = View {
            sort: 4,
            reverse: false,
            latency: false,
            pressure: false,
        };
        let wide = screen(80, &sample, &view);
        for c in COLUMNS {
            assert!(wide.contains(c), "header `{c}` cut:\n{wide}");
        }
        let narrow = screen(60, &sample, &view);
        assert_snapshot("top", &format!("{wide}=== 60 columns\n{narrow}"));
    }

    /// Key `p`: pressure in the IOPS columns; `-` and a note where the host keeps none (v1).
    #[test]
    fn pressure_view() {
        let mut t = crate::status::tests::tenant(8 << 20, 11.0);
        let psi = |some: f64, full: Option<f64>| crate::cgroup::stats::Pressure {
            some_avg10: some,
            some_avg60: 0.0,
            some_total_seconds: 0.0,
            full_avg10: full,
            full_avg60: None,
            full_total_seconds: None,
        };
        t.pressure = Some(crate::cgroup::stats::PressureSet {
            io: Some(psi(42.4, Some(17.0))),
            cpu: Some(psi(3.0, None)),
            memory: Some(psi(0.0, None)),
        });
        let view = View {
            sort: 4,
            reverse: false,
            latency: false,
            pressure: true,
        };
        let sample = Sample {
            at: Instant::now(),
            tenants: vec![t.clone()],
        };
        let s = screen(80, &sample, &view);
        assert!(s.contains("IO s/f %▼") && s.contains("CPU/MEM %"), "{s}");
        assert!(s.contains("42/17") && s.contains("3/0"), "{s}");
        assert!(!s.contains("no pressure"), "{s}");
        t.pressure = None;
        let sample = Sample {
            at: Instant::now(),
            tenants: vec![t],
        };
        let s = screen(80, &sample, &view);
        assert!(
            s.contains("no pressure: the kernel keeps it per group only on cgroup v2"),
            "{s}"
        );
    }
}
