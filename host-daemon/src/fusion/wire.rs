//! SandboxFusion's `/run_code` JSON, field for field as its server
//! (`sandbox/server/sandbox_api.py`, `sandbox/runners/types.py`) and the
//! `sandbox-fusion` 0.3.7 client (`sandbox_fusion/models.py`) have it.
//!
//! Parsing is as lenient as SandboxFusion's pydantic models: unknown
//! fields are ignored, `stdin` and file contents may be `null`, numbers
//! may be integers. Responses list every field of SandboxFusion's
//! response model, `null` where it has none.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// SandboxFusion's default compile and run timeouts (s).
pub const DEFAULT_TIMEOUT_S: f64 = 10.0;

/// `POST /run_code`'s body (`RunCodeRequest`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct RunCodeRequest {
    /// Compile timeout for compiled languages, s (default 10).
    #[serde(default)]
    pub compile_timeout: Option<f64>,
    /// Run timeout, s (default 10).
    #[serde(default)]
    pub run_timeout: Option<f64>,
    /// Memory limit, MB (default -1: none).
    #[serde(default, rename = "memory_limit_MB")]
    pub memory_limit_mb: Option<i64>,
    /// The code.
    pub code: String,
    /// What the program reads on stdin.
    #[serde(default)]
    pub stdin: Option<String>,
    /// The language (SandboxFusion's names: `python`, `cpp`, `nodejs`,
    /// `bash`, ...).
    pub language: String,
    /// Path → base64 content (a `null` content is skipped, as SandboxFusion
    /// does).
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    /// Paths read back after the run.
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Command-line arguments.
    #[serde(default)]
    pub args: Vec<String>,
}

/// The top-level outcome (`RunStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// Every step finished and exited 0.
    Success,
    /// A step exited non-zero, was killed or timed out.
    Failed,
    /// The sandbox failed (the stock client retries these).
    SandboxError,
}

/// How one step (compile or run) ended (`CommandRunStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandRunStatus {
    /// It ran to its end (any exit code).
    Finished,
    /// It could not be run (the sandbox's fault).
    Error,
    /// Its timeout passed; `return_code` is `null`.
    TimeLimitExceeded,
}

/// One step (`CommandRunResult`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRunResult {
    /// How it ended.
    pub status: CommandRunStatus,
    /// Wall time, s.
    pub execution_time: Option<f64>,
    /// Exit code (minus the signal number when killed by one; `null` on a
    /// timeout or an error).
    pub return_code: Option<i32>,
    /// Its stdout.
    pub stdout: Option<String>,
    /// Its stderr (for `Error`, why).
    pub stderr: Option<String>,
}

/// `POST /run_code`'s answer (`RunCodeResponse`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCodeResponse {
    /// The outcome.
    pub status: RunStatus,
    /// Why, for `SandboxError` (else empty).
    pub message: String,
    /// The compile step, for compiled languages.
    pub compile_result: Option<CommandRunResult>,
    /// The run step (`null` when the compile failed).
    pub run_result: Option<CommandRunResult>,
    /// SandboxFusion's pod name (always `null` here).
    pub executor_pod_name: Option<String>,
    /// Fetched files: path → base64.
    pub files: BTreeMap<String, String>,
}

/// SandboxFusion's languages: the server's `Language` literal and the
/// 0.3.7 client's (which adds `python2`, `gtest`, `react`), and the
/// runner aliases `js` and `ts`.
pub const LANGUAGES: &[&str] = &[
    "python",
    "python2",
    "cpp",
    "nodejs",
    "js",
    "go",
    "go_test",
    "java",
    "php",
    "csharp",
    "bash",
    "typescript",
    "ts",
    "sql",
    "rust",
    "cuda",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "pytest",
    "junit",
    "kotlin_script",
    "jest",
    "verilog",
    "python_gpu",
    "lean",
    "swift",
    "racket",
    "gtest",
    "react",
];
