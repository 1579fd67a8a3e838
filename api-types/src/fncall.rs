//! `POST /v1/fncall` and `POST /v1/fncall/batch`: one short, stateless run
//! of untrusted code, each in a fresh copy-on-write clone of a per-language
//! warm template, destroyed after it answers. `GET /v1/fncall/languages`
//! lists what can be asked for.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Default cap on each of stdout and stderr kept for a call (64 KiB).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 64 * 1024;
/// Largest output cap a call may ask for (8 MiB per stream).
pub const MAX_OUTPUT_LIMIT: u64 = 8 * 1024 * 1024;
/// Default run timeout (10 s).
pub const DEFAULT_TIMEOUT_S: f64 = 10.0;
/// Largest run timeout (300 s).
pub const MAX_TIMEOUT_S: f64 = 300.0;
/// Most calls in one batch.
pub const MAX_BATCH_CALLS: usize = 10_000;

/// One call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FnCallRequest {
    /// A language from `GET /v1/fncall/languages` (`python`, `bash`,
    /// `cpp`, `nodejs`, ...).
    pub language: String,
    /// The program's source.
    pub code: String,
    /// What the program reads on stdin (UTF-8 text; default empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Files written before the run: path (absolute, or relative to the
    /// call's working directory) → base64 content.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// Files read back after the run (a missing one is left out of the
    /// result's `files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fetch_files: Vec<String>,
    /// Run timeout in seconds (default 10, at most 300); the clone is
    /// killed when it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Compile timeout in seconds for compiled languages (default: the
    /// run timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_timeout_s: Option<f64>,
    /// Memory limit of the program inside the guest, MiB (default: what
    /// the language's template allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// Environment variables over the language's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Command-line arguments of the program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Bytes of each of stdout and stderr kept (default 64 KiB, at most
    /// 8 MiB); more is cut and flagged `*_truncated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_limit: Option<u64>,
}

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FnCallStatus {
    /// The program ran and exited 0.
    Success,
    /// The program ran and exited non-zero or was killed by a signal.
    Failed,
    /// The program did not compile (compiled languages).
    CompileError,
    /// The run (or compile) timeout passed; the clone was killed.
    Timeout,
    /// The program went over its memory limit and was killed.
    OutOfMemory,
    /// The sandbox failed (the guest crashed or stopped answering, or no
    /// clone could be made): not the program's fault; `error` says why.
    SandboxError,
}

/// The compile step of a compiled language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompileResult {
    /// Compiler exit code (`null` if it was killed).
    pub exit_code: Option<i32>,
    /// Compiler stdout (lossy UTF-8, capped like the run's).
    pub stdout: String,
    /// Compiler stderr.
    pub stderr: String,
    /// Wall time of the compile, ms.
    pub duration_ms: f64,
    /// The compile timeout passed.
    pub timed_out: bool,
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FnCallResult {
    /// How it ended.
    pub status: FnCallStatus,
    /// The program's stdout (lossy UTF-8), at most `output_limit` bytes.
    pub stdout: String,
    /// The program's stderr.
    pub stderr: String,
    /// stdout was cut at the limit.
    pub stdout_truncated: bool,
    /// stderr was cut at the limit.
    pub stderr_truncated: bool,
    /// Exit code, when the program exited.
    pub exit_code: Option<i32>,
    /// Signal number, when the program was killed by one.
    pub signal: Option<i32>,
    /// Wall time of the run (not counting the clone or compile), ms.
    pub duration_ms: f64,
    /// Wall time of the whole call as the daemon saw it, ms.
    pub total_ms: f64,
    /// Fetched files: path → base64 content.
    pub files: BTreeMap<String, String>,
    /// The compile step, for compiled languages.
    pub compile: Option<CompileResult>,
    /// Why, for `sandbox_error` (else `null`).
    pub error: Option<String>,
}

/// `POST /v1/fncall/batch`: many calls, answered as NDJSON lines of
/// [`BatchItem`] in the order they finish.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The calls (at most 10,000).
    pub calls: Vec<FnCallRequest>,
    /// How many run at once (default: what the host admits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
}

/// One line of a batch's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchItem {
    /// The call's index in the request.
    pub index: usize,
    /// Its result (a call refused before it ran, say for an unknown
    /// language, is a `sandbox_error` with the reason).
    pub result: FnCallResult,
}

/// `GET /v1/fncall/languages`: one language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Language {
    /// Its name in requests.
    pub name: String,
    /// Its code is run by an interpreter already started in the template
    /// (no process start per call).
    pub warm: bool,
    /// Compiled before it runs.
    pub compiled: bool,
    /// The template behind it is built and ready.
    pub ready: bool,
    /// The image and layers its template is made from.
    pub image: String,
    /// Its layers, lowest first.
    pub layers: Vec<String>,
    /// The template its calls are cloned from, once built (give it a warm
    /// pool with `PUT /v1/pools/{template}` to take restores off the
    /// calls' path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Why it cannot run here (a layer image this build lacks), if so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
