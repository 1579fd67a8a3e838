//! The HTTP side of the API's types: errors as responses (and their
//! OpenAPI responses), bodies and queries parsed with clear 400s.

use crate::auth::Principal;
use crate::{ApiError, Daemon};
use axum::body::{Body, Bytes};
use axum::extract::State as AxState;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use shoal_api::ErrorCode;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

/// The daemon, as handlers take it.
pub(crate) type D = AxState<Arc<Daemon>>;
/// Handler results.
pub(crate) type Res<T> = Result<T, ApiError>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code();
        let status =
            StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(self.body())).into_response();
        if code.retryable() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// The error responses of every route (all codes but admission's).
pub struct Errors;

/// The error responses of routes that may start a VMM (create, resume,
/// and requests that resume a paused sandbox): [`Errors`] and admission's
/// 429 and 503 (with `Retry-After`).
pub struct AdmissionErrors;

fn error_responses(admission: bool) -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
    // Codes sharing a status (429: host_full, sandbox_busy) share one entry.
    let mut by_status: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in ErrorCode::ALL
        .into_iter()
        .filter(|c| admission || !c.retryable())
    {
        by_status
            .entry(c.status().to_string())
            .or_default()
            .push(format!("`{c}`"));
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let r = ResponseBuilder::new()
                .description(format!("error {}", codes.join(" or ")))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Error")))
                        .build(),
                )
                .build();
            (status, RefOr::T(r))
        })
        .collect()
}

impl utoipa::IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        error_responses(false)
    }
}

impl utoipa::IntoResponses for AdmissionErrors {
    fn responses() -> BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        error_responses(true)
    }
}

/// Reads a JSON body of at most `limit` bytes: one whose length says more
/// is refused at once, one that turns out longer when no more than
/// `limit` bytes have been read (never held whole); 413 either way.
pub(crate) async fn json_body<T: DeserializeOwned>(b: Body, limit: usize) -> Res<T> {
    let too_large = || {
        ApiError::TooLarge(format!(
            "request body larger than {limit} bytes (the most a JSON body may be)"
        ))
    };
    let declared = hyper::body::Body::size_hint(&b).lower();
    if declared > u64::try_from(limit).unwrap_or(u64::MAX) {
        return Err(too_large());
    }
    let bytes = match axum::body::to_bytes(b, limit).await {
        Ok(bytes) => bytes,
        Err(e) => {
            // A length limit error, or the body's own (a client that
            // stopped sending, or left).
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(s) = src {
                if s.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                src = s.source();
            }
            return Err(ApiError::BadRequest(format!(
                "reading the request body: {e}"
            )));
        }
    };
    body(&bytes)
}

/// An upload body that ends with an error past `max` bytes (streamed,
/// never held whole), and the count of bytes the client sent; one whose
/// length says more than `max` is refused at once.
pub(crate) fn capped_body(b: Body, max: u64) -> Res<(Body, Arc<AtomicU64>)> {
    use http_body_util::BodyExt;
    if hyper::body::Body::size_hint(&b).lower() > max {
        return Err(upload_too_large(max));
    }
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    let counted = b.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            s2.fetch_add(
                u64::try_from(d.len()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        f
    });
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    Ok((
        Body::new(http_body_util::Limited::new(counted, limit)),
        seen,
    ))
}

/// 413 for an upload past `max` bytes.
pub(crate) fn upload_too_large(max: u64) -> ApiError {
    ApiError::TooLarge(format!(
        "upload larger than {max} bytes (the daemon's --max-upload-mib)"
    ))
}

/// The caller of a request ([`crate::api::router`] puts it in the
/// request; a request without one is refused).
pub(crate) struct Caller(pub Principal);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Caller, ApiError> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| {
                ApiError::Forbidden("the caller is unknown (no peer credentials)".into())
            })
    }
}

pub(crate) fn body<T: DeserializeOwned>(b: &Bytes) -> Res<T> {
    let b: &[u8] = if b.iter().all(|c| c.is_ascii_whitespace()) {
        b"{}"
    } else {
        b
    };
    serde_json::from_slice(b).map_err(ApiError::InvalidBody)
}

pub(crate) fn query(q: &Option<String>) -> Res<HashMap<String, String>> {
    let mut m = HashMap::new();
    for kv in q
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        m.insert(unescape(k)?, unescape(v)?);
    }
    Ok(m)
}

fn unescape(s: &str) -> Res<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let h = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| ApiError::BadRequest(format!("bad escape in query: {s}")))?;
                out.push(h);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ApiError::BadRequest("query is not UTF-8".into()))
}

