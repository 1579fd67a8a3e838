//! The JSON shapes of E2B's control plane (field names as the SDK's
//! generated models read them: `e2b/api/client/models/*.py`), times in
//! RFC 3339, and the list query.
//!
//! Request bodies accept unknown fields (newer SDKs send more).

use super::{error, ENVD_VERSION};
use crate::db::{SandboxRow, State};
use crate::Daemon;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_api::time::{civil_from_days, days_from_civil};
use std::collections::BTreeMap;

/// A handler's error: a ready E2B error response.
#[derive(Debug)]
pub struct E(pub Box<Response>);

impl E {
    /// The error `r`.
    pub fn of(r: Response) -> E {
        E(Box::new(r))
    }
}

impl IntoResponse for E {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// A handler's result.
pub type R = Result<Response, E>;

/// A create without `timeout` lives this long (E2B's default).
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// What `clientID` (deprecated, required) says.
pub const CLIENT_ID: &str = "shoald";
/// `endAt` of a sandbox without a TTL.
const NEVER: &str = "9999-12-31T23:59:59Z";

/// `NewSandbox` (v1) and `NewSandboxV2`: what shoald reads of them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template or image name.
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    /// Seconds to live.
    pub timeout: Option<u64>,
    /// Pause instead of kill at the timeout.
    pub auto_pause: Option<bool>,
    /// `{"enabled": bool}`: whether a data-plane request resumes it once
    /// paused (default: yes).
    pub auto_resume: Option<AutoResume>,
    /// Egress rules ([`super::network`]).
    pub network: Option<Value>,
    /// Sent as `true` by SDKs before 2.51 unless told otherwise: the
    /// public internet only under `shoald --e2b-internet`
    /// ([`super::network::create_spec`]).
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Labels.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Default environment.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// MCP gateway config.
    pub mcp: Option<Value>,
    /// IAM config.
    pub iam: Option<Value>,
    /// Volumes.
    pub volume_mounts: Option<Vec<Value>>,
}

/// In the directory of a sandbox created with `autoResume.enabled: false`:
/// once paused, the data plane answers for it as for a sandbox not found
/// (E2B's proxy does the same), and only a connect resumes it.
pub(crate) const NO_AUTO_RESUME_FILE: &str = "e2b-no-auto-resume";

/// Whether traffic may resume paused `r`.
pub(crate) fn auto_resumes(r: &SandboxRow) -> bool {
    !r.dir.join(NO_AUTO_RESUME_FILE).exists()
}

/// `autoResume` of a create.
#[derive(Debug, Default, Deserialize)]
pub struct AutoResume {
    /// Resumed by traffic.
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Default, Deserialize)]
pub struct TimeoutBody {
    /// Seconds from now.
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Default, Deserialize)]
pub struct RefreshBody {
    /// Seconds from now.
    pub duration: Option<u64>,
}

/// Reads a JSON body of at most `limit` bytes (an empty body is `{}`);
/// 400 in E2B's shape otherwise.
pub async fn json<T: DeserializeOwned>(b: Body, limit: usize) -> Result<T, E> {
    let bytes = axum::body::to_bytes(b, limit).await.map_err(|e| {
        let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = src {
            if s.is::<http_body_util::LengthLimitError>() {
                return E::of(error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body larger than {limit} bytes"),
                ));
            }
            src = s.source();
        }
        bad(format!("reading the request body: {e}"))
    })?;
    let b: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    serde_json::from_slice(b).map_err(|e| bad(format!("invalid JSON body: {e}")))
}

/// The caller the authentication layer found.
pub struct Caller(pub crate::auth::Principal);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = E;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Caller, E> {
        parts
            .extensions
            .get::<crate::auth::Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| E::of(error(StatusCode::FORBIDDEN, "the caller is unknown")))
    }
}

