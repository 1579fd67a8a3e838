//! Building the guest kernel and images from a source checkout (its
//! scripts, which cache by content hash) and installing them into a
//! [`Layout`]. Only the CLI and tests use this; shoald reads layouts.

use super::{item, ArtifactError, Layout};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A line a build script wrote on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// One of the script's own messages (`build-kernel: ...`), without the
    /// prefix: a step.
    Step(&'a str),
    /// A `progress ...` message, without the prefix: how far the current
    /// step is (superseded by the next one).
    Progress(&'a str),
    /// Anything else (apt-get, cargo, debootstrap, ...).
    Detail(&'a str),
}

impl<'a> Event<'a> {
    /// Classifies a line of `script`'s stderr (`build-kernel.sh` prefixes
    /// its messages with `build-kernel: `).
    pub fn parse(script: &str, line: &'a str) -> Event<'a> {
        let name = script.trim_end_matches(".sh");
        match line.strip_prefix(name).and_then(|l| l.strip_prefix(": ")) {
            Some(m) => match m.strip_prefix("progress ") {
                Some(p) => Event::Progress(p),
                None => Event::Step(m),
            },
            None => Event::Detail(line),
        }
    }
}

/// Where a build script's output goes.
pub trait Report {
    /// A line.
    fn event(&mut self, e: Event<'_>);
    /// The script failed (after its last line).
    fn failed(&mut self) {}
}

impl<F: FnMut(Event<'_>)> Report for F {
    fn event(&mut self, e: Event<'_>) {
        self(e)
    }
}

/// Prints a script's stderr only once it has run for more than a moment
/// (a real build) or failed, so that cache hits stay quiet.
pub struct QuietUnlessSlow {
    start: Instant,
    held: Vec<String>,
    live: bool,
}

/// A [`QuietUnlessSlow`] starting now.
pub fn quiet_unless_slow() -> QuietUnlessSlow {
    QuietUnlessSlow {
        start: Instant::now(),
        held: vec![],
        live: false,
    }
}

impl Report for QuietUnlessSlow {
    fn event(&mut self, e: Event<'_>) {
        let line = match e {
            Event::Step(l) | Event::Detail(l) => l.to_string(),
            Event::Progress(p) => format!("progress {p}"),
        };
        if !self.live && self.start.elapsed() > Duration::from_secs(3) {
            self.live = true;
            for h in self.held.drain(..) {
                eprintln!("{h}");
            }
        }
        if self.live {
            eprintln!("{line}");
        } else {
            self.held.push(line);
        }
    }

    fn failed(&mut self) {
        for h in self.held.drain(..) {
            eprintln!("{h}");
        }
    }
}

/// A source checkout with the build scripts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkout {
    /// Its root.
    pub root: PathBuf,
}

impl Checkout {
    /// The checkout this was built from ([`super::repo_root`]), when it is
    /// there with its scripts.
    pub fn find() -> Option<Checkout> {
        Checkout::at(&super::repo_root()).ok()
    }

    /// The checkout at `root`.
    pub fn at(root: &Path) -> Result<Checkout, ArtifactError> {
        let has = |p: &str| root.join(p).is_file();
        if has("scripts/build-kernel.sh") && has("scripts/build-images.sh") {
            Ok(Checkout { root: root.into() })
        } else {
            Err(ArtifactError::NoCheckout(root.into()))
        }
    }

    /// Runs `scripts/NAME args`; its stderr goes to `report` line by line
    /// as it comes, its stdout is returned.
    pub fn run_script(
        &self,
        name: &str,
        args: &[&str],
        report: &mut dyn Report,
    ) -> Result<String, ArtifactError> {
        let script = self.root.join("scripts").join(name);
        let mut child = Command::new("bash")
            .arg(&script)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| ArtifactError::Spawn {
                script: script.clone(),
                source,
            })?;
        let out = child.stdout.take();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut o) = out {
                let _ = o.read_to_string(&mut s);
            }
            s
        });
        if let Some(e) = child.stderr.take() {
            for line in BufReader::new(e).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line);
                report.event(Event::parse(name, line.trim_end_matches('\r')));
            }
        }
        let status = child.wait().map_err(|source| ArtifactError::Spawn {
            script: script.clone(),
            source,
        })?;
        let out = reader.join().unwrap_or_default();
        if !status.success() {
            report.failed();
            return Err(ArtifactError::Failed { script, status });
        }
        Ok(out)
    }

    /// Builds the guest kernel (cached; `SHOAL_KERNEL` overrides).
    pub fn kernel(&self, report: &mut dyn Report) -> Result<PathBuf, ArtifactError> {
        let out = self.run_script("build-kernel.sh", &[], report)?;
        out.lines()
            .last()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| ArtifactError::NoOutput {
                script: "scripts/build-kernel.sh".into(),
                what: "the vmlinux path".into(),
            })
    }

    /// Builds image `name` (`tiny` or `base`, cached; or a built-in layer,
    /// [`crate::lang_layers`], over `base`); returns its files by key
    /// (`tiny_erofs`, `tiny_cpio`, `base_erofs`, `NAME_erofs`).
    pub fn images(
        &self,
        name: &str,
        report: &mut dyn Report,
    ) -> Result<Vec<(String, PathBuf)>, ArtifactError> {
        if let Some(r) = crate::lang_layers::recipe(name) {
            let base = self.image("base_erofs", report)?;
            let file = crate::layer_cache::build_cached(r, &base, &mut |l| {
                report.event(Event::Step(l));
            })
            .map_err(|e| ArtifactError::Layer {
                name: name.into(),
                detail: e.to_string(),
            })?;
            return Ok(vec![(format!("{name}_erofs"), file)]);
        }
        if !super::IMAGES.contains(&name) {
            return Err(ArtifactError::UnknownImage(name.into()));
        }
        let out = self.run_script("build-images.sh", &[name], report)?;
        let files: Vec<(String, PathBuf)> = out
            .lines()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| k.starts_with(name) && item(k).is_some())
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        if files.is_empty() {
            return Err(ArtifactError::NoOutput {
                script: "scripts/build-images.sh".into(),
                what: format!("the {name} image"),
            });
        }
        Ok(files)
    }

    /// One image file by key (`tiny_erofs`, `tiny_cpio`, `base_erofs`).
    pub fn image(&self, key: &str, report: &mut dyn Report) -> Result<PathBuf, ArtifactError> {
        // `tiny_agent_erofs` comes with `tiny` (layer names have no '_').
        let which = key.split_once('_').map_or(key, |(w, _)| w);
        self.images(which, report)?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, p)| p)
            .ok_or_else(|| ArtifactError::NoOutput {
                script: "scripts/build-images.sh".into(),
                what: key.into(),
            })
    }

    /// The base kernel command line (`kernel-configs/cmdline`).
    pub fn cmdline(&self) -> Result<String, ArtifactError> {
        let p = self.root.join("kernel-configs/cmdline");
        std::fs::read_to_string(&p)
            .map(|s| s.trim().to_string())
            .map_err(|e| ArtifactError::Io(p, e))
    }

    /// Builds the kernel and `images` and installs them, with the command
    /// line, into `layout`. `step` is told each step as it begins
    /// (`"guest kernel"`, `"'base' image"`, `"install"`), `report` gets the
    /// scripts' lines.
    pub fn build_and_install(
        &self,
        layout: &Layout,
        images: &[&str],
        step: &mut dyn FnMut(&str),
        report: &mut dyn Report,
    ) -> Result<(), ArtifactError> {
        step("guest kernel");
        let mut files = vec![("vmlinux".to_string(), self.kernel(report)?)];
        for name in images {
            step(&format!("'{name}' image"));
            files.extend(self.images(name, report)?);
        }
        step("install");
        for (key, src) in &files {
            install_file(layout, key, src)?;
        }
        install_cmdline(layout, &self.cmdline()?)?;
        Ok(())
    }
}

