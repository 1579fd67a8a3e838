//! Pulling from a registry (OCI distribution API): manifests (OCI and
//! Docker v2, indexes resolved to linux/amd64), the config, and the layers,
//! fetched in parallel and converted ([`crate::layer`]) into the store.
//!
//! Auth: anonymous; the Bearer token a `WWW-Authenticate: Bearer`
//! challenge points at (fetched once per pull with the pull's scope, with
//! Basic credentials when the credentials file has them, and reused for
//! every request after); or Basic auth from the credentials file
//! ([`crate::auth`]) for a `WWW-Authenticate: Basic` challenge. https
//! always, except for loopback registries or with `insecure`.

use crate::auth::Credentials;
use crate::layer::{convert_layer, sha256_digest, Compression, LayerError, LayerLimits};
use crate::reference::{BadReference, Reference};
use crate::{Store, StoreError, StoredImage};
use serde::Deserialize;
use shoal_api::images::{Image, ImageConfig, ImageLayer};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

pub(crate) const MANIFEST_CAP: u64 = 4 << 20;
pub(crate) const CONFIG_CAP: u64 = 8 << 20;
const PARALLEL: usize = 4;
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The reference does not parse.
    #[error(transparent)]
    Reference(#[from] BadReference),
    /// The registry does not have it (404, or a `NAME_UNKNOWN` /
    /// `MANIFEST_UNKNOWN` answer).
    #[error("{what}: not found in the registry ({detail})")]
    NotFound {
        /// What was asked for.
        what: String,
        /// The registry's words.
        detail: String,
    },
    /// Any other failed request.
    #[error("{what}: {detail}")]
    Http {
        /// What was asked for.
        what: String,
        /// Why.
        detail: String,
    },
    /// A manifest or config whose bytes do not match their digest.
    #[error("{what}: digest mismatch: wanted {expected}, the bytes are {actual}")]
    Digest {
        /// Which document.
        what: String,
        /// Named.
        expected: String,
        /// Of the bytes.
        actual: String,
    },
    /// A media type this store does not read.
    #[error("{what}: unsupported media type {media_type:?}")]
    MediaType {
        /// Which document.
        what: String,
        /// Its type.
        media_type: String,
    },
    /// A manifest or config that does not parse or is inconsistent.
    #[error("{what}: {why}")]
    Malformed {
        /// Which document.
        what: String,
        /// What is wrong.
        why: String,
    },
    /// A layer failed.
    #[error(transparent)]
    Layer(#[from] LayerError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Options of a pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Plain http even to a registry that is not on loopback.
    pub insecure: bool,
    /// Caps on each layer's blob and tar.
    pub limits: LayerLimits,
    /// The Docker `config.json` credentials are read from (default:
    /// [`crate::auth::default_auth_file`], when there).
    pub auth_file: Option<PathBuf>,
}

struct Client {
    agent: ureq::Agent,
    base: String,
    registry: String,
    repo: String,
    creds: Credentials,
    /// The `Authorization` header every request sends once a challenge
    /// was answered (`Bearer TOKEN` or `Basic ...`).
    auth: Mutex<Option<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    #[serde(default)]
    pub(crate) size: Option<u64>,
    #[serde(default)]
    pub(crate) platform: Option<Platform>,
}

#[derive(Deserialize)]
pub(crate) struct Platform {
    pub(crate) architecture: String,
    pub(crate) os: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Manifest {
    #[serde(default)]
    pub(crate) media_type: Option<String>,
    #[serde(default)]
    pub(crate) config: Option<Descriptor>,
    #[serde(default)]
    pub(crate) layers: Vec<Descriptor>,
    #[serde(default)]
    pub(crate) manifests: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct OciRunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
pub(crate) struct RootFs {
    #[serde(default)]
    pub(crate) diff_ids: Vec<String>,
}

#[derive(Deserialize)]
pub(crate) struct OciConfig {
    #[serde(default)]
    pub(crate) config: Option<OciRunConfig>,
    pub(crate) rootfs: RootFs,
}

impl OciConfig {
    /// One diff_id per layer of the manifest (`layers` of them), or why not.
    pub(crate) fn check_layers(&self, layers: usize, what: &str) -> Result<(), PullError> {
        let ids = self.rootfs.diff_ids.len();
        if ids != layers {
            return Err(malformed(
                what,
                format!("{ids} diff_ids for {layers} layers"),
            ));
        }
        Ok(())
    }
}

impl Client {
    fn request(&self, path: &str, accept: &str, what: &str) -> Result<ureq::Response, PullError> {
        let url = format!("{}/v2/{}/{path}", self.base, self.repo);
        let mut retried = false;
        loop {
            let mut req = self.agent.get(&url).set("Accept", accept);
            let sent = self.auth.lock().expect("auth lock").clone();
            if let Some(a) = sent.as_deref() {
                req = req.set("Authorization", a);
            }
            match req.call() {
                Ok(r) => return Ok(r),
                Err(ureq::Error::Status(401, r)) if !retried => {
                    retried = true;
                    let challenge = r.header("www-authenticate").unwrap_or("").to_string();
                    let mut auth = self.auth.lock().expect("auth lock");
                    // Another layer's thread answered the challenge since.
                    if *auth != sent && auth.is_some() {
                        continue;
                    }
                    *auth = Some(self.answer(&challenge, what)?);
                }
                Err(ureq::Error::Status(code, r)) => {
                    let body = r.into_string().unwrap_or_default();
                    let mut detail = format!(
                        "HTTP {code}: {}",
                        body.chars().take(300).collect::<String>()
                    );
                    if code == 401 {
                        detail = format!(
                            "unauthorized ({detail}); {}",
                            self.creds.hint(&self.registry)
                        );
                    }
                    return Err(
                        if code == 404
                            || body.contains("NAME_UNKNOWN")
                            || body.contains("MANIFEST_UNKNOWN")
                            || body.contains("BLOB_UNKNOWN")
                        {
                            PullError::NotFound {
                                what: what.to_string(),
                                detail,
                            }
                        } else {
                            PullError::Http {
                                what: what.to_string(),
                                detail,
                            }
                        },
                    );
                }
                Err(e) => {
                    return Err(PullError::Http {
                        what: what.to_string(),
                        detail: e.to_string(),
                    })
                }
            }
        }
    }

    /// The `Authorization` header that answers a 401's challenge: a
    /// Bearer token from its realm, or Basic credentials.
    fn answer(&self, challenge: &str, what: &str) -> Result<String, PullError> {
        let http = |detail: String| PullError::Http {
            what: what.to_string(),
            detail,
        };
        let (scheme, rest) = challenge.split_once(' ').unwrap_or((challenge, ""));
        let basic = self.creds.for_host(&self.registry);
        if scheme.eq_ignore_ascii_case("basic") {
            return match basic {
                Some(b) => Ok(format!("Basic {b}")),
                None => Err(http(format!(
                    "unauthorized: the registry asks for Basic auth, and {}",
                    self.creds.hint(&self.registry)
                ))),
            };
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(http(format!(
                "unauthorized, and no Basic or Bearer challenge ({challenge:?})"
            )));
        }
        Ok(format!("Bearer {}", self.fetch_token(rest, basic, what)?))
    }

    /// A Bearer token from the challenge's realm (with Basic credentials
    /// when there are some for this registry, else anonymous).
    fn fetch_token(
        &self,
        challenge: &str,
        basic: Option<&str>,
        what: &str,
    ) -> Result<String, PullError> {
        let http = |detail: String| PullError::Http {
            what: what.to_string(),
            detail,
        };
        let params = parse_challenge(challenge);
        let realm = params
            .get("realm")
            .ok_or_else(|| http("Bearer challenge without a realm".into()))?;
        let mut req = self.agent.get(realm);
        if let Some(s) = params.get("service") {
            req = req.query("service", s);
        }
        let scope = params
            .get("scope")
            .cloned()
            .unwrap_or_else(|| format!("repository:{}:pull", self.repo));
        req = req.query("scope", &scope);
        if let Some(b) = basic {
            req = req.set("Authorization", &format!("Basic {b}"));
        }
        let resp = req.call().map_err(|e| {
            let hint = match &e {
                ureq::Error::Status(401 | 403, _) => {
                    format!("; {}", self.creds.hint(&self.registry))
                }
                _ => String::new(),
            };
            http(format!("token from {realm}: {e}{hint}"))
        })?;
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body = resp
            .into_string()
            .map_err(|e| http(format!("token from {realm}: {e}")))?;
        let t: Token =
            serde_json::from_str(&body).map_err(|e| http(format!("token from {realm}: {e}")))?;
        t.token
            .or(t.access_token)
            .ok_or_else(|| http(format!("token from {realm}: no token in the answer")))
    }

    /// A document (manifest or config blob), capped, digest checked when
    /// `digest` names one.
    fn document(
        &self,
        path: &str,
        accept: &str,
        what: &str,
        digest: Option<&str>,
        cap: u64,
    ) -> Result<(Vec<u8>, String, String), PullError> {
        let r = self.request(path, accept, what)?;
        let content_type = r.content_type().to_string();
        let mut body = Vec::new();
        r.into_reader()
            .take(cap + 1)
            .read_to_end(&mut body)
            .map_err(|e| PullError::Http {
                what: what.to_string(),
                detail: e.to_string(),
            })?;
        if body.len() as u64 > cap {
            return Err(PullError::Malformed {
                what: what.to_string(),
                why: format!("larger than {cap} bytes"),
            });
        }
        let actual = sha256_digest(&body);
        if let Some(want) = digest {
            if want != actual {
                return Err(PullError::Digest {
                    what: what.to_string(),
                    expected: want.to_string(),
                    actual,
                });
            }
        }
        Ok((body, actual, content_type))
    }
}

fn parse_challenge(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s.trim();
    while let Some((k, v)) = rest.split_once('=') {
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let (val, tail) = if let Some(q) = v.strip_prefix('"') {
            match q.split_once('"') {
                Some((val, tail)) => (val.to_string(), tail),
                None => (q.to_string(), ""),
            }
        } else {
            match v.split_once(',') {
                Some((val, tail)) => (val.to_string(), tail),
                None => (v.to_string(), ""),
            }
        };
        out.insert(k, val);
        rest = tail.trim_start_matches(',').trim();
    }
    out
}

pub(crate) fn malformed(what: &str, why: impl std::fmt::Display) -> PullError {
    PullError::Malformed {
        what: what.to_string(),
        why: why.to_string(),
    }
}

/// Pulls `reference` into `store` and returns the stored image.
pub fn pull(store: &Store, reference: &str, opts: &PullOptions) -> Result<StoredImage, PullError> {
    let r = Reference::parse(reference)?;
    let scheme = if r.is_loopback() || opts.insecure {
        "http"
    } else {
        "https"
    };
    let client = Client {
        agent: ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(15))
            .timeout_read(Duration::from_secs(60))
            .build(),
        base: format!("{scheme}://{}", r.api_host()),
        registry: r.registry.clone(),
        repo: r.repository.clone(),
        creds: Credentials::load(opts.auth_file.as_deref()).map_err(|e| PullError::Malformed {
            what: e.what,
            why: e.why,
        })?,
        auth: Mutex::new(None),
    };
    let accept = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST].join(", ");
    let what = format!("manifest {}", r.canonical());
    let pinned = r
        .tag_or_digest
        .starts_with("sha256:")
        .then_some(r.tag_or_digest.as_str());
    let path = format!("manifests/{}", r.tag_or_digest);
    let (mut body, mut digest, mut ctype) =
        client.document(&path, &accept, &what, pinned, MANIFEST_CAP)?;
    let mut manifest: Manifest = serde_json::from_slice(&body).map_err(|e| malformed(&what, e))?;
    let media =
        |m: &Manifest, ctype: &str| m.media_type.clone().unwrap_or_else(|| ctype.to_string());
    let mt = media(&manifest, &ctype);
    if mt == OCI_INDEX
        || mt == DOCKER_LIST
        || (!manifest.manifests.is_empty() && manifest.config.is_none())
    {
        let pick = manifest
            .manifests
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            })
            .ok_or_else(|| malformed(&what, "the image index has no linux/amd64 manifest"))?;
        let d = pick.digest.clone();
        crate::digest_hex(&d)?;
        let what2 = format!("manifest {d} (linux/amd64 of {})", r.canonical());
        (body, digest, ctype) = client.document(
            &format!("manifests/{d}"),
            &accept,
            &what2,
            Some(&d),
            MANIFEST_CAP,
        )?;
        manifest = serde_json::from_slice(&body).map_err(|e| malformed(&what2, e))?;
    }
    let mt = media(&manifest, &ctype);
    if mt != OCI_MANIFEST && mt != DOCKER_MANIFEST {
        return Err(PullError::MediaType {
            what,
            media_type: mt,
        });
    }
    let config_desc = manifest
        .config
        .as_ref()
        .ok_or_else(|| malformed(&what, "no config"))?;
    crate::digest_hex(&config_desc.digest)?;
    let cwhat = format!("config {} of {}", config_desc.digest, r.canonical());
    let (cbody, _, _) = client.document(
        &format!("blobs/{}", config_desc.digest),
        "*/*",
        &cwhat,
        Some(&config_desc.digest),
        CONFIG_CAP,
    )?;
    let oci: OciConfig = serde_json::from_slice(&cbody).map_err(|e| malformed(&cwhat, e))?;
    oci.check_layers(manifest.layers.len(), &cwhat)?;
    let mut jobs = Vec::new();
    for (l, diff_id) in manifest.layers.iter().zip(&oci.rootfs.diff_ids) {
        crate::digest_hex(&l.digest)?;
        let comp = Compression::from_media_type(&l.media_type)?;
        // Refused before a byte is fetched when the manifest says so (and
        // while it streams when it lies).
        if l.size.is_some_and(|n| n > opts.limits.max_blob_bytes) {
            return Err(LayerError::TooLarge {
                blob: l.digest.clone(),
                what: "compressed blob",
                cap: opts.limits.max_blob_bytes,
            }
            .into());
        }
        jobs.push((l.digest.clone(), diff_id.clone(), comp));
    }
    let layers = fetch_layers(&client, store, &jobs, opts.limits)?;
    finish(
        store,
        oci,
        config_desc.digest.clone(),
        digest,
        layers,
        vec![r.canonical()],
    )
}

