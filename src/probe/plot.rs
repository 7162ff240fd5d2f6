//! `--plot FILE.svg`: two panels against the number of jobs, as seed 004 graphs rMB/s against
//! r_await. Top: throughput in MiB/s on a log scale, so that 4k (a few MiB/s) and 1m (hundreds)
//! both show their shape instead of one lying flat along the axis. Bottom: p99 latency in ms
//! with the latency target as a dashed line on that same axis. Each block size is one colour in
//! both panels, and its knee (the most jobs whose p99 stays under the target) is ringed in both.
//! Axis labels are plain numbers (`16k`, `250`, `0.5`), never `16000.0`.
//!
//! plotters runs without its default features: the SVG backend writes text as `<text>`
//! elements that the viewer renders, so no font library is linked; label widths are estimated.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::report::bs_label;
use super::ProbeReport;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// An axis value as a person writes it: 16000 → `16k`, 250 → `250`, 2.5 → `2.5`, 0.25 → `0.25`.
pub fn axis_label(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e4 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 10.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        trim(format!("{v:.1}"))
    } else {
        trim(format!("{v:.2}"))
    }
}

/// The x axis: log2 of the jobs, labelled with the jobs themselves at powers of two.
fn jobs_label(x: f64) -> String {
    let r = x.round();
    if (x - r).abs() < 0.01 && r >= 0.0 {
        format!("{}", 2f64.powf(r) as u64)
    } else {
        String::new()
    }
}

pub fn draw(path: &Path, r: &ProbeReport) -> Result<()> {
    if r.steps.is_empty() {
        return Err(anyhow!("no step was measured, nothing to draw"));
    }
    let err = |e: &dyn std::fmt::Display| anyhow!("{e}");
    let x_of = |jobs: usize| (jobs as f64).log2();
    let x_max = r
        .steps
        .iter()
        .map(|s| x_of(s.parallelism))
        .fold(0.0, f64::max)
        .max(1.0);
    let x_range = -0.2..x_max + 0.2;
    let positive = |v: f64| v.max(1e-3);
    let mib_min = r
        .steps
        .iter()
        .map(|s| positive(s.mib_s))
        .fold(f64::MAX, f64::min);
    let mib_max = r
        .steps
        .iter()
        .map(|s| positive(s.mib_s))
        .fold(0.0, f64::max);
    let target_ms = r.latency_target_us / 1000.0;
    let lat_max = r
        .steps
        .iter()
        .map(|s| s.latency_us.p99 / 1000.0)
        .fold(target_ms, f64::max)
        * 1.15;

    let mut sizes: Vec<u64> = Vec::new();
    for s in &r.steps {
        if !sizes.contains(&s.bs) {
            sizes.push(s.bs);
        }
    }
    let series = |bs: u64| -> Vec<(f64, f64, f64)> {
        r.steps
            .iter()
            .filter(|s| s.bs == bs)
            .map(|s| {
                (
                    x_of(s.parallelism),
                    positive(s.mib_s),
                    s.latency_us.p99 / 1000.0,
                )
            })
            .collect()
    };
    let knee_at = |bs: u64| {
        r.knees
            .iter()
            .find(|k| k.bs == bs)
            .and_then(|k| k.parallelism)
    };

    let root = SVGBackend::new(path, (900, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(
            &format!(
                "{} ({}): throughput and p99 latency by jobs",
                r.target.path.display(),
                r.rw
            ),
            ("sans-serif", 20),
        )
        .map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(400);

    // Throughput, log scale.
    let mut chart = ChartBuilder::on(&top)
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.clone(), (mib_min / 1.5..mib_max * 1.5).log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("jobs (threads, one IO each in flight)")
        .y_desc("MiB/s (log scale)")
        .x_labels(x_max as usize + 2)
        .x_label_formatter(&|x| jobs_label(*x))
        .y_label_formatter(&|y| axis_label(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, bs) in sizes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = series(*bs);
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("bs {}", bs_label(*bs)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.1), 3, color.filled())),
            )
            .map_err(|e| err(&e))?;
        if let Some(k) = knee_at(*bs) {
            if let Some(p) = pts.iter().find(|p| (p.0 - x_of(k)).abs() < 1e-9) {
                chart
                    .draw_series([Circle::new((p.0, p.1), 8, color.stroke_width(2))])
                    .map_err(|e| err(&e))?;
                chart
                    .draw_series([Text::new(
                        format!(
                            "knee {} ({k} job{})",
                            bs_label(*bs),
                            if k == 1 { "" } else { "s" }
                        ),
                        (p.0, p.1),
                        ("sans-serif", 13).into_font().color(&color),
                    )])
                    .map_err(|e| err(&e))?;
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;

    // p99 latency, with the target on the same axis.
    let mut chart = ChartBuilder::on(&bottom)
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range.clone(), 0.0..lat_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("jobs (threads, one IO each in flight)")
        .y_desc("p99 latency, ms")
        .x_labels(x_max as usize + 2)
        .x_label_formatter(&|x| jobs_label(*x))
        .y_label_formatter(&|y| axis_label(*y))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, bs) in sizes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = series(*bs);
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.2)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("bs {}", bs_label(*bs)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                pts.iter()
                    .map(|p| Circle::new((p.0, p.2), 3, color.filled())),
            )
            .map_err(|e| err(&e))?;
        if let Some(k) = knee_at(*bs) {
            if let Some(p) = pts.iter().find(|p| (p.0 - x_of(k)).abs() < 1e-9) {
                chart
                    .draw_series([Circle::new((p.0, p.2), 8, color.stroke_width(2))])
                    .map_err(|e| err(&e))?;
            }
        }
    }
    chart
        .draw_series(DashedLineSeries::new(
            [(x_range.start, target_ms), (x_range.end, target_ms)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label(format!("latency target {} ms", axis_label(target_ms)))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
