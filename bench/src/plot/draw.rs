//! The drawing itself (plotters, bitmap backend, embedded font). Inputs are
//! checked by the caller: non-empty, finite.

use super::model::{Bar, Figure, PlotError, Series, XySeries, HEIGHT, WIDTH};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

/// DejaVu Sans, cut to Latin-1 and a few symbols (see the module docs).
const FONT: &[u8] = include_bytes!("DejaVuSans-subset.ttf");
const SANS: &str = "sans-serif";

/// Line colours, in series order (the first is Shoal's where it is drawn
/// first): the "tab10" palette, distinguishable in colour and in grey.
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

fn register_font(path: &Path) -> Result<(), PlotError> {
    static OK: OnceLock<bool> = OnceLock::new();
    let ok =
        *OK.get_or_init(|| plotters::style::register_font(SANS, FontStyle::Normal, FONT).is_ok());
    match ok {
        true => Ok(()),
        false => Err(PlotError::Draw {
            path: path.into(),
            msg: "the embedded font does not parse".into(),
        }),
    }
}

fn draw_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw {
        path: path.into(),
        msg: e.to_string(),
    }
}

/// A number for a label: 3 significant digits, no exponent for the ranges
/// benchmarks see.
pub(super) fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .into()
    } else if a >= 1.0 {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .into()
    } else if a >= 0.1 {
        format!("{v:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .into()
    } else if a >= 0.001 {
        format!("{v:.4}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .into()
    } else {
        format!("{v:.2e}")
    }
}

/// The nearest-rank quantile of sorted `v` (non-empty).
fn quantile(v: &[f64], p: f64) -> f64 {
    // `as` from f64 saturates; the clamp keeps the rank in bounds.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// A drawing area of a figure file.
type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// The white canvas with the title block and, under it, the legend
/// (`entries`: label and colour, laid out in rows; outside the plot so it
/// hides no data); returns the canvas and the area below.
fn canvas<'a>(
    path: &'a Path,
    fig: &Figure,
    entries: &[Entry],
) -> Result<(Area<'a>, Area<'a>), PlotError> {
    register_font(path)?;
    let e = draw_err(path);
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(&e)?;
    let (top, body) = root.split_vertically(84);
    top.draw_text(&fig.title, &(SANS, 30).into_font().color(&BLACK), (24, 14))
        .map_err(&e)?;
    let mut sub = format!(
        "host: {}",
        if fig.host.is_empty() { "?" } else { &fig.host }
    );
    if !fig.subtitle.is_empty() {
        sub.push_str("   \u{2022}   ");
        sub.push_str(&fig.subtitle);
    }
    top.draw_text(
        &sub,
        &(SANS, 18).into_font().color(&RGBColor(80, 80, 80)),
        (26, 54),
    )
    .map_err(&e)?;
    if entries.is_empty() {
        return Ok((root, body));
    }
    // Flow layout: an entry is a 30 px line sample, a gap, the label;
    // rows of 28 px, wrapped at the figure's width.
    let font = (SANS, 18).into_font().color(&BLACK);
    let (left, right, row_h) = (110i32, i32::try_from(WIDTH).unwrap_or(i32::MAX) - 30, 28i32);
    let mut placed = vec![];
    let (mut x, mut y) = (left, 0i32);
    for en in entries {
        let (w, _) = body.estimate_text_size(&en.label, &font).map_err(&e)?;
        let w = i32::try_from(w).unwrap_or(i32::MAX / 2) + 30 + 10 + 28;
        if x > left && x + w > right {
            x = left;
            y += row_h;
        }
        placed.push((x, y, en));
        x += w;
    }
    let (band, body) = body.split_vertically(u32::try_from(y + row_h + 6).unwrap_or(0));
    for (x, y, en) in placed {
        let mid = y + row_h / 2;
        let style = en.color.stroke_width(4);
        match en.dashed {
            false => band.draw(&PathElement::new(vec![(x, mid), (x + 30, mid)], style)),
            true => band.draw(&plotters::element::DashedPathElement::new(
                vec![(x, mid), (x + 30, mid)],
                7,
                5,
                style,
            )),
        }
        .map_err(&e)?;
        band.draw_text(&en.label, &font, (x + 40, mid - 9))
            .map_err(&e)?;
    }
    Ok((root, body))
}

/// A legend entry.
struct Entry {
    label: String,
    color: RGBColor,
    dashed: bool,
}

/// One line of a chart.
struct Line {
    label: String,
    /// In drawing order.
    points: Vec<(f64, f64)>,
    color: RGBColor,
    dashed: bool,
}

/// Lines to draw on one chart.
struct Lines {
    x_desc: String,
    y_desc: String,
    lines: Vec<Line>,
    /// Dots on the points too (xy figures).
    markers: bool,
    /// A logarithmic x axis (its minor grid lines are left out: they
    /// crowd at each decade's end).
    log_x: bool,
    /// Every x is a whole number (concurrency, N): no labels between.
    int_x: bool,
}

fn chart<X>(path: &Path, fig: &Figure, x: X, y: Range<f64>, l: &Lines) -> Result<(), PlotError>
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let e = draw_err(path);
    let entries: Vec<Entry> = l
        .lines
        .iter()
        .map(|x| Entry {
            label: x.label.clone(),
            color: x.color,
            dashed: x.dashed,
        })
        .collect();
    let (root, body) = canvas(path, fig, &entries)?;
    let mut c = ChartBuilder::on(&body)
        .margin_left(16)
        .margin_right(36)
        .margin_bottom(12)
        .x_label_area_size(64)
        .y_label_area_size(96)
        .build_cartesian_2d(x, y)
        .map_err(&e)?;
    let fmt = |v: &f64| num(*v);
    let xfmt = |v: &f64| match l.int_x && v.fract() != 0.0 {
        true => String::new(),
        false => num(*v),
    };
    let light = match l.log_x {
        true => WHITE,
        false => RGBColor(235, 235, 235),
    };
    c.configure_mesh()
        .x_desc(l.x_desc.as_str())
        .y_desc(l.y_desc.as_str())
        .x_label_formatter(&xfmt)
        .y_label_formatter(&fmt)
        .label_style((SANS, 17))
        .axis_desc_style((SANS, 20))
        .light_line_style(light)
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(&e)?;
    for x in &l.lines {
        let style = x.color.stroke_width(3);
        let pts = x.points.iter().copied();
        match x.dashed {
            false => c.draw_series(LineSeries::new(pts, style)).map(drop),
            true => c
                .draw_series(DashedLineSeries::new(pts, 10, 6, style))
                .map(drop),
        }
        .map_err(&e)?;
        if l.markers {
            let dot = x.color.filled();
            c.draw_series(x.points.iter().map(|&p| Circle::new(p, 5, dot)))
                .map_err(&e)?;
        }
    }
    root.present().map_err(&e)?;
    Ok(())
}

