//! The read-only root on virtio-pmem with DAX, with real guests on /dev/kvm:
//! a test image (the tiny image plus a 6 MiB file, built with
//! `shoal_images::image::build_image`) is booted once as a pmem root and
//! snapshotted; sandboxes restored from that template see the image's
//! files, a DAX root, an overlay that takes their writes (each VM its own,
//! the image never changed) and read large files without growing the guest
//! page cache, unlike the same image on virtio-blk (a second template
//! boot). Bad images are refused before any boot.
//!
//! Two guest boots in all (~20-30 s each on a PVM host). Needs the
//! `shoal-vmm` binary (`SHOAL_VMM`, or the workspace build: use the release
//! one, see scripts/test.sh), and root (KVM, image extraction with device
//! nodes). The fixture directory stays in the target directory until the
//! next run empties it.

use agent_client::{Client, ExitStatus};
use shoal_images::artifacts;
use shoal_images::image::{build_image_with, AgentSource, BuildOptions, ImageSource};
use shoal_runtime::launch::{BootSpec, RootKind, INIT_MARKER};
use shoal_runtime::template;
use shoal_runtime::vmm_process::Io;
use shoal_test_support::{cmdline, image, kernel, require_kvm, require_root, RunningSandbox};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const BIG: &str = "/data/big.bin";
const BIG_LEN: usize = 6 << 20;

/// The test image and its directory (`CARGO_TARGET_TMPDIR/pmem-tests`,
/// emptied at the start of each run: statics are never dropped).
struct Fixture {
    dir: PathBuf,
    image: PathBuf,
    big: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        require_kvm();
        require_root("the tiny image's tree has device nodes to extract");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pmem-tests");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The tiny image's tree (busybox, the agent), plus a large file.
        let root = dir.join("root");
        let st = std::process::Command::new("fsck.erofs")
            .arg(format!("--extract={}", root.display()))
            .arg(image("tiny_erofs"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("fsck.erofs (erofs-utils)");
        assert!(st.success(), "extracting the tiny image");
        let mut x: u32 = 0x1234_5678;
        let big: Vec<u8> = (0..BIG_LEN)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x.to_le_bytes()[0]
            })
            .collect();
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::write(root.join("data/big.bin"), &big).unwrap();
        let img = dir.join("test.erofs");
        let opts = BuildOptions {
            agent: AgentSource::None, // the tiny image's agent is there
        };
        let info = build_image_with(ImageSource::Dir(root.clone()), &img, &opts).unwrap();
        assert!(info.dax && info.len.is_multiple_of(2 << 20), "{info:?}");
        std::fs::remove_dir_all(&root).unwrap();
        Fixture {
            dir,
            image: img,
            big,
        }
    })
}

fn spec(f: &Fixture, kind: RootKind, vsock: &Path) -> BootSpec {
    BootSpec {
        kernel: kernel(),
        root: f.image.clone(),
        root_kind: kind,
        cmdline: cmdline(),
        init_args: vec![],
        memory_mib: 128,
        vcpus: 1,
        vsock_uds: Some(vsock.to_path_buf()),
        extra_pmem: vec![],
        upper_disk: None,
        upper_size_mib: None,
    }
}

/// Boots the test image (server mode) and snapshots it once per kind.
fn template_for(kind: RootKind) -> PathBuf {
    static PMEM: OnceLock<PathBuf> = OnceLock::new();
    static BLK: OnceLock<PathBuf> = OnceLock::new();
    let cell = match kind {
        RootKind::Pmem => &PMEM,
        RootKind::Blk => &BLK,
        RootKind::BlkExt4Rw => panic!("no writable-root template here"),
    };
    cell.get_or_init(|| {
        let f = fixture();
        let dir = f.dir.join(format!("template-{}", kind.name()));
        let vsock = f.dir.join(format!("boot-{}.vsock", kind.name()));
        let vmm = artifacts::vmm_binary().expect("shoal-vmm built (cargo build -p vmm)");
        template::make(
            &spec(f, kind, &vsock),
            &vmm,
            &dir,
            INIT_MARKER,
            Duration::from_secs(600),
        )
        .unwrap_or_else(|e| panic!("{} template: {e}", kind.name()));
        let _ = std::fs::remove_file(&vsock);
        dir
    })
    .clone()
}

/// `/bin/sh -c script` in the guest: stdout and stderr together, and how
/// it ended.
fn sh(c: &Client, script: &str) -> (String, ExitStatus) {
    let (out, err, status) = shoal_test_support::sh(c, script);
    (out + &err, status)
}

fn sh_ok(c: &Client, script: &str) -> String {
    let (out, st) = sh(c, script);
    assert_eq!(st, ExitStatus::Exited(0), "{script}:\n{out}");
    out
}

/// `Cached:` of /proc/meminfo in KiB, before and after reading `path`
/// whole, in one guest command.
fn cached_around_read(c: &Client, path: &str) -> (u64, u64) {
    let out = sh_ok(
        c,
        &format!(
            "grep ^Cached: /proc/meminfo; cat {path} > /dev/null; grep ^Cached: /proc/meminfo"
        ),
    );
    let v: Vec<u64> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    assert_eq!(v.len(), 2, "{out}");
    (v[0], v[1])
}

