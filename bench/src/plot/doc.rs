//! A generic plot document (`shoal bench plot FILE.json`), for benchmarks
//! that are not in this crate (the Python SDK's):
//!
//! ```json
//! {"title": "SDK overhead", "host": "pvm", "unit": "ms",
//!  "series": [{"label": "async SDK", "samples": [1.2, 1.3]},
//!             {"label": "raw HTTP", "samples": [1.1, 1.2]}],
//!  "xy": {"x_label": "concurrency (clients)", "y_label": "sandboxes/s",
//!         "series": [{"label": "async SDK", "points": [[1, 10.0], [10, 80.0]]}]},
//!  "bars": {"y_label": "MB/s", "bars": [{"label": "upload", "value": 120.0}]}}
//! ```
//!
//! `series` is drawn as a latency CDF (`STEM-cdf.png`), `xy` as lines
//! (`STEM-xy.png`), `bars` as bars (`STEM-bars.png`); at least one must be
//! there. `host` defaults to this host's kind. An xy series may also say
//! `"dashed": true` and `"color": N` (a palette index, to pair a p99 with
//! its p50).

use super::{bars, latency_cdf, xy, Bar, Figure, Out, PlotError, Series, XySeries};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Doc {
    /// Figure title.
    pub title: String,
    /// Host kind where it was measured ("pvm", "vmx", "svm").
    #[serde(default)]
    pub host: String,
    /// Unit of the CDF samples.
    #[serde(default)]
    pub unit: String,
    /// A line under the title.
    #[serde(default)]
    pub subtitle: String,
    /// Latency samples, one series per system: a CDF.
    #[serde(default)]
    pub series: Vec<Series>,
    /// Lines through points.
    #[serde(default)]
    pub xy: Option<XyDoc>,
    /// Bars.
    #[serde(default)]
    pub bars: Option<BarsDoc>,
}

/// The `xy` part.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XyDoc {
    /// Its own title (default: the document's).
    #[serde(default)]
    pub title: Option<String>,
    /// X axis, with unit.
    pub x_label: String,
    /// Y axis, with unit.
    pub y_label: String,
    /// The lines.
    pub series: Vec<XySeries>,
}

/// The `bars` part.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BarsDoc {
    /// Its own title (default: the document's).
    #[serde(default)]
    pub title: Option<String>,
    /// X axis description.
    #[serde(default)]
    pub x_label: String,
    /// Y axis, with unit.
    pub y_label: String,
    /// The bars.
    pub bars: Vec<Bar>,
}

/// Reads a document.
pub fn read(path: &Path) -> Result<Doc, PlotError> {
    let text = std::fs::read_to_string(path).map_err(|err| PlotError::Io {
        path: path.into(),
        err,
    })?;
    serde_json::from_str(&text).map_err(|e| PlotError::BadDoc {
        path: path.into(),
        msg: e.to_string(),
    })
}

/// Draws `doc` into `out`'s directory; returns the files written.
pub fn draw(doc: &Doc, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    let host = if doc.host.is_empty() {
        out.host.clone()
    } else {
        doc.host.clone()
    };
    let base = Figure::new(doc.title.clone(), host).subtitle(doc.subtitle.clone());
    let mut files = vec![];
    if !doc.series.is_empty() {
        let p = out.path("cdf");
        latency_cdf(&p, &base.clone().unit(doc.unit.clone()), &doc.series)?;
        files.push(p);
    }
    if let Some(x) = &doc.xy {
        let mut f = base.clone().axes(x.x_label.clone(), x.y_label.clone());
        if let Some(t) = &x.title {
            f.title = t.clone();
        }
        let p = out.path("xy");
        xy(&p, &f, &x.series)?;
        files.push(p);
    }
    if let Some(b) = &doc.bars {
        let mut f = base.clone().axes(b.x_label.clone(), b.y_label.clone());
        if let Some(t) = &b.title {
            f.title = t.clone();
        }
        let p = out.path("bars");
        bars(&p, &f, &b.bars)?;
        files.push(p);
    }
    if files.is_empty() {
        return Err(PlotError::NoSeries(doc.title.clone()));
    }
    Ok(files)
}

/// Reads the document `json` and draws it into `dir`
/// (`DIR/STEM-cdf.png` ...).
pub fn draw_file(json: &Path, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    let doc = read(json)?;
    draw(&doc, &Out::for_json(dir, json))
}