/// Whether `a` and `b` are the same file, or a copy of it made by
/// [`install_file`] (same size and modification time).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => {
            (x.dev(), x.ino()) == (y.dev(), y.ino())
                || (x.len() == y.len()
                    && x.mtime() == y.mtime()
                    && x.mtime_nsec() == y.mtime_nsec())
        }
        _ => false,
    }
}

/// Installs `src` as the layout's file `key` (a hard link when on the same
/// file system, else a copy), replacing an older one atomically (restored
/// VMs that map the old one keep it). Returns the installed path.
pub fn install_file(layout: &Layout, key: &str, src: &Path) -> Result<PathBuf, ArtifactError> {
    let (rel, _) = super::key_path(key).ok_or_else(|| ArtifactError::UnknownImage(key.into()))?;
    let dst = layout.dir.join(rel);
    if same_file(src, &dst) {
        return Ok(dst);
    }
    let parent = dst.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ArtifactError::Io(parent.into(), e))?;
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    let tmp = parent.join(format!(".{name}.tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(src, &tmp).is_err() {
        let io = |e| ArtifactError::Io(tmp.clone(), e);
        std::fs::copy(src, &tmp).map_err(io)?;
        let mtime = std::fs::metadata(src)
            .and_then(|m| m.modified())
            .map_err(|e| ArtifactError::Io(src.into(), e))?;
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .and_then(|f| f.set_modified(mtime))
            .map_err(io)?;
    }
    std::fs::rename(&tmp, &dst).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        ArtifactError::Io(dst.clone(), e)
    })?;
    Ok(dst)
}

/// Writes the layout's `cmdline` (atomically, when it changed).
pub fn install_cmdline(layout: &Layout, cmdline: &str) -> Result<(), ArtifactError> {
    let dst = layout.dir.join("cmdline");
    let want = format!("{}\n", cmdline.trim());
    if std::fs::read_to_string(&dst).is_ok_and(|s| s == want) {
        return Ok(());
    }
    std::fs::create_dir_all(&layout.dir).map_err(|e| ArtifactError::Io(layout.dir.clone(), e))?;
    let tmp = layout
        .dir
        .join(format!(".cmdline.tmp{}", std::process::id()));
    std::fs::write(&tmp, want).map_err(|e| ArtifactError::Io(tmp.clone(), e))?;
    std::fs::rename(&tmp, &dst).map_err(|e| ArtifactError::Io(dst, e))
}
