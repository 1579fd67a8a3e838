//! Progress on stderr for long steps, drawn with `indicatif`: on a
//! terminal, lines that stay plus one status line redrawn in place (a
//! spinner, the step, its latest detail, the step's elapsed time), which
//! becomes a bar when the work has a known size: the bytes of a copy
//! ([`Live::bytes`], [`Counted`]), or a detail that starts with "N/M" (the
//! kernel build's "412/840 objects ..."). Elsewhere (logs, CI, `TERM=dumb`)
//! nothing is redrawn: plain lines, the status at most every 30 s.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::io::{Read, Write};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a plain (non-terminal) stderr gets the status.
const PLAIN_STATUS_EVERY: Duration = Duration::from_secs(30);

/// The status line's shapes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// A spinner: nothing to count.
    Spinner,
    /// A bar of items ("412/840 objects").
    Items,
    /// A bar of bytes with a known total.
    Bytes,
    /// Bytes without a total: a count and a rate.
    BytesOpen,
}

struct State {
    title: String,
    detail: String,
    since: Instant,
    shape: Shape,
    /// Plain output: when the status (or the title) was last printed.
    printed: Option<Instant>,
}

/// A live status line; see the module docs.
pub struct Live {
    /// `None` when stderr is not a terminal: plain lines instead.
    bar: Option<ProgressBar>,
    /// Without a terminal, print the title and status lines (else nothing).
    plain: bool,
    state: Mutex<State>,
}

/// "3m05s", "42 s", "0.4 s".
pub fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=9 => format!("{:.1} s", d.as_secs_f64()),
        10..=59 => format!("{s} s"),
        _ => format!("{}m{:02}s", s / 60, s % 60),
    }
}

/// "12.3 MiB", "512 B".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The "N/M" a detail starts with (N <= M, M > 0), and the rest.
fn fraction(d: &str) -> Option<(u64, u64)> {
    let head = d.split_whitespace().next()?;
    let (n, m) = head.split_once('/')?;
    let (n, m) = (n.parse::<u64>().ok()?, m.parse::<u64>().ok()?);
    (m > 0 && n <= m).then_some((n, m))
}

fn template(shape: Shape) -> &'static str {
    match shape {
        Shape::Spinner => "{spinner} {wide_msg} [{step_elapsed}]",
        Shape::Items => "{spinner} {wide_msg} [{bar:24}] {pos}/{len} [{step_elapsed}]",
        Shape::Bytes => {
            "{spinner} {wide_msg} [{bar:24}] {bytes}/{total_bytes} {binary_bytes_per_sec} [{step_elapsed}]"
        }
        Shape::BytesOpen => "{spinner} {wide_msg} {bytes} {binary_bytes_per_sec} [{step_elapsed}]",
    }
}

fn style(shape: Shape) -> ProgressStyle {
    let t = template(shape);
    ProgressStyle::with_template(t)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .tick_chars("|/-\\ ")
        .progress_chars("=> ")
        .with_key(
            "step_elapsed",
            |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&elapsed(s.elapsed()));
            },
        )
}

/// The status as one plain line (the step, its detail, elapsed time).
fn status_text(st: &State) -> String {
    let mut s = st.title.clone();
    if !st.detail.is_empty() {
        s.push_str(": ");
        s.push_str(&st.detail);
    }
    format!("{s} [{}]", elapsed(st.since.elapsed()))
}

/// The bar's message: the step and its detail.
fn message(st: &State) -> String {
    match st.detail.is_empty() {
        true => st.title.clone(),
        false => format!("{}: {}", st.title, st.detail),
    }
}

impl Live {
    /// Shows `title` until dropped.
    pub fn start(title: &str) -> Live {
        Self::start_on(title, Self::terminal_bar(), true)
    }

    /// [`Live::start`], silent when stderr is not a terminal (for a short
    /// step whose result the caller prints: a copy).
    pub fn start_quiet(title: &str) -> Live {
        Self::start_on(title, Self::terminal_bar(), false)
    }

    /// A bar on stderr when it is a terminal that can redraw.
    fn terminal_bar() -> Option<ProgressBar> {
        let target = ProgressDrawTarget::stderr();
        (!target.is_hidden()).then(|| ProgressBar::with_draw_target(None, target))
    }

    /// [`Live::start`], with `title` also printed as a line that stays.
    pub fn start_with_line(title: &str) -> Live {
        let l = Self::start(title);
        if l.bar.is_some() {
            l.line(title);
        }
        l
    }

