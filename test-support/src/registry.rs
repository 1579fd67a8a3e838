//! A real OCI registry for tests: Debian's `docker-registry` (the CNCF
//! distribution registry) on a loopback port with its storage in a
//! directory, images written here as OCI layouts (layers from tar entries
//! the test lists) and pushed with `skopeo copy`. Needs `apt-get install
//! docker-registry skopeo`; fails (never skips) without them.

use sha2::{Digest, Sha256};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY: &str = "/usr/bin/docker-registry";

/// A running registry; killed on drop.
pub struct Registry {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts one with its configuration and storage under `dir`; panics
    /// saying why it could not.
    pub fn start(dir: &Path) -> Registry {
        Registry::try_start(dir).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts one with its configuration and storage under `dir` (made if
    /// missing), or says why it could not (the benchmarks' way).
    pub fn try_start(dir: &Path) -> Result<Registry, String> {
        if !Path::new(REGISTRY).is_file() {
            return Err(format!(
                "{REGISTRY} is missing: this needs Debian's registry (apt-get install -y \
                 docker-registry skopeo)"
            ));
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free loopback port: {e}"))?
            .port();
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cfg = dir.join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("storage").display()
            ),
        )
        .map_err(|e| format!("{}: {e}", cfg.display()))?;
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {REGISTRY}: {e}"))?;
        let reg = Registry { child, port };
        let deadline = Instant::now() + Duration::from_secs(15);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("docker-registry did not listen on {port} in 15 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(reg)
    }

    /// `127.0.0.1:PORT/NAME`.
    pub fn reference(&self, name: &str) -> String {
        format!("127.0.0.1:{}/{name}", self.port)
    }
}

/// One tar entry of a test layer.
pub enum Entry<'a> {
    /// A directory (0755).
    Dir(&'a str),
    /// A directory of another mode.
    DirMode(&'a str, u32),
    /// A file with its mode and contents.
    File(&'a str, u32, &'a [u8]),
    /// A symbolic link to a target.
    Symlink(&'a str, &'a str),
}

/// A layer tar of `entries` (root-owned, a fixed mtime).
pub fn tar_of(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_ustar();
        let (name, data): (&str, &[u8]) = match e {
            Entry::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (n, b"")
            }
            Entry::DirMode(n, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                (n, b"")
            }
            Entry::File(n, mode, data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                (n, data)
            }
            Entry::Symlink(n, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_link_name(target).unwrap();
                (n, b"")
            }
        };
        h.set_path(name).unwrap();
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// `sha256:` and the hex digest of `bytes`.
fn sha256_digest(bytes: &[u8]) -> String {
    let h = Sha256::digest(bytes);
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn put_blob(layout: &Path, bytes: &[u8]) -> String {
    let d = sha256_digest(bytes);
    let p = layout
        .join("blobs/sha256")
        .join(d.strip_prefix("sha256:").unwrap());
    std::fs::write(p, bytes).unwrap();
    d
}

/// Writes an OCI layout at `layout` holding one image at tag `tag`: the
/// layer tars `layers` (lowest first; gzip-compressed where the flag is
/// set) and `config` (the image config's `config` object: Env, User,
/// ...). Returns each layer's (blob digest, diff_id).
pub fn write_layout(
    layout: &Path,
    tag: &str,
    layers: &[(Vec<u8>, bool)],
    config: serde_json::Value,
) -> Vec<(String, String)> {
    std::fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let blobs: Vec<(String, String, usize, &str)> = layers
        .iter()
        .map(|(tar, gzip)| {
            if *gzip {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(tar).unwrap();
                let z = gz.finish().unwrap();
                (put_blob(layout, &z), sha256_digest(tar), z.len(), "+gzip")
            } else {
                (put_blob(layout, tar), sha256_digest(tar), tar.len(), "")
            }
        })
        .collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers",
                   "diff_ids": blobs.iter().map(|b| b.1.clone()).collect::<Vec<_>>()},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put_blob(layout, &config), "size": config.len()},
        "layers": blobs.iter().map(|(d, _, n, c)| serde_json::json!({
            "mediaType": format!("application/vnd.oci.image.layer.v1.tar{c}"),
            "digest": d, "size": n})).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": put_blob(layout, &manifest), "size": manifest.len(),
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    blobs.into_iter().map(|(d, i, _, _)| (d, i)).collect()
}

/// Pushes tag `tag` of the layout at `layout` to `dest`
/// (`127.0.0.1:PORT/REPO:TAG`) with `skopeo copy` (its policy file under
/// `dir`); panics saying why it could not.
pub fn push(dir: &Path, layout: &Path, tag: &str, dest: &str) {
    try_push(dir, layout, tag, dest).unwrap_or_else(|e| panic!("{e}"))
}

/// [`push`], or why it could not.
pub fn try_push(dir: &Path, layout: &Path, tag: &str, dest: &str) -> Result<(), String> {
    skopeo_copy(dir, layout, tag, dest, &[])
}

/// `skopeo copy` (with `extra` options) of tag `tag` of `layout` to `dest`.
fn skopeo_copy(
    dir: &Path,
    layout: &Path,
    tag: &str,
    dest: &str,
    extra: &[&str],
) -> Result<(), String> {
    let policy = dir.join("policy.json");
    std::fs::write(
        &policy,
        br#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    )
    .map_err(|e| format!("{}: {e}", policy.display()))?;
    let out = Command::new("skopeo")
        .arg("--policy")
        .arg(&policy)
        .arg("copy")
        .args(extra)
        .args(["--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}"))
        .output()
        .map_err(|e| format!("skopeo (apt-get install -y skopeo): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "skopeo copy {}: {}",
            extra.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// One image of a test `docker save` archive.
pub struct Saved<'a> {
    /// Its `RepoTags` (`repo:tag`).
    pub repo_tags: &'a [&'a str],
    /// Its layer tars, lowest first (stored uncompressed, as Docker does).
    pub layers: &'a [Vec<u8>],
    /// The image config's `config` object.
    pub config: serde_json::Value,
}

fn append(b: &mut tar::Builder<std::fs::File>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append_data(&mut h, name, data).unwrap();
}

/// Writes a legacy `docker save` archive (Docker before 25) at `out`:
/// `manifest.json`, `repositories`, `HEX.json` configs and one
/// `ID/layer.tar` directory per layer; a layer an earlier image of the
/// archive has is a symbolic link to its `layer.tar`, as Docker writes it.
/// Returns each image's (config digest, diff_ids).
pub fn write_docker_save(out: &Path, images: &[Saved<'_>]) -> Vec<(String, Vec<String>)> {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    let mut seen: std::collections::BTreeMap<String, String> = Default::default();
    let mut manifest = Vec::new();
    let mut repositories = serde_json::Map::new();
    let mut ret = Vec::new();
    for (n, img) in images.iter().enumerate() {
        let diff_ids: Vec<String> = img.layers.iter().map(|l| sha256_digest(l)).collect();
        let mut names = Vec::new();
        let mut parent = String::new();
        for (tar, diff_id) in img.layers.iter().zip(&diff_ids) {
            // A v1 layer id: a digest of the chain so far (and of the
            // image, so that a shared layer shows up as a link).
            let id = sha256_digest(format!("{n} {parent} {diff_id}").as_bytes())[7..].to_string();
            let name = format!("{id}/layer.tar");
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            h.set_cksum();
            b.append_data(&mut h, format!("{id}/"), &[][..]).unwrap();
            append(&mut b, &format!("{id}/VERSION"), b"1.0");
            append(
                &mut b,
                &format!("{id}/json"),
                format!(r#"{{"id":"{id}"}}"#).as_bytes(),
            );
            match seen.get(diff_id) {
                Some(first) => {
                    let mut h = tar::Header::new_gnu();
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, &name, format!("../{first}")).unwrap();
                }
                None => {
                    append(&mut b, &name, tar);
                    seen.insert(diff_id.clone(), name.clone());
                }
            }
            names.push(name);
            parent = id;
        }
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "amd64", "os": "linux", "config": img.config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap();
        let cd = sha256_digest(&config);
        append(&mut b, &format!("{}.json", &cd[7..]), &config);
        for t in img.repo_tags {
            let (repo, tag) = t.rsplit_once(':').unwrap();
            repositories
                .entry(repo.to_string())
                .or_insert_with(|| serde_json::json!({}))
                .as_object_mut()
                .unwrap()
                .insert(tag.to_string(), parent.clone().into());
        }
        manifest.push(serde_json::json!({
            "Config": format!("{}.json", &cd[7..]), "RepoTags": img.repo_tags, "Layers": names,
        }));
        ret.push((cd, diff_ids));
    }
    append(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
    );
    append(
        &mut b,
        "repositories",
        &serde_json::to_vec(&repositories).unwrap(),
    );
    b.finish().unwrap();
    ret
}

/// Writes the `docker save` archive Docker 25+ writes at `out`: an OCI
/// layout (uncompressed layers) in a tar, its index naming the image
/// `name` (`io.containerd.image.name`) and tag, plus `manifest.json`.
/// `work` is a scratch directory. Returns the layers' (digest, diff_id).
pub fn write_docker_save_oci(
    out: &Path,
    work: &Path,
    name: &str,
    layers: &[Vec<u8>],
    config: serde_json::Value,
) -> Vec<(String, String)> {
    let tag = name.rsplit_once(':').unwrap().1;
    let plain: Vec<(Vec<u8>, bool)> = layers.iter().map(|l| (l.clone(), false)).collect();
    let got = write_layout(work, tag, &plain, config);
    let index_path = work.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["manifests"][0]["annotations"]["io.containerd.image.name"] = name.into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let m: serde_json::Value = serde_json::from_slice(
        &std::fs::read(work.join("blobs/sha256").join(&manifest_digest[7..])).unwrap(),
    )
    .unwrap();
    let blob = |d: &serde_json::Value| format!("blobs/sha256/{}", &d.as_str().unwrap()[7..]);
    let docker_manifest = serde_json::json!([{
        "Config": blob(&m["config"]["digest"]), "RepoTags": [name],
        "Layers": m["layers"].as_array().unwrap().iter().map(|l| blob(&l["digest"])).collect::<Vec<_>>(),
    }]);
    std::fs::write(
        work.join("manifest.json"),
        serde_json::to_vec(&docker_manifest).unwrap(),
    )
    .unwrap();
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.append_dir_all(".", work).unwrap();
    b.finish().unwrap();
    got
}

/// One platform's image of an index: its architecture, layer tars
/// (gzip-compressed where the flag is set) and config object.
pub type PlatformImage<'a> = (&'a str, Vec<(Vec<u8>, bool)>, serde_json::Value);

/// Writes an OCI layout at `layout` whose tag `tag` is an image index of
/// one image per `(architecture, layers, config)` (linux, each config's
/// `architecture` set), for `skopeo copy --all`. Returns each platform's
/// manifest digest.
pub fn write_index_layout(layout: &Path, tag: &str, images: &[PlatformImage<'_>]) -> Vec<String> {
    let mut entries = Vec::new();
    for (arch, layers, config) in images {
        write_layout(layout, tag, layers, config.clone());
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let mut m = index["manifests"][0].clone();
        // The config says which architecture it is for.
        let md = m["digest"].as_str().unwrap().to_string();
        let mut manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(layout.join("blobs/sha256").join(&md[7..])).unwrap(),
        )
        .unwrap();
        let cd = manifest["config"]["digest"].as_str().unwrap().to_string();
        let mut cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(layout.join("blobs/sha256").join(&cd[7..])).unwrap(),
        )
        .unwrap();
        cfg["architecture"] = (*arch).into();
        let cfg = serde_json::to_vec(&cfg).unwrap();
        manifest["config"]["digest"] = put_blob(layout, &cfg).into();
        manifest["config"]["size"] = cfg.len().into();
        let manifest = serde_json::to_vec(&manifest).unwrap();
        m["digest"] = put_blob(layout, &manifest).into();
        m["size"] = manifest.len().into();
        m.as_object_mut().unwrap().remove("annotations");
        m["platform"] = serde_json::json!({"architecture": arch, "os": "linux"});
        entries.push(m);
    }
    let digests = entries
        .iter()
        .map(|m| m["digest"].as_str().unwrap().to_string())
        .collect();
    let inner = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))
    .unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
                       "digest": put_blob(layout, &inner), "size": inner.len(),
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    digests
}

/// Pushes every platform of tag `tag` of the layout at `layout` (an image
/// index) to `dest` with `skopeo copy --all`.
pub fn push_all(dir: &Path, layout: &Path, tag: &str, dest: &str) {
    skopeo_copy(dir, layout, tag, dest, &["--all"]).unwrap_or_else(|e| panic!("{e}"))
}
