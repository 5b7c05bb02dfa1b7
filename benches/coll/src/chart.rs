//! The SVG chart: overlap and blocking latency against message size, ours beside Open MPI's, one
//! colour per collective (Open MPI dashed with circles, ours solid with triangles). SVG only and
//! no font library: plotters writes text as SVG `<text>` and sizes it by estimate.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::kind::Kind;
use crate::report::{Medians, OURS, Summary, human_bytes};

fn colour(kind: Kind) -> RGBColor {
    match kind {
        Kind::Allreduce => RGBColor(31, 119, 180),
        Kind::Alltoall => RGBColor(214, 39, 40),
        Kind::Allgather => RGBColor(44, 160, 44),
        Kind::Bcast => RGBColor(148, 103, 189),
    }
}

/// One curve: a collective measured by one implementation, (log2 of the size, value) points.
struct Curve {
    kind: Kind,
    ours: bool,
    name: String,
    points: Vec<(f64, f64)>,
}

fn curves(summaries: &[Summary], value: fn(&Medians) -> f64) -> Vec<Curve> {
    let mut out = Vec::new();
    for kind in Kind::ALL {
        for ours in [false, true] {
            let points: Vec<(f64, f64)> = summaries
                .iter()
                .filter(|s| s.kind == kind)
                .filter_map(|s| {
                    let m = if ours {
                        s.ours.as_ref()
                    } else {
                        s.baseline.as_ref()
                    }?;
                    let v = value(m);
                    v.is_finite().then(|| ((s.bytes as f64).log2(), v))
                })
                .collect();
            if !points.is_empty() {
                let name = summaries
                    .first()
                    .map_or(OURS, |s| s.ours_name.as_str())
                    .to_string();
                out.push(Curve {
                    kind,
                    ours,
                    name,
                    points,
                });
            }
        }
    }
    out
}

type Panel<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_curves<'a, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    curves: &[Curve],
    legend: SeriesLabelPosition,
) -> Result<(), String>
where
    Y: Ranged<ValueType = f64>,
{
    for curve in curves {
        let c = colour(curve.kind);
        let style = c.stroke_width(2);
        let name = if curve.ours {
            curve.name.as_str()
        } else {
            "Open MPI"
        };
        let label = format!("{} {}", curve.kind, name);
        let pts = curve.points.clone();
        if curve.ours {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| TriangleMarker::new(p, 5, c.filled())))
                .map_err(|e| e.to_string())?;
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| {
                    DashedPathElement::new(vec![(x, y), (x + 20, y)], 5, 3, c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.85))
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|e| e.to_string())
}

/// The x range (log2 of the sizes, a little margin each side) and how many labels: one per
/// power of two up to a dozen, so that the labels fall on whole powers of two.
fn x_axis(summaries: &[Summary]) -> (std::ops::Range<f64>, usize) {
    let lo = summaries.iter().map(|s| s.bytes).min().unwrap_or(8).max(1) as f64;
    let hi = summaries.iter().map(|s| s.bytes).max().unwrap_or(8).max(1) as f64;
    let (lo, hi) = (lo.log2(), hi.log2());
    let labels = ((hi - lo).round() as usize + 1).clamp(2, 12);
    (lo - 0.3..hi + 0.3, labels)
}

fn size_label(x: &f64) -> String {
    human_bytes(x.exp2().round() as usize)
}

fn overlap_panel(area: &Panel<'_>, summaries: &[Summary], title: &str) -> Result<(), String> {
    let (xr, labels) = x_axis(summaries);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("Overlap (OSU definition), {title}"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(xr, 0f64..105f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(labels)
        .x_desc("message size")
        .y_desc("overlap %")
        .x_label_formatter(&size_label)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    draw_curves(
        &mut chart,
        &curves(summaries, |m| m.overlap_pct),
        SeriesLabelPosition::UpperRight,
    )
}

fn latency_panel(area: &Panel<'_>, summaries: &[Summary], title: &str) -> Result<(), String> {
    let (xr, labels) = x_axis(summaries);
    let lat = curves(summaries, |m| m.lat_us);
    let values = lat
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.1))
        .filter(|v| *v > 0.0);
    let lo = values.clone().fold(f64::INFINITY, f64::min);
    let hi = values.fold(0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("Blocking latency, {title}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xr, (lo..hi).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(labels)
        .x_desc("message size")
        .y_desc("latency (us, log)")
        .x_label_formatter(&size_label)
        .y_label_formatter(&|y| format!("{y}"))
        .draw()
        .map_err(|e| e.to_string())?;
    draw_curves(&mut chart, &lat, SeriesLabelPosition::UpperLeft)
}

/// Writes the chart of `summaries` to `path`: overlap on the left, blocking latency on the right;
/// `title` (the machine and ranks, say) goes in both captions.
pub fn write_svg(path: &Path, summaries: &[Summary], title: &str) -> Result<(), String> {
    if summaries.is_empty() {
        return Err("no results to chart".into());
    }
    let root = SVGBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(700);
    overlap_panel(&left, summaries, title)?;
    latency_panel(&right, summaries, title)?;
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Row;
    use crate::report::summarise;

    #[test]
    fn writes_an_svg_with_both_panels() {
        let mut rows = Vec::new();
        for (i, bytes) in [8usize, 1024, 65536, 1 << 20].into_iter().enumerate() {
            for (implementation, lat) in [("openmpi", 10.0), ("urom", 12.0)] {
                for kind in [Kind::Allreduce, Kind::Alltoall] {
                    rows.push(Row {
                        round: 1,
                        implementation: implementation.into(),
                        kind,
                        bytes,
                        ranks: 2,
                        iters: 10,
                        lat_us: lat * (i + 1) as f64,
                        pure_us: lat,
                        total_us: lat * 1.5,
                        compute_us: lat,
                        overlap_pct: 50.0 + i as f64,
                        cpu_us: 1.0,
                        cpu_loop_us: 1.0,
                        worker_cpu_us: None,
                    });
                }
            }
        }
        let dir = std::env::temp_dir().join(format!("coll-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        write_svg(&path, &summarise(&rows), "test").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("Overlap (OSU definition), test"));
        assert!(svg.contains("Blocking latency, test"));
        assert!(svg.contains("allreduce urom") && svg.contains("alltoall Open MPI"));
        assert!(svg.contains("64 KiB"));
    }
}
