use super::*;
use std::path::Path;

/// Decodes a PNG file fully; its (width, height).
fn png_size(p: &Path) -> (u32, u32) {
    let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut r = png::Decoder::new(std::io::BufReader::new(f))
        .read_info()
        .expect("a PNG header");
    let mut buf = vec![0; r.output_buffer_size()];
    let info = r.next_frame(&mut buf).expect("PNG image data");
    // Not a blank image: some pixels differ from the first one.
    let px = info.color_type.samples() * usize::from(info.bit_depth as u8 / 8).max(1);
    let first = &buf[..px];
    assert!(
        buf[..info.buffer_size()].chunks(px).any(|c| c != first),
        "{}: a blank image",
        p.display()
    );
    (info.width, info.height)
}

fn fig() -> Figure {
    Figure::new("restore latency", "pvm")
        .unit("ms")
        .subtitle("100 restores")
}

#[test]
fn cdf_is_a_png_of_the_figure_size() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("sub/dir/cdf.png");
    let a: Vec<f64> = (1..=100).map(|i| f64::from(i) * 0.1).collect();
    let b: Vec<f64> = (1..=40).map(|i| 2.0 + f64::from(i) * 0.2).collect();
    latency_cdf(
        &p,
        &fig(),
        &[Series::new("shoal", a), Series::new("qemu-microvm", b)],
    )
    .unwrap();
    assert_eq!(png_size(&p), (WIDTH, HEIGHT));
}

#[test]
fn a_wide_span_and_one_sample_draw() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("log.png");
    // 4 decades: a logarithmic axis.
    latency_cdf(
        &p,
        &fig(),
        &[
            Series::new("wide", vec![0.1, 1.0, 10.0, 1000.0]),
            Series::new("one", vec![5.0]),
        ],
    )
    .unwrap();
    assert_eq!(png_size(&p), (WIDTH, HEIGHT));
    // All samples equal: a degenerate range still draws.
    let p = d.path().join("flat.png");
    latency_cdf(&p, &fig(), &[Series::new("flat", vec![3.0; 5])]).unwrap();
    assert_eq!(png_size(&p), (WIDTH, HEIGHT));
}

#[test]
fn xy_and_bars_are_pngs() {
    let d = tempfile::tempdir().unwrap();
    let f = Figure::new("restore rate", "vmx").axes("concurrent restores", "restores/s");
    let p = d.path().join("xy.png");
    xy(
        &p,
        &f,
        &[
            XySeries::new("shoal", vec![(8.0, 90.0), (1.0, 20.0), (2.0, 38.0)]),
            XySeries::new("jailed", vec![(1.0, 18.0), (8.0, 70.0)]),
        ],
    )
    .unwrap();
    assert_eq!(png_size(&p), (WIDTH, HEIGHT));
    let p = d.path().join("bars.png");
    let f = Figure::new("exec throughput", "svm").axes("direction", "MB/s");
    bars(
        &p,
        &f,
        &[
            Bar::new("stdout", 120.0),
            Bar::new("upload", 80.5),
            Bar::new("download", 0.0),
        ],
    )
    .unwrap();
    assert_eq!(png_size(&p), (WIDTH, HEIGHT));
}

#[test]
fn bad_input_is_an_error_and_no_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("bad.png");
    let e = latency_cdf(&p, &fig(), &[]).unwrap_err();
    assert!(matches!(e, PlotError::NoSeries(_)), "{e}");
    let e = latency_cdf(&p, &fig(), &[Series::new("shoal", vec![])]).unwrap_err();
    assert!(
        matches!(&e, PlotError::Empty { series, .. } if series == "shoal"),
        "{e}"
    );
    assert!(e.to_string().contains("\"shoal\" is empty"), "{e}");
    let e = latency_cdf(&p, &fig(), &[Series::new("s", vec![1.0, f64::NAN])]).unwrap_err();
    assert!(matches!(&e, PlotError::NotFinite { index: 1, .. }), "{e}");
    let e = xy(
        &p,
        &fig(),
        &[XySeries::new("s", vec![(1.0, f64::INFINITY)])],
    )
    .unwrap_err();
    assert!(matches!(&e, PlotError::NotFinite { .. }), "{e}");
    let e = xy(&p, &fig(), &[XySeries::new("s", vec![])]).unwrap_err();
    assert!(matches!(&e, PlotError::Empty { .. }), "{e}");
    let e = bars(&p, &fig(), &[Bar::new("b", f64::NAN)]).unwrap_err();
    assert!(matches!(&e, PlotError::NotFinite { .. }), "{e}");
    assert!(bars(&p, &fig(), &[]).is_err());
    assert!(!p.exists(), "no figure for bad input");
}