#[test]
fn pmem_root_is_dax_with_a_private_overlay_per_vm() {
    let f = fixture();
    let pristine = std::fs::read(&f.image).unwrap();
    let tpl = template_for(RootKind::Pmem);
    let (ra, a) = RunningSandbox::start(&tpl);
    let (_rb, b) = RunningSandbox::start(&tpl);

    // The image's files.
    let out = sh_ok(
        &a,
        &format!("ls /bin/busybox /sbin/shoal-agent; wc -c < {BIG}"),
    );
    assert!(
        out.contains("/bin/busybox") && out.contains("/sbin/shoal-agent"),
        "{out}"
    );
    assert!(out.contains(&BIG_LEN.to_string()), "{out}");
    // Content, through the overlay and DAX (first and last bytes).
    let out = sh_ok(
        &a,
        &format!("head -c 16 {BIG} | od -An -tx1; tail -c 16 {BIG} | od -An -tx1"),
    );
    let hex = |b: &[u8]| {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        flat,
        format!("{} {}", hex(&f.big[..16]), hex(&f.big[BIG_LEN - 16..])),
    );

    // Mounts: an overlay root over the image, which is erofs with DAX.
    let mounts = sh_ok(&a, "cat /proc/mounts");
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"))
        .unwrap_or_else(|| panic!("no / in\n{mounts}"));
    assert!(root.starts_with("overlay / overlay rw"), "{mounts}");
    let image = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/run/shoal/image"))
        .unwrap_or_else(|| panic!("image not shown in\n{mounts}"));
    assert!(
        image.contains(" erofs ro") && image.contains("dax"),
        "{image}"
    );

    // Writes land in the overlay: everywhere a guest can write, including
    // the raw device. Each VM sees only its own.
    let spray = |who: &str| {
        format!(
            "for d in / /etc /bin /sbin /usr /root /data; do echo {who} > $d/.w || exit 1; done; \
             echo {who} >> {BIG}; \
             (echo {who} > /run/shoal/image/.w) 2>/dev/null && echo IMAGE-WRITABLE; \
             dd if=/dev/zero of=/dev/pmem0 bs=4096 count=4 conv=fsync 2>/dev/null; \
             mount -o remount,rw /run/shoal/image 2>/dev/null; \
             (echo {who} > /run/shoal/image/.w) 2>/dev/null && echo REMOUNTED-WRITABLE; \
             cat /etc/.w /data/.w; wc -c < {BIG}"
        )
    };
    let out_a = sh_ok(&a, &spray("AAA"));
    assert!(
        !out_a.contains("IMAGE-WRITABLE") && !out_a.contains("REMOUNTED-WRITABLE"),
        "{out_a}"
    );
    assert!(out_a.contains("AAA\nAAA\n"), "{out_a}");
    assert!(
        out_a.contains(&(BIG_LEN + 4).to_string()),
        "appended: {out_a}"
    );
    let out_b = sh_ok(&b, "cat /etc/.w 2>&1; wc -c < /data/big.bin");
    assert!(out_b.contains("No such file"), "B sees A's write: {out_b}");
    assert!(out_b.contains(&BIG_LEN.to_string()), "{out_b}");
    let out_b = sh_ok(&b, &spray("BBB"));
    assert!(
        out_b.contains("BBB\nBBB\n") && !out_b.contains("AAA") && !out_b.contains("WRITABLE"),
        "{out_b}"
    );
    assert_eq!(sh_ok(&a, "cat /etc/.w"), "AAA\n", "A keeps its own");
    // The VMM dropped and counted the raw device writes.
    let stats = vmm_api::Client::new(&ra.sb.api_sock, Duration::from_secs(10))
        .stats()
        .unwrap();
    assert!(stats.pmem_guest_writes > 0, "{stats:?}");

    drop((a, b));
    assert!(
        std::fs::read(&f.image).unwrap() == pristine,
        "the image file changed"
    );
}

#[test]
fn large_reads_bypass_the_guest_page_cache_on_pmem_only() {
    let f = fixture();
    let (_r, c) = RunningSandbox::start(&template_for(RootKind::Pmem));
    let (before, after) = cached_around_read(&c, BIG);
    eprintln!(
        "pmem: Cached {before} -> {after} KiB reading {} MiB",
        BIG_LEN >> 20
    );
    assert!(
        after.saturating_sub(before) < 1024,
        "DAX read grew the guest page cache: {before} -> {after} KiB"
    );
    // The same image on virtio-blk: the read fills the guest page cache.
    let (_r2, c2) = RunningSandbox::start(&template_for(RootKind::Blk));
    let (before, after) = cached_around_read(&c2, BIG);
    eprintln!("blk: Cached {before} -> {after} KiB");
    assert!(
        after.saturating_sub(before) >= (BIG_LEN as u64 >> 10) * 9 / 10,
        "virtio-blk read should fill the page cache: {before} -> {after} KiB"
    );
    let _ = f;
}

/// Starts `shoal-vmm` on `image` as a pmem root; returns its stderr (it
/// must fail before booting).
fn refused(image: &Path) -> String {
    let f = fixture();
    let vmm = artifacts::vmm_binary().expect("shoal-vmm built");
    let mut s = spec(f, RootKind::Pmem, &f.dir.join("never.vsock"));
    s.root = image.to_path_buf();
    let out = s
        .vmm_process(&vmm)
        .timeout(Duration::from_secs(60))
        .stdout(Io::Piped)
        .stderr(Io::Piped)
        .command()
        .unwrap()
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "it booted: {err}");
    err
}

#[test]
fn misaligned_and_truncated_images_are_refused() {
    let f = fixture();
    let bytes = std::fs::read(&f.image).unwrap();
    let odd = f.dir.join("odd.erofs");
    std::fs::write(&odd, &bytes[..bytes.len() - 4096]).unwrap();
    let e = refused(&odd);
    assert!(
        e.contains("odd.erofs")
            && e.contains("not a multiple of 2097152")
            && e.contains("shoal image build"),
        "{e}"
    );
    let cut = f.dir.join("cut.erofs");
    std::fs::write(&cut, &bytes[..2 << 20]).unwrap();
    let e = refused(&cut);
    assert!(e.contains("cut.erofs") && e.contains("truncated"), "{e}");
}
