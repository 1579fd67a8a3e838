//! Benchmark figures: PNG files drawn with `plotters` (bitmap backend, a
//! font embedded in the binary, so nothing is needed on the host: no
//! fontconfig, no freetype).
//!
//! Three kinds of figure, each readable without the JSON beside it (title,
//! the host kind, axes with units, a legend with n / p50 / p99):
//!
//! * [`latency_cdf`]: the cumulative distribution of latency samples, one
//!   line per system (Shoal and the peer measured in the same run);
//! * [`xy`]: lines through points (throughput against concurrency, memory
//!   against N);
//! * [`bars`]: one bar per labelled value (throughputs, sizes).
//!
//! [`doc::draw`] draws a generic JSON document ([`Doc`]) with these, for
//! benchmarks written in other languages (`shoal bench plot FILE.json`).
//!
//! The font is a subset of DejaVu Sans 2.37 (Debian's fonts-dejavu-core
//! `DejaVuSans.ttf`, cut to Latin-1 and a few symbols with fonttools'
//! `pyftsubset --no-hinting`); its licence (Bitstream Vera, with DejaVu's
//! changes in the public domain) is in `LICENSE-DejaVu.txt` beside it.

pub mod benches;
pub mod doc;
mod draw;
mod model;

pub use doc::Doc;
pub use model::{Bar, Figure, PlotError, Series, XySeries, HEIGHT, WIDTH};
use std::path::{Path, PathBuf};

/// Draws the CDF of each series' samples into the PNG file `path`.
pub fn latency_cdf(path: &Path, fig: &Figure, series: &[Series]) -> Result<(), PlotError> {
    if series.is_empty() {
        return Err(PlotError::NoSeries(fig.title.clone()));
    }
    for s in series {
        check(fig, &s.label, s.samples.iter().copied())?;
    }
    prepare(path)?;
    draw::cdf(path, fig, series)
}

/// Draws each series as a line through its points into the PNG file `path`.
pub fn xy(path: &Path, fig: &Figure, series: &[XySeries]) -> Result<(), PlotError> {
    if series.is_empty() {
        return Err(PlotError::NoSeries(fig.title.clone()));
    }
    for s in series {
        check(fig, &s.label, s.points.iter().flat_map(|p| [p.0, p.1]))?;
    }
    prepare(path)?;
    draw::xy(path, fig, series)
}

/// Draws one bar per value into the PNG file `path`.
pub fn bars(path: &Path, fig: &Figure, bars: &[Bar]) -> Result<(), PlotError> {
    if bars.is_empty() {
        return Err(PlotError::NoSeries(fig.title.clone()));
    }
    for b in bars {
        check(fig, &b.label, [b.value])?;
    }
    prepare(path)?;
    draw::bars(path, fig, bars)
}

fn check(fig: &Figure, label: &str, v: impl IntoIterator<Item = f64>) -> Result<(), PlotError> {
    let mut n = 0;
    for (i, x) in v.into_iter().enumerate() {
        if !x.is_finite() {
            return Err(PlotError::NotFinite {
                figure: fig.title.clone(),
                series: label.into(),
                index: i,
            });
        }
        n += 1;
    }
    if n == 0 {
        return Err(PlotError::Empty {
            figure: fig.title.clone(),
            series: label.into(),
        });
    }
    Ok(())
}

fn prepare(path: &Path) -> Result<(), PlotError> {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => {
            std::fs::create_dir_all(d).map_err(|err| PlotError::Io {
                path: d.into(),
                err,
            })
        }
        _ => Ok(()),
    }
}

/// The host kind shown on figures: "pvm" (software KVM), "vmx" (Intel
/// VT-x), "svm" (AMD-V), "kvm" (hardware KVM of another kind) or "no kvm".
pub fn host_kind() -> String {
    use vmm::host::KvmKind;
    match vmm::host::kvm_kind() {
        KvmKind::Pvm => "pvm".into(),
        KvmKind::None => "no kvm".into(),
        KvmKind::Hardware => {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let flags = info
                .lines()
                .find(|l| l.starts_with("flags"))
                .unwrap_or_default();
            let has = |f: &str| flags.split_whitespace().any(|w| w == f);
            match (has("vmx"), has("svm")) {
                (true, _) => "vmx".into(),
                (_, true) => "svm".into(),
                _ => "kvm".into(),
            }
        }
    }
}

/// Where a benchmark's figures go: `DIR/STEM-NAME.png`.
#[derive(Debug, Clone)]
pub struct Out {
    /// The directory.
    pub dir: PathBuf,
    /// The file name prefix (the JSON file's stem: "bench-restore").
    pub stem: String,
    /// The host kind put on every figure.
    pub host: String,
}

impl Out {
    /// Figures in `dir` named after the JSON file `json`
    /// (`bench-boot.json` gives `bench-boot-*.png`).
    pub fn for_json(dir: &Path, json: &Path) -> Self {
        let stem = json
            .file_stem()
            .map_or_else(|| "bench".into(), |s| s.to_string_lossy().into_owned());
        Self {
            dir: dir.into(),
            stem,
            host: host_kind(),
        }
    }

    /// The file of figure `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{}-{name}.png", self.stem))
    }

    /// A [`Figure`] with this output's host kind.
    pub fn figure(&self, title: impl Into<String>) -> Figure {
        Figure::new(title, self.host.clone())
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