#[test]
fn an_unwritable_path_is_an_error() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    // A directory under a regular file cannot be made.
    let e = latency_cdf(
        &file.join("a/b.png"),
        &fig(),
        &[Series::new("s", vec![1.0])],
    )
    .unwrap_err();
    assert!(matches!(e, PlotError::Io { .. }), "{e}");
}

#[test]
fn generic_document() {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("sdk-overhead.json");
    std::fs::write(
        &json,
        r#"{"title": "SDK overhead", "host": "pvm", "unit": "ms",
            "series": [{"label": "async SDK", "samples": [1.2, 1.3, 1.9]},
                       {"label": "raw HTTP", "samples": [1.1, 1.2]}],
            "xy": {"x_label": "concurrency (clients)", "y_label": "sandboxes/s",
                   "series": [{"label": "async SDK", "points": [[1, 10.0], [10, 80.0]]},
                              {"label": "p99", "points": [[1, 9.0]], "dashed": true, "color": 0}]},
            "bars": {"y_label": "ms", "bars": [{"label": "p50", "value": 1.3}]}}"#,
    )
    .unwrap();
    let out = d.path().join("figs");
    let files = doc::draw_file(&json, &out).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "sdk-overhead-cdf.png",
            "sdk-overhead-xy.png",
            "sdk-overhead-bars.png"
        ]
    );
    for f in &files {
        assert_eq!(png_size(f), (WIDTH, HEIGHT));
    }
    // Only an xy part.
    std::fs::write(
        &json,
        r#"{"title": "t", "xy": {"x_label": "N", "y_label": "MiB",
            "series": [{"label": "a", "points": [[1, 2]]}]}}"#,
    )
    .unwrap();
    assert_eq!(doc::draw_file(&json, &out).unwrap().len(), 1);
}

#[test]
fn bad_documents_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("x.json");
    let out = d.path().join("figs");
    let err = |text: &str| {
        std::fs::write(&json, text).unwrap();
        doc::draw_file(&json, &out).unwrap_err().to_string()
    };
    // Python's json.dumps writes NaN, which is not JSON.
    let e = err(r#"{"title": "t", "series": [{"label": "a", "samples": [1, NaN]}]}"#);
    assert!(e.contains("not a plot document"), "{e}");
    let e = err(r#"{"title": "t"}"#);
    assert!(e.contains("nothing to draw"), "{e}");
    let e = err(r#"{"title": "t", "series": [{"label": "a", "samples": []}]}"#);
    assert!(e.contains("\"a\" is empty"), "{e}");
    let e = err(r#"{"title": "t", "serie": []}"#);
    assert!(e.contains("unknown field"), "{e}");
    let e = doc::draw_file(&d.path().join("missing.json"), &out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.json"), "{e}");
    assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
}

#[test]
fn output_names_follow_the_json() {
    let o = Out::for_json(Path::new("/d"), Path::new("x/bench-boot.json"));
    assert_eq!(o.path("cdf"), Path::new("/d/bench-boot-cdf.png"));
    assert!(!o.host.is_empty());
}

#[test]
fn label_numbers() {
    assert_eq!(draw::num(0.0), "0");
    assert_eq!(draw::num(1234.56), "1235");
    assert_eq!(draw::num(123.45), "123.5");
    assert_eq!(draw::num(2.5), "2.5");
    assert_eq!(draw::num(3.0), "3");
    assert_eq!(draw::num(0.0125), "0.0125");
    assert_eq!(draw::num(0.62951), "0.63");
    assert_eq!(draw::display_unit("ms", 13000.0), ("s", 1e-3));
    assert_eq!(draw::display_unit("ms", 999.0), ("ms", 1.0));
    assert_eq!(draw::display_unit("MiB", 5000.0), ("MiB", 1.0));
}
