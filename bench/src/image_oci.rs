//! What `shoal bench image` needs around the image store (the loopback
//! registry and the push are the tests' own, `shoal_test_support::registry`):
//! a multi-layer test image built
//! here from random-but-compressible files (no internet), pushed with
//! `skopeo copy`, and the peer's pull+convert chain (`skopeo copy` to an
//! OCI layout, `tar -xzf` per layer, `mkfs.erofs` per layer directory).

use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A static busybox put into the image (the guest's `sh`, `cat`, `true`).
pub const BUSYBOX: &str = "/bin/busybox";
/// Where the read set lives in the image.
pub const READ_DIR: &str = "/bench/read";

/// Bytes this process and its waited children wrote so far.
pub fn written_so_far() -> u64 {
    // SAFETY: getrusage fills the zeroed struct we own.
    let children = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut r);
        u64::try_from(r.ru_oublock).unwrap_or(0)
    };
    crate::hostmem::write_bytes("self") + children * 512
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// A file operation.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// A tool failed or is missing.
    #[error("{0}")]
    Tool(String),
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.to_string();
    move |e| OciError::Io(what, e)
}

/// Runs `cmd`, failing with its stderr.
pub fn run_tool(cmd: &mut Command) -> Result<(), OciError> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| {
            OciError::Tool(format!(
                "cannot run {:?}: {e} (apt-get install -y docker-registry skopeo erofs-utils)",
                cmd.get_program()
            ))
        })?;
    if !out.status.success() {
        return Err(OciError::Tool(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The test image as built.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuiltImage {
    /// Layers.
    pub layers: usize,
    /// Regular files in all layers.
    pub files: usize,
    /// Uncompressed tar bytes of all layers.
    pub tar_bytes: u64,
    /// Compressed (gzip) blob bytes of all layers.
    pub blob_bytes: u64,
    /// Bytes of the read set (in the top layer, under [`READ_DIR`]).
    pub read_bytes: u64,
    /// Its files.
    pub read_files: usize,
}

/// Compressible, distinct content: 16 symbols (4 bits of entropy per byte,
/// so gzip keeps a bit more than half).
fn fill(x: &mut u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        for b in x.to_le_bytes() {
            if v.len() < len {
                v.push(b'a' + (b & 15));
            }
        }
    }
    v
}

fn header(kind: tar::EntryType, path: &str, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_path(path);
    h.set_cksum();
    h
}

fn sha(bytes: &[u8]) -> String {
    let h = Sha256::digest(bytes);
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn put_blob(layout: &Path, bytes: &[u8]) -> Result<String, OciError> {
    let d = sha(bytes);
    let p = layout
        .join("blobs/sha256")
        .join(d.trim_start_matches("sha256:"));
    std::fs::write(&p, bytes).map_err(io(p.display()))?;
    Ok(d)
}

/// Writes an OCI layout at `layout` (tag `tag`) of an image of about
/// `total` bytes in `layers` gzip layers of 1 MiB files: the lowest holds
/// busybox (`/bin/sh`, `cat`, `true`), the top one the read set
/// (`read_bytes` in `read_files` files under [`READ_DIR`]).
pub fn write_image(
    layout: &Path,
    tag: &str,
    total: u64,
    layers: usize,
    read_bytes: u64,
    read_files: usize,
) -> Result<BuiltImage, OciError> {
    let layers = layers.max(1);
    std::fs::create_dir_all(layout.join("blobs/sha256")).map_err(io(layout.display()))?;
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .map_err(io(layout.display()))?;
    let busybox = std::fs::read(BUSYBOX).map_err(io(BUSYBOX))?;
    let filler = total.saturating_sub(read_bytes + busybox.len() as u64);
    let per_layer = filler / layers as u64;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut built = BuiltImage {
        layers,
        files: 0,
        tar_bytes: 0,
        blob_bytes: 0,
        read_bytes,
        read_files: read_files.max(1),
    };
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for l in 0..layers {
        let mut b = tar::Builder::new(Vec::new());
        let dir = |b: &mut tar::Builder<Vec<u8>>, p: &str| {
            b.append(&header(tar::EntryType::Directory, p, 0o755, 0), &[][..])
        };
        let mut file = |b: &mut tar::Builder<Vec<u8>>, p: &str, mode: u32, data: &[u8]| {
            built.files += 1;
            b.append(
                &header(tar::EntryType::Regular, p, mode, data.len() as u64),
                data,
            )
        };
        let tar_err = io(format!("layer {l}'s tar"));
        let res = (|| {
            if l == 0 {
                for d in ["bin", "etc", "tmp", "root"] {
                    dir(&mut b, d)?;
                }
                file(&mut b, "bin/busybox", 0o755, &busybox)?;
                for name in ["sh", "cat", "true", "ls"] {
                    let mut h = header(tar::EntryType::Symlink, &format!("bin/{name}"), 0o777, 0);
                    h.set_link_name("busybox")?;
                    h.set_cksum();
                    b.append(&h, &[][..])?;
                }
                file(
                    &mut b,
                    "etc/passwd",
                    0o644,
                    b"root:x:0:0:root:/root:/bin/sh\n",
                )?;
            }
            let d = format!("opt/l{l}");
            dir(&mut b, "opt")?;
            dir(&mut b, &d)?;
            let mut left = per_layer;
            let mut i = 0;
            while left > 0 {
                let n = left.min(1 << 20);
                let data = fill(&mut x, usize::try_from(n).unwrap_or(1 << 20));
                file(&mut b, &format!("{d}/f{i}"), 0o644, &data)?;
                left -= n;
                i += 1;
            }
            if l + 1 == layers {
                dir(&mut b, "bench")?;
                dir(&mut b, READ_DIR.trim_start_matches('/'))?;
                let k = read_files.max(1) as u64;
                for j in 0..k {
                    let n = if j + 1 == k {
                        read_bytes - read_bytes / k * (k - 1)
                    } else {
                        read_bytes / k
                    };
                    let data = fill(&mut x, usize::try_from(n).unwrap_or(0));
                    let p = format!("{}/f{j}", READ_DIR.trim_start_matches('/'));
                    file(&mut b, &p, 0o644, &data)?;
                }
            }
            b.into_inner()
        })();
        let tar = res.map_err(tar_err)?;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).map_err(io("gzip"))?;
        let z = gz.finish().map_err(io("gzip"))?;
        built.tar_bytes += tar.len() as u64;
        built.blob_bytes += z.len() as u64;
        diff_ids.push(sha(&tar));
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": put_blob(layout, &z)?, "size": z.len()}));
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "WorkingDir": "/root"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = serde_json::to_vec(&config).map_err(|e| io("config")(e.into()))?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put_blob(layout, &config)?, "size": config.len()},
        "layers": descs,
    });
    let manifest = serde_json::to_vec(&manifest).map_err(|e| io("manifest")(e.into()))?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": put_blob(layout, &manifest)?, "size": manifest.len(),
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    });
    let index = serde_json::to_vec(&index).map_err(|e| io("index")(e.into()))?;
    std::fs::write(layout.join("index.json"), index).map_err(io(layout.display()))?;
    Ok(built)
}

