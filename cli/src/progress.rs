//! Progress on stderr for long steps: on a terminal, lines that stay plus
//! one status line (spinner, the step, its latest detail, elapsed time)
//! redrawn in place; elsewhere (logs, CI) plain lines, the status at most
//! every 30 s.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a plain (non-terminal) stderr gets the status.
const PLAIN_STATUS_EVERY: Duration = Duration::from_secs(30);

struct State {
    title: String,
    detail: String,
    since: Instant,
    /// Plain output: when the status (or the title) was last printed.
    printed: Option<Instant>,
}

/// A live status line; see the module docs.
pub struct Live {
    tty: bool,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
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

/// Columns of the terminal on stderr (80 when unknown).
fn width() -> usize {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct we pass.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

/// `s` cut to `n` characters.
fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
    t.push('…');
    t
}

fn status_text(st: &State, spinner: Option<char>, cols: usize) -> String {
    let mut s = String::new();
    if let Some(c) = spinner {
        s.push(c);
        s.push(' ');
    }
    s.push_str(&st.title);
    if !st.detail.is_empty() {
        s.push_str(": ");
        s.push_str(&st.detail);
    }
    let t = format!(" [{}]", elapsed(st.since.elapsed()));
    let room = cols.saturating_sub(t.chars().count() + 1);
    format!("{}{t}", cut(&s, room))
}

impl Live {
    /// Shows `title` until dropped.
    pub fn start(title: &str) -> Live {
        Self::start_on(title, std::io::stderr().is_terminal())
    }

    /// [`Live::start`], with `title` also printed as a line that stays.
    pub fn start_with_line(title: &str) -> Live {
        let tty = std::io::stderr().is_terminal();
        let l = Self::start_on(title, tty);
        if tty {
            l.line(title);
        }
        l
    }

    fn start_on(title: &str, tty: bool) -> Live {
        let state = Arc::new(Mutex::new(State {
            title: title.into(),
            detail: String::new(),
            since: Instant::now(),
            printed: Some(Instant::now()),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = if tty {
            let (st, stop) = (state.clone(), stop.clone());
            Some(std::thread::spawn(move || {
                let frames = ['|', '/', '-', '\\'];
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    {
                        let g = st.lock().unwrap_or_else(|e| e.into_inner());
                        let line = status_text(&g, Some(frames[i % 4]), width());
                        let mut e = std::io::stderr().lock();
                        let _ = write!(e, "\r\x1b[2K{line}");
                        let _ = e.flush();
                    }
                    i += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
            }))
        } else {
            eprintln!("{title}");
            None
        };
        Live {
            tty,
            state,
            stop,
            thread,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new step: the status shows `title`, its time starts now.
    pub fn step(&self, title: &str) {
        let mut g = self.lock();
        g.title = title.into();
        g.detail.clear();
        g.since = Instant::now();
        g.printed = Some(g.since);
        if !self.tty {
            eprintln!("{title}");
        }
    }

    /// The latest detail of the step (replaced by the next one).
    pub fn detail(&self, d: &str) {
        let mut g = self.lock();
        g.detail = d.trim().to_string();
        if !self.tty && g.printed.is_none_or(|t| t.elapsed() >= PLAIN_STATUS_EVERY) {
            g.printed = Some(Instant::now());
            eprintln!("{}", status_text(&g, None, usize::MAX));
        }
    }

    /// A line that stays (printed above the status line).
    pub fn line(&self, l: &str) {
        let _g = self.lock();
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = write!(e, "\r\x1b[2K");
        }
        let _ = writeln!(e, "{l}");
    }

    /// How long the current step has run.
    pub fn step_elapsed(&self) -> Duration {
        self.lock().since.elapsed()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fits_the_terminal_and_shows_elapsed_time() {
        let st = State {
            title: "[1/3] guest kernel".into(),
            detail: "412/840 objects (49%), 3m05s elapsed, ~3m10s left (CC fs/ext4/inode.o)".into(),
            since: Instant::now() - Duration::from_secs(185),
            printed: None,
        };
        let s = status_text(&st, Some('|'), 60);
        assert_eq!(s.chars().count(), 59, "{s}");
        assert!(s.starts_with("| [1/3] guest kernel: 412/840"), "{s}");
        assert!(s.ends_with("… [3m05s]"), "{s}");
        let wide = status_text(&st, None, usize::MAX);
        assert!(wide.ends_with("(CC fs/ext4/inode.o) [3m05s]"), "{wide}");
        assert_eq!(elapsed(Duration::from_millis(420)), "0.4 s");
        assert_eq!(elapsed(Duration::from_secs(42)), "42 s");
    }
}
