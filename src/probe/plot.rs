//! `--plot FILE.svg`: throughput (left axis, MiB/s) and p99 latency (right axis, ms) against
//! parallelism, one pair of lines per block size, and the latency target as a dashed line, as
//! seed 004 graphs rMB/s against r_await.
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

pub fn draw(path: &Path, r: &ProbeReport) -> Result<()> {
    if r.steps.is_empty() {
        return Err(anyhow!("no step was measured, nothing to draw"));
    }
    let err = |e: &dyn std::fmt::Display| anyhow!("{e}");
    // x: log2 of the parallelism, labelled with the parallelism itself.
    let xs: Vec<f64> = r
        .steps
        .iter()
        .map(|s| (s.parallelism as f64).log2())
        .collect();
    let x_max = xs.iter().cloned().fold(0.0, f64::max).max(1.0);
    let mib_max = r.steps.iter().map(|s| s.mib_s).fold(0.0, f64::max) * 1.1 + 1e-9;
    let target_ms = r.latency_target_us / 1000.0;
    let lat_max = r
        .steps
        .iter()
        .map(|s| s.latency_us.p99 / 1000.0)
        .fold(target_ms, f64::max)
        * 1.15;

    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} ({}): throughput and p99 latency",
                r.target.path.display(),
                r.rw
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .right_y_label_area_size(60)
        .build_cartesian_2d(-0.1..x_max + 0.1, 0.0..mib_max)
        .map_err(|e| err(&e))?
        .set_secondary_coord(-0.1..x_max + 0.1, 0.0..lat_max);
    chart
        .configure_mesh()
        .x_desc("parallelism (threads)")
        .y_desc("MiB/s (solid)")
        .x_labels(x_max as usize + 2)
        .x_label_formatter(&|x| {
            let r = x.round();
            if (x - r).abs() < 0.01 && r >= 0.0 {
                format!("{}", 2f64.powf(r) as u64)
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .configure_secondary_axes()
        .y_desc("p99 latency, ms (dashed)")
        .draw()
        .map_err(|e| err(&e))?;

    let mut sizes: Vec<u64> = Vec::new();
    for s in &r.steps {
        if !sizes.contains(&s.bs) {
            sizes.push(s.bs);
        }
    }
    for (i, bs) in sizes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64, f64)> = r
            .steps
            .iter()
            .filter(|s| s.bs == *bs)
            .map(|s| {
                (
                    (s.parallelism as f64).log2(),
                    s.mib_s,
                    s.latency_us.p99 / 1000.0,
                )
            })
            .collect();
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.0, p.1)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("bs {} MiB/s", bs_label(*bs)))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_secondary_series(DashedLineSeries::new(
                pts.iter().map(|p| (p.0, p.2)),
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(format!("bs {} p99 ms", bs_label(*bs)))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_secondary_series(DashedLineSeries::new(
            [(-0.1, target_ms), (x_max + 0.1, target_ms)],
            3,
            3,
            BLACK.stroke_width(1),
        ))
        .map_err(|e| err(&e))?
        .label(format!("latency target {target_ms} ms"))
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
