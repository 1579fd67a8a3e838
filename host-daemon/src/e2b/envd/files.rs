//! envd's `GET /files` (a file's bytes) and `POST /files` (one file as
//! `application/octet-stream`, optionally gzip-encoded, or any number as
//! `multipart/form-data`, each part's filename its destination), streamed
//! through the guest agent.

use super::connect::{Code, RpcError};
use super::multipart::{Multipart, Part};
use super::{fs, users, Guest};
use agent_client::{AsyncClient, AsyncUpload, UploadOptions};
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::io::Write;
use std::time::Duration;

/// The longest an upload may take.
const UPLOAD_DEADLINE: Duration = Duration::from_secs(3600);

/// An error as envd's HTTP API answers it: `{"code": status, "message"}`.
fn http_error(e: &RpcError) -> Response {
    let status = match e.code {
        Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"code": status.as_u16(), "message": e.message}).to_string(),
    )
        .into_response()
}

/// The query's `path` and `username`.
fn query(req: &Request) -> Result<(Option<String>, Option<String>), RpcError> {
    type Q = axum::extract::Query<std::collections::HashMap<String, String>>;
    let mut q = Q::try_from_uri(req.uri())
        .map_err(|e| RpcError::invalid(format!("query: {e}")))?
        .0;
    Ok((q.remove("path"), q.remove("username")))
}

/// Who the request is for: `?username=`, else the Basic auth user.
fn asked_user(h: &HeaderMap, q: Option<String>) -> Result<Option<String>, RpcError> {
    match q.filter(|u| !u.is_empty()) {
        Some(u) => Ok(Some(u)),
        None => users::basic_user(h),
    }
}

/// `GET /files?path=P[&username=U]`.
pub(super) async fn download(g: &Guest, req: Request) -> Response {
    match try_download(g, req).await {
        Ok(r) => r,
        Err(e) => http_error(&e),
    }
}

async fn try_download(g: &Guest, req: Request) -> Result<Response, RpcError> {
    let (path, asked) = query(&req)?;
    let asked = asked_user(req.headers(), asked)?;
    let (c, _busy) = g.client().await?;
    let user = g.user(&c, asked.as_deref()).await?;
    let path = path.ok_or_else(|| RpcError::invalid("give ?path="))?;
    let path = users::absolute(&path, &user)?;
    let (size, body) = crate::exec::download(&g.d, &g.id, path)
        .await
        .map_err(|e| g.unavailable(e))?;
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        body,
    )
        .into_response())
}

/// `POST /files?path=P[&username=U]`.
pub(super) async fn upload(g: &Guest, req: Request) -> Response {
    let work = try_upload(g, req);
    match tokio::time::timeout(UPLOAD_DEADLINE, work).await {
        Ok(Ok(v)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v.to_string(),
        )
            .into_response(),
        Ok(Err(e)) => http_error(&e),
        Err(_) => http_error(&RpcError::new(
            Code::DeadlineExceeded,
            "the upload did not finish within an hour",
        )),
    }
}

/// A file being written.
struct Open {
    path: String,
    up: AsyncUpload,
}

async fn open(c: &AsyncClient, path: String) -> Result<Open, RpcError> {
    let opts = UploadOptions {
        mode: 0o644,
        append: false,
        create_parents: true,
    };
    let up = c.open_upload(&path, opts).await.map_err(agent)?;
    Ok(Open { path, up })
}

fn agent(e: agent_client::ClientError) -> RpcError {
    crate::ApiError::from(e).into()
}

async fn try_upload(g: &Guest, req: Request) -> Result<Value, RpcError> {
    let (path, asked) = query(&req)?;
    let asked = asked_user(req.headers(), asked)?;
    let (c, _busy) = g.client().await?;
    let user = g.user(&c, asked.as_deref()).await?;
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = match req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(e) => {
            return Err(RpcError::invalid(format!(
                "unsupported content-encoding {e}"
            )))
        }
    };
    let mut body = req.into_body().into_data_stream();
    let mut written: Vec<String> = Vec::new();
    if let Some(boundary) = super::multipart::boundary(&ctype) {
        let mut mp = Multipart::new(&boundary);
        let mut cur: Option<Open> = None;
        let mut done = false;
        while !done {
            let chunk = match body.next().await {
                Some(Ok(c)) => c,
                Some(Err(e)) => return Err(RpcError::invalid(format!("request body: {e}"))),
                None => {
                    return Err(RpcError::invalid("the multipart body ended early"));
                }
            };
            let parts = mp
                .push(&chunk)
                .map_err(|e| RpcError::invalid(e.to_string()))?;
            for p in parts {
                match p {
                    Part::Start { name, filename } => {
                        if name != "file" {
                            return Err(RpcError::invalid(format!(
                                "unexpected multipart field {name:?} (expected 'file')"
                            )));
                        }
                        let dest = match (filename, &path) {
                            (Some(f), _) if !f.is_empty() => f,
                            (_, Some(p)) => p.clone(),
                            _ => return Err(RpcError::invalid("a part without a filename")),
                        };
                        cur = Some(open(&c, users::absolute(&dest, &user)?).await?);
                    }
                    Part::Data(d) => {
                        if let Some(o) = cur.as_mut() {
                            o.up.write(&d).await.map_err(agent)?;
                        }
                    }
                    Part::End => {
                        if let Some(o) = cur.take() {
                            o.up.finish().await.map_err(agent)?;
                            written.push(o.path);
                        }
                    }
                    Part::Done => done = true,
                }
            }
        }
    } else {
        if !ctype.is_empty() && !ctype.starts_with("application/octet-stream") {
            return Err(RpcError::invalid(format!(
                "unsupported content-type {ctype:?} (multipart/form-data or application/octet-stream)"
            )));
        }
        let p = path.ok_or_else(|| RpcError::invalid("give ?path= for an octet-stream upload"))?;
        let mut o = open(&c, users::absolute(&p, &user)?).await?;
        let mut gz = gzip.then(|| flate2::write::GzDecoder::new(Vec::new()));
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| RpcError::invalid(format!("request body: {e}")))?;
            match gz.as_mut() {
                None => o.up.write(&chunk).await.map_err(agent)?,
                Some(z) => {
                    z.write_all(&chunk)
                        .map_err(|e| RpcError::invalid(format!("gzip: {e}")))?;
                    let out = std::mem::take(z.get_mut());
                    o.up.write(&out).await.map_err(agent)?;
                }
            }
        }
        if let Some(z) = gz {
            let out = z
                .finish()
                .map_err(|e| RpcError::invalid(format!("gzip: {e}")))?;
            o.up.write(&out).await.map_err(agent)?;
        }
        o.up.finish().await.map_err(agent)?;
        written.push(o.path);
    }
    let mut out = Vec::new();
    for p in written {
        if user.uid != 0 {
            fs::chown(g, &p, &user).await?;
        }
        let name = p.rsplit('/').next().unwrap_or("").to_string();
        out.push(json!({"path": p, "name": name, "type": "file"}));
    }
    Ok(Value::Array(out))
}
