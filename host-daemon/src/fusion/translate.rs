//! SandboxFusion's `/run_code` to and from FnCall ([`shoal_api::fncall`]):
//! pure functions, so that every rule is unit-tested.
//!
//! Request: `run_timeout` → `timeout_s`, `compile_timeout` →
//! `compile_timeout_s`, `memory_limit_MB` > 0 → `memory_mib` (≤ 0: none;
//! the handler keeps it within what the language's template allows),
//! `files` with `null` contents (and SandboxFusion's `IGNORE_THIS_FILE`
//! names) left out, the output cap SandboxFusion's (1 MiB per stream).
//!
//! Result, as SandboxFusion's `parse_run_status` decides: a sandbox
//! failure is `SandboxError` (the step `Error`, its `stderr` and the
//! `message` the reason); a timeout is `Failed` with the step
//! `TimeLimitExceeded` and `return_code` `null`; a compile that fails
//! leaves `run_result` `null`; any non-zero exit (a signal as minus its
//! number, as Python's subprocess reports it) is `Failed`; else `Success`.

use super::wire::{
    CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus,
    DEFAULT_TIMEOUT_S, LANGUAGES,
};
use base64::Engine;
use shoal_api::fncall::{CompileResult, FnCallRequest, FnCallResult, FnCallStatus, MAX_TIMEOUT_S};

/// SandboxFusion keeps at most this much of each of stdout and stderr.
pub const OUTPUT_LIMIT: u64 = 1024 * 1024;

/// Why a `/run_code` request cannot be run (a 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// Not one of SandboxFusion's languages.
    #[error(
        "unknown language '{0}': SandboxFusion's languages are {langs} \
         (GET /v1/fncall/languages lists those this shoald serves)",
        langs = LANGUAGES.join(", ")
    )]
    UnknownLanguage(String),
    /// A timeout that is not a positive number of seconds within the limit.
    #[error("{field} must be a number of seconds > 0 and at most {MAX_TIMEOUT_S}, got {value}")]
    Timeout {
        /// `run_timeout` or `compile_timeout`.
        field: &'static str,
        /// What was sent.
        value: f64,
    },
    /// `memory_limit_MB` too large.
    #[error("memory_limit_MB must be at most {max} (or <= 0 for no limit), got {0}", max = u32::MAX)]
    Memory(i64),
    /// A file's content is not base64.
    #[error("files['{path}'] is not base64: {why}")]
    Base64 {
        /// The file.
        path: String,
        /// The decoder's complaint.
        why: String,
    },
}

/// The FnCall language a SandboxFusion language name runs as (`js` is
/// `nodejs`, `ts` `typescript`), `None` if it is not one of
/// SandboxFusion's. Whether this daemon serves it is the FnCall core's
/// to say.
pub fn fncall_language(name: &str) -> Option<&'static str> {
    let known = LANGUAGES.iter().find(|l| **l == name)?;
    Some(match *known {
        "js" => "nodejs",
        "ts" => "typescript",
        other => other,
    })
}

fn timeout(field: &'static str, v: Option<f64>) -> Result<f64, RequestError> {
    let value = v.unwrap_or(DEFAULT_TIMEOUT_S);
    if value.is_finite() && value > 0.0 && value <= MAX_TIMEOUT_S {
        Ok(value)
    } else {
        Err(RequestError::Timeout { field, value })
    }
}

/// Base64 as SandboxFusion's clients send it; line breaks and other ASCII
/// white space (MIME-style base64) are dropped first. Returns the
/// canonical text.
fn clean_base64(path: &str, s: &str) -> Result<String, RequestError> {
    let compact: String = s.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| RequestError::Base64 {
            path: path.to_string(),
            why: e.to_string(),
        })?;
    Ok(compact)
}

/// The FnCall of a `/run_code` request.
pub fn to_fncall(r: RunCodeRequest) -> Result<FnCallRequest, RequestError> {
    let language = fncall_language(&r.language)
        .ok_or_else(|| RequestError::UnknownLanguage(r.language.clone()))?;
    let timeout_s = timeout("run_timeout", r.run_timeout)?;
    let compile_timeout_s = timeout("compile_timeout", r.compile_timeout)?;
    let memory_mib = match r.memory_limit_mb {
        None => None,
        Some(m) if m <= 0 => None,
        Some(m) => Some(u32::try_from(m).map_err(|_| RequestError::Memory(m))?),
    };
    let mut files = std::collections::BTreeMap::new();
    for (path, content) in r.files {
        // SandboxFusion's restore_files skips these two.
        let Some(content) = content else { continue };
        if path.contains("IGNORE_THIS_FILE") {
            continue;
        }
        let b64 = clean_base64(&path, &content)?;
        files.insert(path, b64);
    }
    Ok(FnCallRequest {
        language: language.to_string(),
        code: r.code,
        stdin: r.stdin,
        files,
        fetch_files: r.fetch_files,
        timeout_s: Some(timeout_s),
        compile_timeout_s: Some(compile_timeout_s),
        memory_mib,
        env: Default::default(),
        args: r.args,
        output_limit: Some(OUTPUT_LIMIT),
    })
}

