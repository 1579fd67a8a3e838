//! SandboxFusion compatibility: `POST /run_code` and `GET /v1/ping` with
//! SandboxFusion's JSON ([`wire`]), served by FnCall ([`crate::fncall`]):
//! verl's SandboxFusion reward and tool code and the stock
//! `sandbox-fusion` client work against shoald unmodified.
//!
//! These routes are a foreign API and so are not in shoald's OpenAPI
//! document (their fields are SandboxFusion's, documented in [`wire`]).
//!
//! **HTTP statuses.** The stock client retries five times, with
//! exponential back-off, on any non-200 answer *and* on `SandboxError`;
//! verl's own client retries only on 504. So:
//! - a request shoald can never run (not JSON, no `code`, an unknown
//!   language, bad base64, a timeout ≤ 0 or over 300 s, a language this
//!   daemon does not serve) is a **400** with shoald's error body, whose
//!   message says what is wrong (SandboxFusion itself answers such bodies
//!   with FastAPI's 422; the stock client raises either way, with the
//!   body's text in the exception); a body over [`MAX_BODY`] is a 413;
//! - a host without room (429/503, `Retry-After`) keeps its status, so
//!   that every client backs off;
//! - anything else that goes wrong on shoald's side (a guest that crashed
//!   or stopped answering, no clone could be made) is a **200** with
//!   `status: "SandboxError"` and the reason in `message`, exactly as
//!   SandboxFusion reports its own failures (the stock client retries it,
//!   which is right for these);
//! - a program that fails, times out or runs out of memory is a 200
//!   `Failed` (never retried).
//!
//! **Authentication.** On the Unix socket, none (the socket is the
//! daemon user's). On TCP shoald wants its bearer token, and SandboxFusion
//! clients send no headers of their own, but both `requests` and
//! `aiohttp` send the user-info of the endpoint URL as HTTP Basic auth:
//! on these two routes a Basic password that is a valid token is taken as
//! that token, so `SANDBOX_FUSION_ENDPOINT=http://fusion:TOKEN@HOST:PORT`
//! (verl: `sandbox_fusion_url=http://fusion:TOKEN@HOST:PORT/run_code`)
//! works with the stock clients. `shoald --run-code-without-token` lets
//! TCP callers use these two routes with no token at all (SandboxFusion's
//! own model: a private network); every other route still needs one.

mod handler;
pub mod translate;
pub mod wire;

pub use handler::routes;

use base64::Engine;

/// Largest `/run_code` body (code and base64 files): 32 MiB.
pub const MAX_BODY: usize = 32 << 20;

/// The routes this module serves.
pub const PATHS: [&str; 2] = ["/run_code", "/v1/ping"];

/// Whether `path` is one of SandboxFusion's routes.
pub fn is_fusion_path(path: &str) -> bool {
    PATHS.contains(&path)
}

/// The password of an `Authorization: Basic base64(USER:PASSWORD)` header
/// value (what `requests` and `aiohttp` send for an endpoint URL with
/// user-info), if it is one.
pub fn basic_password(header: &[u8]) -> Option<Vec<u8>> {
    let b64 = header
        .strip_prefix(b"Basic ")
        .or_else(|| header.strip_prefix(b"basic "))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim_ascii())
        .ok()?;
    let colon = raw.iter().position(|b| *b == b':')?;
    Some(raw[colon + 1..].to_vec())
}

#[cfg(test)]
mod tests;