/// An x range over `lo..=hi` with a margin; logarithmic when the values are
/// positive and span more than 100x.
fn x_range(lo: f64, hi: f64) -> (bool, Range<f64>) {
    if lo > 0.0 && hi / lo > 100.0 {
        return (true, lo / 1.25..hi * 1.25);
    }
    let pad = ((hi - lo).max(hi.abs() * 0.02)).max(1e-9) * 0.05;
    let start = if lo >= 0.0 {
        (lo - pad).max(0.0)
    } else {
        lo - pad
    };
    (false, start..hi + pad)
}

fn span(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    })
}

fn with_x(
    path: &Path,
    fig: &Figure,
    lo: f64,
    hi: f64,
    y: Range<f64>,
    l: &mut Lines,
) -> Result<(), PlotError> {
    match x_range(lo, hi) {
        (true, r) => {
            l.x_desc.push_str(", log scale");
            l.log_x = true;
            chart(path, fig, r.log_scale(), y, l)
        }
        (false, r) => chart(path, fig, r, y, l),
    }
}

/// Milliseconds of which every one is a second or more read better as
/// seconds: (the unit to show, the factor to the samples).
pub(super) fn display_unit(unit: &str, lo: f64) -> (&str, f64) {
    match unit {
        "ms" if lo >= 1000.0 => ("s", 1e-3),
        u => (u, 1.0),
    }
}