/// What `/run_code` answers for a sandbox failure (`why`).
pub fn sandbox_error(why: &str) -> RunCodeResponse {
    RunCodeResponse {
        status: RunStatus::SandboxError,
        message: why.to_string(),
        compile_result: None,
        run_result: Some(error_step(why)),
        executor_pod_name: None,
        files: Default::default(),
    }
}

fn error_step(why: &str) -> CommandRunResult {
    CommandRunResult {
        status: CommandRunStatus::Error,
        execution_time: None,
        return_code: None,
        stdout: None,
        stderr: Some(why.to_string()),
    }
}

fn secs(ms: f64) -> Option<f64> {
    (ms.is_finite() && ms >= 0.0).then_some(ms / 1000.0)
}

fn compile_step(c: &CompileResult) -> CommandRunResult {
    CommandRunResult {
        status: if c.timed_out {
            CommandRunStatus::TimeLimitExceeded
        } else {
            CommandRunStatus::Finished
        },
        execution_time: secs(c.duration_ms),
        return_code: if c.timed_out { None } else { c.exit_code },
        stdout: Some(c.stdout.clone()),
        stderr: Some(c.stderr.clone()),
    }
}

/// The exit status as Python's subprocess has it: the exit code, or minus
/// the signal's number.
fn return_code(r: &FnCallResult) -> Option<i32> {
    r.exit_code.or(r.signal.map(|s| -s))
}

/// The `/run_code` answer of a FnCall result.
pub fn from_fncall(r: FnCallResult) -> RunCodeResponse {
    if r.status == FnCallStatus::SandboxError {
        let why = r
            .error
            .clone()
            .unwrap_or_else(|| "the sandbox failed".to_string());
        let mut out = sandbox_error(&why);
        out.compile_result = r.compile.as_ref().map(compile_step);
        return out;
    }
    let compile_result = r.compile.as_ref().map(compile_step);
    let compile_ok = r
        .compile
        .as_ref()
        .is_none_or(|c| !c.timed_out && c.exit_code == Some(0));
    let run_step = |status, return_code| CommandRunResult {
        status,
        execution_time: secs(r.duration_ms),
        return_code,
        stdout: Some(r.stdout.clone()),
        stderr: Some(r.stderr.clone()),
    };
    let (compile_result, run_result) = match r.status {
        // A compile error without its step (not expected of the core):
        // its output is the compiler's.
        FnCallStatus::CompileError if compile_result.is_none() => (
            Some(CommandRunResult {
                status: CommandRunStatus::Finished,
                execution_time: secs(r.duration_ms),
                return_code: Some(return_code(&r).filter(|c| *c != 0).unwrap_or(1)),
                stdout: Some(r.stdout.clone()),
                stderr: Some(r.stderr.clone()),
            }),
            None,
        ),
        FnCallStatus::CompileError => (compile_result, None),
        FnCallStatus::Timeout if !compile_ok => (compile_result, None),
        FnCallStatus::Timeout => (
            compile_result,
            Some(run_step(CommandRunStatus::TimeLimitExceeded, None)),
        ),
        // Killed at the memory limit: SandboxFusion's rlimits make the
        // program fail (its cgroup OOM-kills it): a non-zero exit.
        FnCallStatus::OutOfMemory => (
            compile_result,
            Some(run_step(
                CommandRunStatus::Finished,
                Some(return_code(&r).filter(|c| *c != 0).unwrap_or(-9)),
            )),
        ),
        FnCallStatus::Success | FnCallStatus::Failed | FnCallStatus::SandboxError => (
            compile_result,
            Some(run_step(CommandRunStatus::Finished, return_code(&r))),
        ),
    };
    let mut out = RunCodeResponse {
        status: RunStatus::Success,
        message: String::new(),
        compile_result,
        run_result,
        executor_pod_name: None,
        files: r.files,
    };
    out.status = run_status(&out);
    out
}

/// SandboxFusion's `parse_run_status`: an `Error` step is `SandboxError`;
/// a timeout or a non-zero return code `Failed`; else `Success`.
pub fn run_status(r: &RunCodeResponse) -> RunStatus {
    let steps: Vec<&CommandRunResult> =
        r.compile_result.iter().chain(r.run_result.iter()).collect();
    if steps.iter().any(|s| s.status == CommandRunStatus::Error) {
        return RunStatus::SandboxError;
    }
    if steps
        .iter()
        .any(|s| s.status == CommandRunStatus::TimeLimitExceeded)
    {
        return RunStatus::Failed;
    }
    if steps.iter().any(|s| s.return_code.is_some_and(|c| c != 0)) {
        return RunStatus::Failed;
    }
    // SandboxFusion: a compile that "succeeded" without a run is not a
    // success either (summary_run_code_result calls it invalid).
    if r.compile_result.is_some() && r.run_result.is_none() {
        return RunStatus::Failed;
    }
    RunStatus::Success
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