pub(crate) fn flag(q: &HashMap<String, String>, k: &str) -> Res<bool> {
    match q.get(k).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(v) => Err(ApiError::BadRequest(format!(
            "{k}={v}: expected true or false"
        ))),
    }
}

/// `?mode=` in octal (at most 7777), or `default`.
pub(crate) fn octal(q: &HashMap<String, String>, default: u32) -> Res<u32> {
    match q.get("mode") {
        None => Ok(default),
        Some(m) => u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| ApiError::BadRequest(format!("mode={m}: expected octal like 644"))),
    }
}

pub(crate) fn path_arg(q: &HashMap<String, String>) -> Res<String> {
    q.get("path")
        .cloned()
        .ok_or_else(|| ApiError::BadRequest("missing ?path=/absolute/guest/path".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_runtime::backend::BackendError;
    use shoal_runtime::vmm_process::VmmProcessError;

    #[test]
    fn query_parsing() {
        let q = query(&Some("path=%2Ftmp%2Fa+b&recursive".into())).unwrap();
        assert_eq!(q["path"], "/tmp/a b");
        assert!(flag(&q, "recursive").unwrap());
        assert!(query(&Some("path=%zz".into())).is_err());
        assert!(query(&Some("path=%2".into())).is_err());
    }

    async fn answer(e: ApiError) -> (u16, Option<String>, serde_json::Value) {
        let r = e.into_response();
        let retry = r
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        let status = r.status().as_u16();
        let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, retry, serde_json::from_slice(&b).unwrap())
    }

    #[tokio::test]
    async fn errors_keep_their_causes_and_answer_as_before() {
        use crate::admission::Refusal;
        use agent_client::ClientError as C;
        use std::error::Error;
        let json = serde_json::from_slice::<serde_json::Value>(b"{x").unwrap_err();
        let remote = |errno| C::Remote {
            code: agent_proto::ErrorCode::Io,
            errno,
            message: "m".into(),
        };
        let cases: Vec<(ApiError, u16, &str, &str)> = vec![
            (
                ApiError::InvalidBody(json),
                400,
                "bad_request",
                "invalid JSON body: ",
            ),
            (
                ApiError::Refused(Refusal::Quota("full".into())),
                429,
                "host_full",
                "full",
            ),
            (
                ApiError::Refused(Refusal::HostPressure("low".into())),
                503,
                "host_memory_low",
                "low",
            ),
            (
                ApiError::Agent(remote(libc::ENOENT)),
                404,
                "not_found",
                "agent error",
            ),
            (
                ApiError::Agent(remote(libc::EEXIST)),
                409,
                "conflict",
                "agent error",
            ),
            (
                ApiError::Agent(remote(libc::ENOSPC)),
                507,
                "insufficient_storage",
                "agent error",
            ),
            (
                ApiError::Agent(remote(libc::EINVAL)),
                400,
                "bad_request",
                "agent error",
            ),
            (
                ApiError::Agent(C::Busy(8)),
                429,
                "sandbox_busy",
                "sandbox agent: too many requests in flight",
            ),
            (
                ApiError::Agent(C::Timeout),
                504,
                "deadline_exceeded",
                "sandbox agent: timed out",
            ),
            (
                ApiError::Agent(C::Disconnected),
                502,
                "sandbox_error",
                "sandbox agent: agent connection closed",
            ),
            (
                ApiError::Backend {
                    context: "pause",
                    source: BackendError::Control(vmm_api::ApiError::Refused {
                        request: "pause",
                        message: "no".into(),
                    }),
                },
                502,
                "sandbox_error",
                "pause: VMM: no",
            ),
            (
                ApiError::Backend {
                    context: "restore failed",
                    source: BackendError::Spawn(VmmProcessError::Spawn {
                        program: "/x/vmm".into(),
                        source: std::io::Error::from_raw_os_error(libc::ENOENT),
                    }),
                },
                500,
                "internal",
                "restore failed: cannot start /x/vmm: ",
            ),
            (
                ApiError::Db(crate::db::DbError::TooNew(9)),
                500,
                "internal",
                "state database schema 9",
            ),
        ];
        for (e, status, code, msg) in cases {
            assert!(e.source().is_some(), "{e:?} keeps its cause");
            let (s, retry, body) = answer(e).await;
            assert_eq!(
                (s, body["error"]["code"].as_str()),
                (status, Some(code)),
                "{body}"
            );
            let m = body["error"]["message"].as_str().unwrap();
            assert!(m.starts_with(msg), "{m:?} does not start with {msg:?}");
            assert_eq!(retry.is_some(), status == 429 || status == 503);
            assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
        }
    }
}