/// The E2B state of a shoald one (`None`: not an E2B sandbox: failed or
/// pooled).
pub fn e2b_state(s: State) -> Option<&'static str> {
    match s {
        State::Starting | State::Running => Some("running"),
        State::Pausing | State::Paused => Some("paused"),
        State::Failed | State::Pooled => None,
    }
}

/// When the sandbox's TTL ends (seconds since the epoch; infinite when it
/// has none).
pub fn end_at(r: &SandboxRow) -> f64 {
    if r.ttl_s == 0 {
        f64::INFINITY
    } else {
        r.created_at + r.ttl_s as f64
    }
}

/// The `Sandbox` of a create, connect or fork: ids, version and the
/// access tokens (see [`super::E2bState`]). No `domain`: the SDK then
/// reaches the data plane at `E2B_SANDBOX_URL`, shoald's own listener.
pub fn sandbox(d: &Daemon, r: &SandboxRow) -> Value {
    json!({
        "templateID": r.template,
        "sandboxID": r.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": d.e2b.envd_token(&r.id),
        "trafficAccessToken": d.e2b.traffic_token(&r.id),
    })
}

/// A `ListedSandbox`: `network` (in E2B's terms) and
/// `allowInternetAccess` (all of IPv4 allowed) as its policy has them.
pub fn listed(_d: &Daemon, r: &SandboxRow) -> Value {
    let end = end_at(r);
    let policy = r.net.as_ref().map(|n| &n.policy);
    let mut v = json!({
        "templateID": r.template,
        "sandboxID": r.id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(r.created_at),
        "endAt": if end.is_finite() { rfc3339(end) } else { NEVER.into() },
        "cpuCount": r.vcpus,
        "memoryMB": r.memory_mib,
        "diskSizeMB": 0,
        "state": e2b_state(r.state).unwrap_or("running"),
        "envdVersion": ENVD_VERSION,
        "metadata": r.metadata,
        "allowInternetAccess": super::network::internet(policy),
        "lifecycle": {
            "autoResume": auto_resumes(r),
            "onTimeout": if r.pause_at_ttl { "pause" } else { "kill" },
        },
    });
    if let Some(p) = policy {
        v["network"] = super::network::to_e2b(p);
    }
    v
}

/// A `SandboxDetail`: [`listed`] and the access token.
pub fn detail(d: &Daemon, r: &SandboxRow) -> Value {
    let mut v = listed(d, r);
    v["envdAccessToken"] = d.e2b.envd_token(&r.id).into();
    v
}

/// Whether the sandbox's template `have` answers the list filter `want`:
/// its name, or the image of a daemon-made image template
/// (`base-1c-128m` for `base`).
pub fn template_matches(have: &str, want: &str) -> bool {
    have == want
        || have
            .strip_prefix(want)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|rest| rest.as_bytes().first().is_some_and(u8::is_ascii_digit))
}

/// `GET /sandboxes` and `GET /v2/sandboxes` queries.
#[derive(Debug, Default)]
pub struct ListQuery {
    /// Labels that must all match.
    pub metadata: Vec<(String, String)>,
    /// E2B states (empty: any).
    pub states: Vec<&'static str>,
    /// Template filter.
    pub template: Option<String>,
    /// Only those created at or after this (seconds since the epoch).
    pub started_after: Option<f64>,
    /// Newest first.
    pub desc: bool,
    /// Page size (v2).
    pub limit: usize,
    /// Where the page starts (v2).
    pub next_token: Option<String>,
}

fn bad(m: String) -> E {
    E::of(error(StatusCode::BAD_REQUEST, m))
}

