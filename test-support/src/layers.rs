//! Read-only layers built from a few files, and ext4 images read on the
//! host.

use shoal_images::image::{build_image_with, AgentSource, BuildOptions, ImageInfo, ImageSource};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds a read-only layer at `out` holding `files` (a path under the
/// layer's root, its content), as `shoal image build DIR -o OUT
/// --no-agent` does; the source tree is left in `OUT.src`.
pub fn layer(out: &Path, files: &[(&str, &str)]) -> ImageInfo {
    let mut src = out.as_os_str().to_owned();
    src.push(".src");
    let src = PathBuf::from(src);
    for (path, content) in files {
        let p = src.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().expect("a file under the root")).unwrap();
        std::fs::write(&p, content).unwrap();
    }
    let opts = BuildOptions {
        agent: AgentSource::None,
    };
    build_image_with(ImageSource::Dir(src), out, &opts)
        .unwrap_or_else(|e| panic!("building layer {}: {e}", out.display()))
}

/// `debugfs -R CMD` on an ext4 image: what it prints (e.g. a file's
/// content for `cat PATH`), read on the host without mounting it.
pub fn debugfs(img: &Path, cmd: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(cmd)
        .arg(img)
        .output()
        .expect("debugfs (e2fsprogs)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
