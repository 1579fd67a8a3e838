//! FnCall: one short, stateless run of untrusted code per call, each in a
//! fresh copy-on-write clone of a per-language template, destroyed after
//! it answers (`POST /v1/fncall`, `POST /v1/fncall/batch`,
//! `GET /v1/fncall/languages`).
//!
//! - [`registry`]: the languages, one declarative entry each.
//! - [`validate`]: a request checked (400s that name the field).
//! - [`template`]: each language's template. Warm languages (python) are
//!   snapshotted with their interpreter started, the standard modules
//!   (and numpy, with its layer) imported, blocked reading the call on
//!   stdin: a call is a restore (or a pooled clone), an attach, one write
//!   and the program's own run. No process is started per call. Cold
//!   languages (bash, cpp, nodejs) exec their compiler and program in a
//!   clone of their image template.
//! - [`call`]: one call in its clone.
//!
//! Why a clone per call rather than a process per call in shared workers:
//! nothing of a call (files, environment, background processes, module
//! state, the kernel's state) survives it, by construction rather than by
//! cleanup; and a restore from a snapshot costs about what a fork+exec of
//! an interpreter costs a guest, so isolation is nearly free. Clones come
//! from the template's warm pool when it has one (`PUT /v1/pools/NAME`,
//! the template's name in `GET /v1/fncall/languages`), so the restore is
//! off the call's path too.
//!
//! Limits: stdout and stderr are capped per call (`output_limit`, cut and
//! flagged); the run timeout is the daemon's, which kills the clone when
//! it passes; the memory limit is the program's cgroup `memory.max` in the
//! guest (an OOM kill is `out_of_memory`); a guest that crashes or stops
//! answering ends the call as `sandbox_error` at once (its connection
//! closes) or at the deadline.

pub mod call;
pub mod registry;
pub mod template;
pub mod validate;

use crate::{ApiError, ApiResult, Daemon};
use shoal_api::fncall::{BatchItem, BatchRequest, FnCallRequest, FnCallResult, MAX_BATCH_CALLS};
use shoal_api::Language;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Largest body of `POST /v1/fncall` (code, stdin and files together).
pub const MAX_CALL_BODY: usize = 32 << 20;
/// Largest body of `POST /v1/fncall/batch`.
pub const MAX_BATCH_BODY: usize = 256 << 20;
/// Default concurrency of a batch.
pub const DEFAULT_BATCH_CONCURRENCY: u32 = 16;
/// Largest concurrency of a batch.
pub const MAX_BATCH_CONCURRENCY: u32 = 1024;

/// Runs one call: a 400 ([`ApiError::BadRequest`]) for a malformed
/// request, else its result (a sandbox failure is a result with status
/// `sandbox_error`). The call runs in a task of its own: a caller that
/// goes away leaves no clone behind.
pub async fn run_call(d: &Arc<Daemon>, req: FnCallRequest) -> Result<FnCallResult, ApiError> {
    let call = validate::check(req)?;
    let d = d.clone();
    tokio::spawn(async move { call::run(&d, call).await })
        .await
        .map_err(|source| ApiError::Task {
            what: "fncall".into(),
            source,
        })
}

/// Runs a batch: checked as a whole first (a 400 for a malformed batch:
/// too many calls, a bad concurrency), then each call at most
/// `concurrency` at a time; the receiver yields one [`BatchItem`] per call
/// in the order they finish (a call that is malformed by itself is a
/// `sandbox_error` item saying why). Dropping the receiver stops starting
/// new calls (those running finish and are cleaned up).
pub fn run_batch(d: &Arc<Daemon>, req: BatchRequest) -> ApiResult<mpsc::Receiver<BatchItem>> {
    if req.calls.len() > MAX_BATCH_CALLS {
        return Err(ApiError::BadRequest(format!(
            "{} calls: a batch holds at most {MAX_BATCH_CALLS}",
            req.calls.len()
        )));
    }
    let conc = req.concurrency.unwrap_or(DEFAULT_BATCH_CONCURRENCY);
    if !(1..=MAX_BATCH_CONCURRENCY).contains(&conc) {
        return Err(ApiError::BadRequest(format!(
            "concurrency {conc}: expected 1..={MAX_BATCH_CONCURRENCY}"
        )));
    }
    let (tx, rx) = mpsc::channel(64);
    let d = d.clone();
    tokio::spawn(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(conc as usize));
        for (index, req) in req.calls.into_iter().enumerate() {
            let Ok(permit) = sem.clone().acquire_owned().await else {
                return;
            };
            if tx.is_closed() {
                return;
            }
            let (d, tx) = (d.clone(), tx.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                let result = match validate::check(req) {
                    Ok(c) => call::run(&d, c).await,
                    Err(e) => call::sandbox_error(t0, e.to_string()),
                };
                drop(permit);
                let _ = tx.send(BatchItem { index, result }).await;
            });
        }
    });
    Ok(rx)
}

/// Every language, with whether its template is ready.
pub fn languages(d: &Daemon) -> Vec<Language> {
    registry::LANGUAGES
        .iter()
        .map(|s| {
            let here = s.layers_here();
            let cached = template::cached(d, s);
            Language {
                name: s.name.into(),
                warm: s.warm.is_some(),
                compiled: s.compile.is_some(),
                ready: cached.is_some(),
                image: s.image.into(),
                layers: here
                    .clone()
                    .unwrap_or_else(|_| s.layers.iter().map(|l| l.name.to_string()).collect()),
                template: cached.map(|r| r.template),
                error: here.err(),
            }
        })
        .collect()
}
