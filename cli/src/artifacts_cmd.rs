//! Guest kernel and images for the daemon: `shoal artifacts build|show`,
//! the build the CLI does from a checkout before it asks shoald for a
//! template, and what `shoal doctor` says about them.

use crate::progress::{elapsed, Live};
use anyhow::Result;
use shoal_images::artifacts::build::{Checkout, Event, Report};
use shoal_images::artifacts::{Layout, Origin};
use std::collections::VecDeque;
use std::time::Duration;

/// A step shorter than this was a cache hit: its lines are not shown.
const QUICK: Duration = Duration::from_secs(3);

/// Shows a build script's lines for one step on a [`Live`]: held while
/// the step is quick, shown once it is not (a real build), and on failure
/// the held lines and the last lines of other tools' output.
struct StepReport<'a> {
    live: &'a Live,
    title: String,
    held: Vec<String>,
    shown: bool,
    tail: VecDeque<String>,
}

impl<'a> StepReport<'a> {
    fn new(live: &'a Live, title: &str) -> Self {
        live.step(title);
        StepReport {
            live,
            title: title.into(),
            held: vec![],
            shown: false,
            tail: VecDeque::new(),
        }
    }

    fn show(&mut self, l: String) {
        if !self.shown && self.live.step_elapsed() >= QUICK {
            self.shown = true;
            for h in self.held.drain(..) {
                self.live.line(&h);
            }
        }
        if self.shown {
            self.live.line(&l);
        } else {
            self.held.push(l);
        }
    }

    /// The step's closing line.
    fn done(self) {
        let t = elapsed(self.live.step_elapsed());
        let how = if self.shown {
            format!("done in {t}")
        } else {
            format!("ready ({t})")
        };
        self.live.line(&format!("{}: {how}", self.title));
    }
}

impl Report for StepReport<'_> {
    fn event(&mut self, e: Event<'_>) {
        match e {
            Event::Step(m) => {
                self.show(format!("{}: {m}", self.title));
                self.live.detail(m);
            }
            Event::Progress(p) => self.live.detail(p),
            Event::Detail(d) => {
                if self.tail.len() == 30 {
                    self.tail.pop_front();
                }
                self.tail.push_back(d.to_string());
                if !d.trim().is_empty() {
                    self.live.detail(d);
                }
            }
        }
    }

    fn failed(&mut self) {
        for h in self.held.drain(..) {
            self.live.line(&h);
        }
        if !self.tail.is_empty() {
            self.live.line("last lines of the tools' output:");
            for t in self.tail.drain(..) {
                self.live.line(&format!("  | {t}"));
            }
        }
    }
}

/// Steps of a build: the kernel, then each image.
pub fn build_steps(images: &[String]) -> Vec<String> {
    std::iter::once("guest kernel".to_string())
        .chain(images.iter().map(|i| format!("'{i}' image")))
        .collect()
}

/// Builds the kernel and `images` from `checkout` and installs them into
/// `layout`, on `live` as steps `first..` of `total`.
pub fn build_into(
    checkout: &Checkout,
    layout: &Layout,
    images: &[String],
    live: &Live,
    first: usize,
    total: usize,
) -> Result<()> {
    use shoal_images::artifacts::build::{install_cmdline, install_file};
    let titles = build_steps(images);
    let title = |i: usize| format!("  [{}/{total}] {}", first + i, titles[i]);
    let mut files = vec![];
    let mut r = StepReport::new(live, &title(0));
    files.push(("vmlinux".to_string(), checkout.kernel(&mut r)?));
    r.done();
    for (i, name) in images.iter().enumerate() {
        let mut r = StepReport::new(live, &title(i + 1));
        files.extend(checkout.images(name, &mut r)?);
        r.done();
    }
    for (key, src) in &files {
        install_file(layout, key, src)?;
    }
    install_cmdline(layout, &checkout.cmdline()?)?;
    Ok(())
}