/// skopeo's policy file (accept anything: a loopback test registry).
pub fn policy(dir: &Path) -> Result<PathBuf, OciError> {
    let p = dir.join("policy.json");
    std::fs::write(&p, br#"{"default":[{"type":"insecureAcceptAnything"}]}"#)
        .map_err(io(p.display()))?;
    Ok(p)
}

/// The layer blobs (digest hex) of the one image in the OCI layout
/// `layout`, lowest first.
pub fn layout_layers(layout: &Path) -> Result<Vec<String>, OciError> {
    let read = |p: PathBuf| -> Result<serde_json::Value, OciError> {
        let b = std::fs::read(&p).map_err(io(p.display()))?;
        serde_json::from_slice(&b).map_err(|e| io(p.display())(e.into()))
    };
    let blob = |d: &str| {
        layout
            .join("blobs/sha256")
            .join(d.trim_start_matches("sha256:"))
    };
    let index = read(layout.join("index.json"))?;
    let m = index["manifests"][0]["digest"]
        .as_str()
        .ok_or_else(|| OciError::Tool("the peer's index.json names no manifest".into()))?;
    let manifest = read(blob(m))?;
    Ok(manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["digest"].as_str())
        .map(|d| d.trim_start_matches("sha256:").to_string())
        .collect())
}
