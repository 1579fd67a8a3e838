use super::*;
use crate::image::{build_image_with, AgentSource, BuildOptions, ImageSource};
use std::io::Read;
use std::os::unix::fs::symlink;
use std::time::Duration;

/// A small erofs layer holding `text` at `opt/kit/hello`, built into `out`.
fn layer(work: &Path, out: &Path, text: &str) {
    let src = work.join(format!(
        "src-{}",
        out.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(src.join("opt/kit")).unwrap();
    std::fs::write(src.join("opt/kit/hello"), text).unwrap();
    let opts = BuildOptions {
        agent: AgentSource::None,
    };
    build_image_with(ImageSource::Dir(src), out, &opts).unwrap();
}

fn refused(dir: &Path, p: &Path) -> String {
    open_layer(dir, p.to_str().unwrap())
        .expect_err("refused")
        .to_string()
}

fn not_allowed(dir: &Path, p: &Path) -> String {
    LayerError::NotAllowed {
        layer: p.display().to_string(),
        dir: dir.into(),
    }
    .to_string()
}

#[test]
fn a_layer_in_the_directory_opens_and_is_what_was_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("layers");
    std::fs::create_dir_all(dir.join("team")).unwrap();
    let kit = dir.join("team/kit.img");
    layer(tmp.path(), &kit, "one\n");
    let f = open_layer(&dir, kit.to_str().unwrap()).unwrap();
    assert_eq!(f.path, kit);
    assert_eq!(f.info.len % (2 << 20), 0);
    assert_eq!(f.identity(), crate::layers::file_identity(&kit));
    // Close-on-exec, blocking again.
    // SAFETY: F_GETFD/F_GETFL only read flags of a descriptor we hold.
    let (fd_flags, fl) = unsafe {
        (
            libc::fcntl(f.file.as_raw_fd(), libc::F_GETFD),
            libc::fcntl(f.file.as_raw_fd(), libc::F_GETFL),
        )
    };
    assert_ne!(fd_flags & libc::FD_CLOEXEC, 0);
    assert_eq!(fl & libc::O_NONBLOCK, 0);

    // Swapped after the check: another image renamed over the path, then a
    // symbolic link to a third. The open file is still the first one.
    let other = tmp.path().join("other.img");
    layer(tmp.path(), &other, "two\n");
    let before = f.file.metadata().unwrap().ino();
    std::fs::rename(&other, &kit).unwrap();
    std::fs::remove_file(&kit).unwrap();
    symlink("/etc/passwd", &kit).unwrap();
    assert_eq!(f.file.metadata().unwrap().ino(), before);
    let mut head = vec![0; 2048];
    (&*f.file).read_exact(&mut head).unwrap();
    assert_eq!(
        u32::from_le_bytes(head[1024..1028].try_into().unwrap()),
        0xe0f5_e1e2,
        "still the erofs image that was checked"
    );
    // The link itself is refused now.
    assert_eq!(refused(&dir, &kit), not_allowed(&dir, &kit));
}

#[test]
fn outside_the_directory_every_path_gets_the_same_words() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("layers");
    std::fs::create_dir_all(&dir).unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let real = outside.join("kit.img");
    layer(tmp.path(), &real, "x\n");
    let secret = outside.join("secret");
    std::fs::write(&secret, vec![0u8; 631]).unwrap();
    // Symbolic links inside pointing out, a linked directory, dot-dot.
    symlink(&real, dir.join("link.img")).unwrap();
    symlink(&outside, dir.join("linkdir")).unwrap();
    let paths = [
        real.clone(),
        secret.clone(),
        outside.join("missing"),
        PathBuf::from("/etc/shadow"),
        PathBuf::from("/proc/self/mem"),
        dir.clone(),
        dir.join("link.img"),
        dir.join("linkdir/kit.img"),
        dir.join("../outside/kit.img"),
        dir.join("missing.img"),
    ];
    for p in &paths {
        let m = refused(&dir, p);
        assert_eq!(m, not_allowed(&dir, p), "{}", p.display());
        assert!(!m.contains("631") && !m.contains("bytes"), "{m}");
    }
}

#[test]
fn a_fifo_or_device_in_the_directory_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("layers");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("pipe.img");
    let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path alive for the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let (d2, f2) = (dir.clone(), fifo.clone());
    std::thread::spawn(move || {
        let _ = tx.send(refused(&d2, &f2));
    });
    let m = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("opening a FIFO layer did not block");
    assert!(m.contains("not a regular file"), "{m}");
}

#[test]
fn a_file_in_the_directory_that_is_not_erofs_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("layers");
    std::fs::create_dir_all(&dir).unwrap();
    let zeros = dir.join("zeros.img");
    std::fs::File::create(&zeros)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let m = refused(&dir, &zeros);
    assert!(m.contains("not an erofs image"), "{m}");
    let short = dir.join("short.img");
    std::fs::write(&short, "abc").unwrap();
    let m = refused(&dir, &short);
    assert!(m.contains("not a multiple of"), "{m}");
    assert!(refused(&dir, Path::new("kit.img")).contains("absolute path"));
}

#[test]
fn the_fallback_without_openat2_follows_no_link_either() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("layers");
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("a/f"), "f").unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("f"), "o").unwrap();
    symlink(&outside, dir.join("b")).unwrap();
    symlink(outside.join("f"), dir.join("a/g")).unwrap();
    let dirfd = open_dir(&dir).unwrap();
    let mut s = String::new();
    File::from(open_by_components(&dirfd, Path::new("a/f")).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "f");
    for p in ["b/f", "a/g"] {
        let e = open_by_components(&dirfd, Path::new(p)).expect_err(p);
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)),
            "{p}: {e}"
        );
    }
}