    fn start_on(title: &str, bar: Option<ProgressBar>, plain: bool) -> Live {
        let st = State {
            title: title.into(),
            detail: String::new(),
            since: Instant::now(),
            shape: Shape::Spinner,
            printed: Some(Instant::now()),
        };
        match &bar {
            Some(b) => {
                b.set_style(style(Shape::Spinner));
                b.set_message(message(&st));
                b.enable_steady_tick(Duration::from_millis(200));
            }
            None if plain => eprintln!("{title}"),
            None => {}
        }
        Live {
            bar,
            plain,
            state: Mutex::new(st),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shape(&self, g: &mut State, shape: Shape) {
        if g.shape != shape {
            g.shape = shape;
            if let Some(b) = &self.bar {
                b.set_style(style(shape));
                if shape == Shape::Spinner || shape == Shape::BytesOpen {
                    b.unset_length();
                }
            }
        }
    }

    /// A new step: the status shows `title`, its time starts now.
    pub fn step(&self, title: &str) {
        let mut g = self.lock();
        g.title = title.into();
        g.detail.clear();
        g.since = Instant::now();
        g.printed = Some(g.since);
        self.shape(&mut g, Shape::Spinner);
        match &self.bar {
            Some(b) => {
                b.set_position(0);
                b.reset_elapsed();
                b.set_message(message(&g));
            }
            None if self.plain => eprintln!("{title}"),
            None => {}
        }
    }

    /// The latest detail of the step (replaced by the next one); one that
    /// starts with "N/M" moves a bar.
    pub fn detail(&self, d: &str) {
        let mut g = self.lock();
        g.detail = d.trim().to_string();
        match &self.bar {
            Some(b) => {
                match fraction(&g.detail) {
                    Some((n, m)) => {
                        self.shape(&mut g, Shape::Items);
                        b.set_length(m);
                        b.set_position(n);
                    }
                    None if g.shape == Shape::Items => self.shape(&mut g, Shape::Spinner),
                    None => {}
                }
                b.set_message(message(&g));
            }
            None => self.plain_status(&mut g),
        }
    }

    /// `done` bytes of `total` (when known) of the step moved.
    pub fn bytes(&self, done: u64, total: Option<u64>) {
        let mut g = self.lock();
        match &self.bar {
            Some(b) => {
                match total {
                    Some(t) => {
                        self.shape(&mut g, Shape::Bytes);
                        b.set_length(t);
                    }
                    None => self.shape(&mut g, Shape::BytesOpen),
                }
                b.set_position(done);
            }
            None => {
                g.detail = match total {
                    Some(t) => format!("{} of {}", bytes(done), bytes(t)),
                    None => bytes(done),
                };
                self.plain_status(&mut g);
            }
        }
    }

    fn plain_status(&self, g: &mut State) {
        if self.plain && g.printed.is_none_or(|t| t.elapsed() >= PLAIN_STATUS_EVERY) {
            g.printed = Some(Instant::now());
            eprintln!("{}", status_text(g));
        }
    }

    /// A line that stays (printed above the status line).
    pub fn line(&self, l: &str) {
        let _g = self.lock();
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("{l}")),
            None => eprintln!("{l}"),
        }
    }

    /// How long the current step has run.
    pub fn step_elapsed(&self) -> Duration {
        self.lock().since.elapsed()
    }

    /// `inner`, with the bytes read or written through it shown as this
    /// step's progress (of `total` when known).
    pub fn counted<T>(&self, inner: T, total: Option<u64>) -> Counted<'_, T> {
        self.bytes(0, total);
        Counted {
            inner,
            live: self,
            done: 0,
            total,
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// A reader or writer whose bytes move a [`Live`]'s bar ([`Live::counted`]).
pub struct Counted<'a, T> {
    inner: T,
    live: &'a Live,
    done: u64,
    total: Option<u64>,
}

impl<T> Counted<'_, T> {
    fn moved(&mut self, n: usize) {
        self.done += n as u64;
        self.live.bytes(self.done, self.total);
    }
}

impl<T: Read> Read for Counted<'_, T> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.moved(n);
        Ok(n)
    }
}

impl<T: Write> Write for Counted<'_, T> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.moved(n);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(title: &str, detail: &str, secs: u64) -> State {
        State {
            title: title.into(),
            detail: detail.into(),
            since: Instant::now() - Duration::from_secs(secs),
            shape: Shape::Spinner,
            printed: None,
        }
    }

    #[test]
    fn plain_status_shows_the_step_its_detail_and_elapsed_time() {
        let st = state(
            "[1/3] guest kernel",
            "412/840 objects (49%), 3m05s elapsed, ~3m10s left (CC fs/ext4/inode.o)",
            185,
        );
        let s = status_text(&st);
        assert!(s.starts_with("[1/3] guest kernel: 412/840"), "{s}");
        assert!(s.ends_with("(CC fs/ext4/inode.o) [3m05s]"), "{s}");
        assert_eq!(message(&state("t", "", 0)), "t");
        assert_eq!(elapsed(Duration::from_millis(420)), "0.4 s");
        assert_eq!(elapsed(Duration::from_secs(42)), "42 s");
    }

    #[test]
    fn fractions_and_byte_counts() {
        assert_eq!(fraction("412/840 objects (49%)"), Some((412, 840)));
        assert_eq!(fraction("840/840"), Some((840, 840)));
        assert_eq!(fraction("900/840 objects"), None);
        assert_eq!(fraction("3/0 x"), None);
        assert_eq!(fraction("make -j2 vmlinux"), None);
        assert_eq!(fraction("a/b"), None);
        assert_eq!(fraction(""), None);
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(100 << 20), "100.0 MiB");
    }

    #[test]
    fn every_shape_has_a_valid_template() {
        for s in [Shape::Spinner, Shape::Items, Shape::Bytes, Shape::BytesOpen] {
            assert!(ProgressStyle::with_template(template(s)).is_ok(), "{s:?}");
            // Drawing into a hidden bar with it does not panic.
            let b = ProgressBar::hidden().with_style(style(s));
            b.set_length(10);
            b.set_position(3);
            b.set_message("m");
            b.tick();
        }
    }

    #[test]
    fn counted_io_moves_the_bytes_and_passes_the_data() {
        // Not a terminal here (cargo test captures stderr): plain mode.
        let live = Live::start_on("copy", None, false);
        let data = vec![7u8; 100_000];
        let mut r = live.counted(&data[..], Some(data.len() as u64));
        let mut out = Vec::new();
        std::io::copy(&mut r, &mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(r.done, 100_000);
        let mut w = live.counted(Vec::new(), None);
        w.write_all(b"hello").unwrap();
        assert_eq!(w.done, 5);
        assert_eq!(w.inner, b"hello");
        assert_eq!(live.lock().detail, "5 B");
    }
}
