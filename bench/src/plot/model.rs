//! The figures' data and errors (see [`super`]).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Width of every figure (pixels).
pub const WIDTH: u32 = 1200;
/// Height of every figure (pixels).
pub const HEIGHT: u32 = 750;

/// Why a figure was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// No series (or bars) at all.
    #[error("figure {0:?}: nothing to draw (no series)")]
    NoSeries(String),
    /// A series without samples or points.
    #[error("figure {figure:?}: series {series:?} is empty")]
    Empty {
        /// The figure's title.
        figure: String,
        /// The series' label.
        series: String,
    },
    /// A NaN or infinite value.
    #[error("figure {figure:?}: series {series:?} has a value that is not a finite number at index {index}")]
    NotFinite {
        /// The figure's title.
        figure: String,
        /// The series' label.
        series: String,
        /// Where in the series.
        index: usize,
    },
    /// The drawing backend or PNG encoder failed.
    #[error("drawing {path}: {msg}")]
    Draw {
        /// The figure's file.
        path: PathBuf,
        /// What failed.
        msg: String,
    },
    /// Creating the output directory, or reading an input document.
    #[error("{path}: {err}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error (in the message, not a source: said once).
        err: std::io::Error,
    },
    /// An input document that is not the generic schema.
    #[error("{path}: not a plot document: {msg}")]
    BadDoc {
        /// The document.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// What a figure shows, besides its data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// Title (first line of the figure).
    pub title: String,
    /// The host kind: "pvm", "vmx", "svm" ([`host_kind`]).
    #[serde(default)]
    pub host: String,
    /// Unit of the samples of a CDF ("ms"), shown on its x axis.
    #[serde(default)]
    pub unit: String,
    /// X axis description with its unit (xy and bar figures).
    #[serde(default)]
    pub x_label: String,
    /// Y axis description with its unit (xy and bar figures).
    #[serde(default)]
    pub y_label: String,
    /// Optional line under the title (what ran, counts, the peer).
    #[serde(default)]
    pub subtitle: String,
}

impl Figure {
    /// A figure titled `title` on host kind `host`.
    pub fn new(title: impl Into<String>, host: impl Into<String>) -> Self {
        Self {
            title: title.into(),
            host: host.into(),
            ..Self::default()
        }
    }

    /// Sets the samples' unit (CDFs).
    pub fn unit(mut self, unit: impl Into<String>) -> Self {
        self.unit = unit.into();
        self
    }

    /// Sets the axis descriptions (xy and bar figures), units included.
    pub fn axes(mut self, x: impl Into<String>, y: impl Into<String>) -> Self {
        self.x_label = x.into();
        self.y_label = y.into();
        self
    }

    /// Sets the line under the title.
    pub fn subtitle(mut self, s: impl Into<String>) -> Self {
        self.subtitle = s.into();
        self
    }
}

/// One system's latency samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend label ("shoal", "qemu-microvm").
    pub label: String,
    /// Samples, in the figure's unit; any order.
    pub samples: Vec<f64>,
}

impl Series {
    /// A series.
    pub fn new(label: impl Into<String>, samples: Vec<f64>) -> Self {
        Self {
            label: label.into(),
            samples,
        }
    }
}

/// One line of an xy figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XySeries {
    /// Legend label.
    pub label: String,
    /// `(x, y)` points; drawn in increasing x.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a p99 beside its p50).
    #[serde(default)]
    pub dashed: bool,
    /// The palette colour to use (default: the series' position); series
    /// that belong together (a step's p50 and p99) share one.
    #[serde(default)]
    pub color: Option<usize>,
}

impl XySeries {
    /// A solid line in the series' own colour.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
            dashed: false,
            color: None,
        }
    }

    /// Drawn dashed.
    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }

    /// In palette colour `i`.
    pub fn color(mut self, i: usize) -> Self {
        self.color = Some(i);
        self
    }
}

/// One bar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// Its height, in the y axis' unit.
    pub value: f64,
}

impl Bar {
    /// A bar.
    pub fn new(label: impl Into<String>, value: f64) -> Self {
        Self {
            label: label.into(),
            value,
        }
    }
}