impl ListQuery {
    /// Parses the raw query (`metadata` is itself a URL-encoded
    /// `k=v&k2=v2` whose keys and values the SDK escaped once more).
    pub fn parse(q: Option<&str>) -> Result<ListQuery, E> {
        let mut out = ListQuery {
            limit: 100,
            ..Default::default()
        };
        for (k, v) in form(q.unwrap_or(""))? {
            match k.as_str() {
                "metadata" | "query" => {
                    for (mk, mv) in form(&v)? {
                        out.metadata.push((unescape(&mk)?, unescape(&mv)?));
                    }
                }
                "state" => {
                    for s in v.split(',').filter(|s| !s.is_empty()) {
                        out.states.push(match s {
                            "running" => "running",
                            "paused" => "paused",
                            o => return Err(bad(format!("state={o}: expected running or paused"))),
                        });
                    }
                }
                "template" => out.template = Some(v),
                "startedAfter" => {
                    out.started_after = Some(
                        parse_rfc3339(&v)
                            .ok_or_else(|| bad(format!("startedAfter={v}: expected RFC 3339")))?,
                    )
                }
                "order" => {
                    out.desc = match v.as_str() {
                        "asc" => false,
                        "desc" => true,
                        o => return Err(bad(format!("order={o}: expected asc or desc"))),
                    }
                }
                "limit" => {
                    out.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=1000).contains(n))
                        .ok_or_else(|| bad(format!("limit={v}: expected 1..=1000")))?
                }
                "nextToken" => out.next_token = Some(v).filter(|t| !t.is_empty()),
                // Unknown parameters are ignored, as unknown fields are.
                _ => {}
            }
        }
        Ok(out)
    }
}

/// One page of `rows` (already in list order) after `token`, and the
/// token of the next page when there are more. A token is the id of the
/// last sandbox of its page; when that sandbox is gone, the page starts
/// after where it stood (by creation time).
pub fn page<'a>(
    rows: &'a [SandboxRow],
    token: Option<&str>,
    limit: usize,
    desc: bool,
) -> Result<(&'a [SandboxRow], Option<String>), E> {
    let start = match token {
        None => 0,
        Some(t) => {
            let (ts, id) = t
                .split_once('_')
                .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b)))
                .ok_or_else(|| bad(format!("nextToken={t}: not a token this daemon made")))?;
            let after = |r: &SandboxRow| {
                let o = r.created_at.total_cmp(&ts).then(r.id.as_str().cmp(id));
                if desc {
                    o.is_lt()
                } else {
                    o.is_gt()
                }
            };
            rows.iter().position(after).unwrap_or(rows.len())
        }
    };
    let end = (start + limit).min(rows.len());
    let page = &rows[start..end];
    let next = (end < rows.len())
        .then(|| page.last())
        .flatten()
        .map(|r| format!("{}_{}", r.created_at, r.id));
    Ok((page, next))
}

/// `k=v&...` pairs, each percent-decoded (`+` is a space).
pub fn form(q: &str) -> Result<Vec<(String, String)>, E> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Ok((unescape_form(k)?, unescape_form(v)?))
        })
        .collect()
}

fn unescape_form(s: &str) -> Result<String, E> {
    unescape(&s.replace('+', " "))
}

/// Percent-decoding.
pub fn unescape(s: &str) -> Result<String, E> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| bad(format!("bad escape in query: {s}")))?;
            out.push(h);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("query is not UTF-8".into()))
}

/// Seconds since the epoch as RFC 3339 UTC with milliseconds (times
/// before the epoch read as the epoch).
pub fn rfc3339(t: f64) -> String {
    // Whole milliseconds, converted exactly (a whole f64 "seconds" count).
    let ms = std::time::Duration::try_from_secs_f64((t * 1000.0).round().max(0.0))
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
        .unwrap_or(0);
    let (secs, ms) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` into seconds since the
/// epoch.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut i = 19;
    let mut frac = 0.0;
    if b.get(i) == Some(&b'.') {
        let j = i + 1 + b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        frac = format!("0.{}", s.get(i + 1..j)?).parse().ok()?;
        i = j;
    }
    let off = match s.get(i..)? {
        "Z" | "z" => 0,
        z if z.len() == 6 && (z.starts_with('+') || z.starts_with('-')) && &z[3..4] == ":" => {
            let v = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if z.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - off;
    Some(secs as f64 + frac)
}