pub(super) fn cdf(path: &Path, fig: &Figure, series: &[Series]) -> Result<(), PlotError> {
    let (lo, hi) = span(series.iter().flat_map(|s| s.samples.iter().copied()));
    // A given x label names its own unit: the samples stay as they are.
    let (unit, k) = match fig.x_label.is_empty() {
        true => display_unit(&fig.unit, lo),
        false => (fig.unit.as_str(), 1.0),
    };
    let (lo, hi) = (lo * k, hi * k);
    let mut lines = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let mut v: Vec<f64> = s.samples.iter().map(|x| x * k).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let label = format!(
            "{}  (n={}, p50 {} {unit}, p99 {} {unit})",
            s.label,
            v.len(),
            num(quantile(&v, 0.5)),
            num(quantile(&v, 0.99))
        );
        // A step function: at each sample the fraction jumps by 1/n.
        let mut pts = Vec::with_capacity(2 * v.len());
        for (i, &x) in v.iter().enumerate() {
            pts.push((x, i as f64 / n));
            pts.push((x, (i + 1) as f64 / n));
        }
        lines.push(Line {
            label,
            points: pts,
            color: color(i),
            dashed: false,
        });
    }
    let x_desc = match (fig.x_label.is_empty(), unit.is_empty()) {
        (false, _) => fig.x_label.clone(),
        (true, false) => format!("latency ({unit})"),
        (true, true) => "value".into(),
    };
    let mut l = Lines {
        x_desc,
        y_desc: "fraction of samples \u{2264} x".into(),
        lines,
        markers: false,
        log_x: false,
        int_x: false,
    };
    with_x(path, fig, lo, hi, 0.0..1.02, &mut l)
}

pub(super) fn xy(path: &Path, fig: &Figure, series: &[XySeries]) -> Result<(), PlotError> {
    let lines = series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut p = s.points.clone();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line {
                label: s.label.clone(),
                points: p,
                color: color(s.color.unwrap_or(i)),
                dashed: s.dashed,
            }
        })
        .collect();
    let (xlo, xhi) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let (ylo, yhi) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    // Throughputs and memory start at zero; a negative value widens it.
    let y0 = ylo.min(0.0);
    let top = if yhi > y0 {
        yhi + (yhi - y0) * 0.12
    } else {
        y0 + 1.0
    };
    let mut l = Lines {
        x_desc: fig.x_label.clone(),
        y_desc: fig.y_label.clone(),
        lines,
        markers: true,
        log_x: false,
        int_x: series
            .iter()
            .all(|s| s.points.iter().all(|p| p.0.fract() == 0.0)),
    };
    with_x(path, fig, xlo, xhi, y0..top, &mut l)
}

pub(super) fn bars(path: &Path, fig: &Figure, bars: &[Bar]) -> Result<(), PlotError> {
    let e = draw_err(path);
    let (root, body) = canvas(path, fig, &[])?;
    let (lo, hi) = span(bars.iter().map(|b| b.value));
    let y0 = lo.min(0.0);
    let top = if hi > y0 {
        hi + (hi - y0) * 0.15
    } else {
        y0 + 1.0
    };
    // Segments 0..=last: one per bar.
    let last = u32::try_from(bars.len() - 1).unwrap_or(u32::MAX);
    let mut c = ChartBuilder::on(&body)
        .margin_left(16)
        .margin_right(36)
        .margin_bottom(12)
        .x_label_area_size(64)
        .y_label_area_size(96)
        .build_cartesian_2d((0..last).into_segmented(), y0..top)
        .map_err(&e)?;
    let xfmt = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) => usize::try_from(*i)
            .ok()
            .and_then(|i| bars.get(i))
            .map_or(String::new(), |b| b.label.clone()),
        _ => String::new(),
    };
    let yfmt = |v: &f64| num(*v);
    c.configure_mesh()
        .disable_x_mesh()
        .x_desc(fig.x_label.as_str())
        .y_desc(fig.y_label.as_str())
        .x_labels(bars.len())
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .label_style((SANS, 17))
        .axis_desc_style((SANS, 20))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(200, 200, 200))
        .draw()
        .map_err(&e)?;
    for (i, b) in bars.iter().enumerate() {
        let k = u32::try_from(i).unwrap_or(u32::MAX);
        let mut r = Rectangle::new(
            [
                (SegmentValue::Exact(k), 0.0),
                (SegmentValue::Exact(k + 1), b.value),
            ],
            color(i).filled(),
        );
        r.set_margin(0, 0, 18, 18);
        c.draw_series(std::iter::once(r)).map_err(&e)?;
        let above = (SANS, 18)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        c.draw_series(std::iter::once(Text::new(
            num(b.value),
            (
                SegmentValue::CenterOf(k),
                b.value.max(0.0) + (top - y0) * 0.01,
            ),
            above,
        )))
        .map_err(&e)?;
    }
    root.present().map_err(&e)?;
    Ok(())
}
