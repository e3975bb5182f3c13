//! `--plot DIR`: the figures of a run as SVG line charts (the `plotters` crate, SVG backend
//! only): RSS over time per process, CPU and RSS against host count, latency percentiles
//! against rate. Each series is named in the chart's legend (an SVG `<text>` element).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use plotters::prelude::*;

/// One named line of a chart: (x, y) points in order of x.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with one line (and its points) per series and a legend naming them.
pub(crate) struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
}

/// The range of `v` widened so a single value or a flat line still has a visible span.
fn span(v: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = v
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 0.05).max(1e-9);
    if !from_zero {
        lo -= pad;
    }
    hi += pad;
    (lo, hi)
}

/// Draws `chart` into the SVG file `path`.
pub(crate) fn draw(path: &Path, chart: &Chart<'_>) -> anyhow::Result<()> {
    let all = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(all().map(|p| p.0), false);
    let (y0, y1) = span(all().map(|p| p.1), true);
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let e = |err: &dyn std::fmt::Display| anyhow!("cannot draw {}: {err}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut c = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .draw()
        .map_err(|x| e(&x))?;
    for (i, s) in chart.series.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        c.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, colour.filled())))
            .map_err(|x| e(&x))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Creates `dir` if needed and returns the path of file `name` in it.
pub(crate) fn file_in(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the plot folder {}", dir.display()))?;
    Ok(dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_names_every_series_in_its_svg() {
        let dir = tempfile::tempdir().unwrap();
        let p = file_in(&dir.path().join("sub"), "t.svg").unwrap();
        let series = vec![
            Series {
                name: "archiver".into(),
                points: vec![(0.0, 10.0), (1.0, 12.0)],
            },
            // One point, and an empty series: still drawn, still named.
            Series {
                name: "broker".into(),
                points: vec![(0.5, 3.0)],
            },
            Series {
                name: "idle".into(),
                points: vec![],
            },
        ];
        draw(
            &p,
            &Chart {
                title: "t",
                x_label: "x",
                y_label: "y",
                series: &series,
            },
        )
        .unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for n in ["archiver", "broker", "idle"] {
            assert!(
                svg.contains(&format!(">{n}<")) || svg.contains(&format!(">\n{n}\n<")),
                "{n} missing"
            );
        }
    }

    #[test]
    fn spans_are_never_empty() {
        assert_eq!(span([].into_iter(), true), (0.0, 1.0));
        let (a, b) = span([5.0].into_iter(), false);
        assert!(a < 5.0 && b > 5.0);
        let (a, b) = span([2.0, 4.0].into_iter(), true);
        assert!(a == 0.0 && b > 4.0);
    }
}