/// What the CLI builds before asking the daemon for a template of these
/// images: nothing without a checkout, or when the layout is an installed
/// one (SHOAL_ARTIFACTS, next to the binaries) that has them all: those
/// are the operator's, left as they are.
pub fn plan_build(layout: &Layout, images: &[String]) -> Option<Checkout> {
    let checkout = Checkout::find()?;
    let complete = layout.kernel().is_ok()
        && layout.cmdline().is_ok()
        && images.iter().all(|i| layout.image(i).is_ok());
    (layout.origin == Origin::Cache || !complete).then_some(checkout)
}

/// `shoal artifacts build [--dir DIR] [IMAGE...]`.
pub fn build_cmd(dir: Option<std::path::PathBuf>, images: &[String]) -> Result<i32> {
    let layout = dir.map(Layout::at).unwrap_or_else(Layout::default_location);
    let checkout = Checkout::find().ok_or_else(|| {
        shoal_images::artifacts::ArtifactError::NoCheckout(shoal_images::artifacts::repo_root())
    })?;
    let images = expand_images(images);
    let total = 1 + images.len();
    {
        let live = Live::start_with_line(&format!(
            "shoal: building the guest kernel and images {images:?} from {} into {}",
            checkout.root.display(),
            layout.dir.display()
        ));
        build_into(&checkout, &layout, &images, &live, 1, total)?;
    }
    print!("{}", show_text(&layout));
    Ok(0)
}

/// The images `shoal artifacts build` builds: tiny and base when none are
/// named; `layers` stands for every built-in layer.
pub fn expand_images(names: &[String]) -> Vec<String> {
    if names.is_empty() {
        return shoal_images::artifacts::IMAGES
            .iter()
            .map(|s| s.to_string())
            .collect();
    }
    let mut v: Vec<String> = vec![];
    for n in names {
        let add: Vec<String> = if n == "layers" {
            shoal_images::lang_layers::names()
                .into_iter()
                .map(String::from)
                .collect()
        } else {
            vec![n.clone()]
        };
        for a in add {
            if !v.contains(&a) {
                v.push(a);
            }
        }
    }
    v
}

/// The layout's directory, where it came from, and each file.
pub fn show_text(layout: &Layout) -> String {
    let mut s = format!(
        "guest artifacts  {} ({})\n",
        layout.dir.display(),
        layout.origin.describe()
    );
    for (item, path, present) in layout.status() {
        s.push_str(&format!(
            "  {:<30} {:<8} {}\n",
            item.what,
            if present { "present" } else { "missing" },
            path.display()
        ));
    }
    let how = match Checkout::find() {
        Some(c) => format!(
            "checkout {}: `shoal run` builds and installs what a template needs on first \
             use; `shoal artifacts build` does it now",
            c.root.display()
        ),
        None => "no checkout here: shoald only reads the directory above (install a built \
                 layout there, or run `shoal artifacts build` in a Shoal checkout)"
            .into(),
    };
    s.push_str(&format!("  built from: {how}\n"));
    s
}

/// The same as JSON (for `shoal doctor --json`).
pub fn show_json(layout: &Layout) -> serde_json::Value {
    let items: Vec<serde_json::Value> = layout
        .status()
        .into_iter()
        .map(|(i, p, present)| serde_json::json!({"key": i.key, "path": p, "present": present}))
        .collect();
    serde_json::json!({
        "dir": layout.dir,
        "origin": layout.origin.describe(),
        "items": items,
        "checkout": Checkout::find().map(|c| c.root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_expands_to_every_built_in_layer() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(expand_images(&[]), s(&["tiny", "base"]));
        assert_eq!(
            expand_images(&s(&["base", "layers", "fncall-cpp"])),
            s(&[
                "base",
                "fncall-python",
                "fncall-cpp",
                "fncall-nodejs",
                "code-interpreter"
            ])
        );
    }
}