/// Records the image of config `oci` (digest `id`) and its converted
/// `layers` under `refs`.
pub(crate) fn finish(
    store: &Store,
    oci: OciConfig,
    id: String,
    manifest_digest: String,
    layers: Vec<ImageLayer>,
    refs: Vec<String>,
) -> Result<StoredImage, PullError> {
    let rc = oci.config.unwrap_or_default();
    let config = ImageConfig {
        env: rc.env.unwrap_or_default(),
        working_dir: rc.working_dir.filter(|w| !w.is_empty()),
        user: rc.user.filter(|u| !u.is_empty()),
        entrypoint: rc.entrypoint,
        cmd: rc.cmd,
        labels: rc.labels.unwrap_or_default(),
    };
    let image = Image {
        id,
        refs,
        manifest_digest,
        disk_bytes: layers.iter().map(|l| l.erofs_bytes).sum(),
        layers,
        config,
        in_use: 0,
        created_at: crate::now_rfc3339(),
    };
    Ok(store.put(&image)?)
}

/// Fetches and converts the layers not yet in the store, `PARALLEL` at a
/// time.
fn fetch_layers(
    client: &Client,
    store: &Store,
    jobs: &[(String, String, Compression)],
    limits: LayerLimits,
) -> Result<Vec<ImageLayer>, PullError> {
    let one =
        |(digest, diff_id, comp): &(String, String, Compression)| -> Result<ImageLayer, PullError> {
            let path = store.layer_path(diff_id)?;
            if !path.is_file() {
                let what = format!("layer {digest}");
                let r = client.request(&format!("blobs/{digest}"), "*/*", &what)?;
                convert_layer(store, r.into_reader(), *comp, digest, Some(diff_id), limits)?;
            }
            let erofs_bytes = std::fs::metadata(&path)
                .map_err(crate::io_err(&path))?
                .len();
            Ok(ImageLayer {
                digest: digest.clone(),
                diff_id: diff_id.clone(),
                erofs_bytes,
            })
        };
    let mut out = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(PARALLEL) {
        let results: Vec<Result<ImageLayer, PullError>> = std::thread::scope(|s| {
            let hs: Vec<_> = chunk.iter().map(|j| s.spawn(|| one(j))).collect();
            hs.into_iter()
                .map(|h| h.join().expect("a layer thread does not panic"))
                .collect()
        });
        for r in results {
            out.push(r?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bearer_challenges_parse() {
        let p = super::parse_challenge(
            r#"realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "repository:library/debian:pull");
    }
}
