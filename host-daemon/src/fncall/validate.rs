//! A call's request checked and made ready to run: every bound the API
//! promises, with a 400 that names the field for anything out of them.

use super::registry::{self, Spec, WORKDIR};
use crate::{inputs, ApiError, ApiResult};
use shoal_api::fncall::{
    FnCallRequest, DEFAULT_OUTPUT_LIMIT, DEFAULT_TIMEOUT_S, MAX_OUTPUT_LIMIT, MAX_TIMEOUT_S,
};
use shoal_api::Encoding;
use std::collections::BTreeMap;
use std::time::Duration;

/// Largest `code` (1 MiB).
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// Largest `stdin` (8 MiB).
pub const MAX_STDIN_BYTES: usize = 8 << 20;
/// Most `files` and `fetch_files` entries each.
pub const MAX_FILES: usize = 256;
/// Most bytes of all `files` together, decoded (16 MiB).
pub const MAX_FILES_BYTES: usize = 16 << 20;
/// Most bytes fetched back per file (8 MiB); a bigger file is cut there
/// and the call's `error` says so.
pub const MAX_FETCH_BYTES: u64 = 8 << 20;
/// Most `args`, and most bytes of them together.
pub const MAX_ARGS: usize = 1024;
/// Most bytes of all `args` together.
pub const MAX_ARGS_BYTES: usize = 256 << 10;
/// Smallest `memory_mib`.
pub const MIN_MEMORY_MIB: u32 = 32;
/// What the agent leaves the user cgroup of a guest below its RAM (MiB).
pub const AGENT_RESERVE_MIB: u32 = 24;

/// A checked call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Its language.
    pub spec: &'static Spec,
    /// The source.
    pub code: String,
    /// Its stdin.
    pub stdin: Vec<u8>,
    /// Files to write: absolute guest path → (name as asked, content).
    pub files: Vec<(String, Vec<u8>)>,
    /// Files to read back: (absolute guest path, name as asked).
    pub fetch: Vec<(String, String)>,
    /// Run timeout.
    pub timeout: Duration,
    /// Compile timeout.
    pub compile_timeout: Duration,
    /// The program's memory limit (bytes).
    pub memory_max: u64,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Output cap per stream (bytes).
    pub output_limit: usize,
}

/// Most memory a call of `spec` may have (MiB).
pub fn max_memory_mib(spec: &Spec) -> u32 {
    spec.memory_mib.saturating_sub(AGENT_RESERVE_MIB)
}

fn bad(m: String) -> ApiError {
    ApiError::BadRequest(m)
}

fn seconds(what: &str, v: Option<f64>, default: f64) -> ApiResult<Duration> {
    let t = v.unwrap_or(default);
    if !(t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_S) {
        return Err(bad(format!(
            "{what} {t}: expected a number of seconds, 0 < {what} <= {MAX_TIMEOUT_S}"
        )));
    }
    Ok(Duration::from_secs_f64(t))
}

/// A guest path for `p` as the request gave it (relative: to
/// [`WORKDIR`]).
fn guest_path(what: &str, p: &str) -> ApiResult<String> {
    if p.is_empty() || p.contains('\0') || p.len() > 4000 || p.ends_with('/') {
        return Err(bad(format!(
            "{what} path {p:?}: expected a file path (not empty, no NUL, at most 4000 bytes, \
             not ending in '/')"
        )));
    }
    Ok(if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{WORKDIR}/{p}")
    })
}

/// Checks `req`.
pub fn check(req: FnCallRequest) -> ApiResult<Call> {
    let spec = registry::find(&req.language).ok_or_else(|| {
        let names: Vec<&str> = registry::LANGUAGES.iter().map(|s| s.name).collect();
        bad(format!(
            "unknown language {:?} (expected one of {}; see GET /v1/fncall/languages)",
            req.language,
            names.join(", ")
        ))
    })?;
    if req.code.len() > MAX_CODE_BYTES {
        return Err(bad(format!(
            "code is {} bytes; at most {MAX_CODE_BYTES} bytes",
            req.code.len()
        )));
    }
    let stdin = req.stdin.unwrap_or_default().into_bytes();
    if stdin.len() > MAX_STDIN_BYTES {
        return Err(bad(format!(
            "stdin is {} bytes; at most {MAX_STDIN_BYTES} bytes",
            stdin.len()
        )));
    }
    if req.files.len() > MAX_FILES || req.fetch_files.len() > MAX_FILES {
        return Err(bad(format!(
            "at most {MAX_FILES} entries in 'files' and in 'fetch_files'"
        )));
    }
    let mut files = Vec::with_capacity(req.files.len());
    let mut total = 0usize;
    for (p, b64) in &req.files {
        let path = guest_path("files", p)?;
        let data = Encoding::Base64
            .decode(b64)
            .map_err(|e| bad(format!("files[{p:?}]: not valid base64: {e}")))?;
        total = total.saturating_add(data.len());
        if total > MAX_FILES_BYTES {
            return Err(bad(format!(
                "'files' hold more than {MAX_FILES_BYTES} bytes (decoded)"
            )));
        }
        files.push((path, data));
    }
    let fetch = req
        .fetch_files
        .iter()
        .map(|p| Ok((guest_path("fetch_files", p)?, p.clone())))
        .collect::<ApiResult<Vec<_>>>()?;
    let timeout = seconds("timeout_s", req.timeout_s, DEFAULT_TIMEOUT_S)?;
    let compile_timeout = seconds(
        "compile_timeout_s",
        req.compile_timeout_s,
        timeout.as_secs_f64(),
    )?;
    let max_mem = max_memory_mib(spec);
    let mem = req.memory_mib.unwrap_or(max_mem);
    if !(MIN_MEMORY_MIB..=max_mem).contains(&mem) {
        return Err(bad(format!(
            "memory_mib {mem}: expected {MIN_MEMORY_MIB}..={max_mem} for language '{}'",
            spec.name
        )));
    }
    inputs::check_map(&req.env, &inputs::ENV)?;
    for k in req.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(bad(format!("bad environment name {k:?}")));
        }
    }
    if req.env.values().any(|v| v.contains('\0')) {
        return Err(bad("environment values may not contain NUL".into()));
    }
    let arg_bytes: usize = req.args.iter().map(String::len).sum();
    if req.args.len() > MAX_ARGS || arg_bytes > MAX_ARGS_BYTES {
        return Err(bad(format!(
            "args: at most {MAX_ARGS} arguments of {MAX_ARGS_BYTES} bytes together"
        )));
    }
    if req.args.iter().any(|a| a.contains('\0')) {
        return Err(bad("args may not contain NUL".into()));
    }
    let limit = req.output_limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
    if limit > MAX_OUTPUT_LIMIT {
        return Err(bad(format!(
            "output_limit {limit}: at most {MAX_OUTPUT_LIMIT} bytes"
        )));
    }
    Ok(Call {
        spec,
        code: req.code,
        stdin,
        files,
        fetch,
        timeout,
        compile_timeout,
        memory_max: u64::from(mem) << 20,
        env: req.env,
        args: req.args,
        output_limit: usize::try_from(limit).unwrap_or(usize::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(lang: &str) -> FnCallRequest {
        FnCallRequest {
            language: lang.into(),
            code: "print(1)".into(),
            ..Default::default()
        }
    }

    fn err(r: FnCallRequest) -> String {
        match check(r) {
            Err(ApiError::BadRequest(m)) => m,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = check(req("python")).unwrap();
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.compile_timeout, Duration::from_secs(10));
        assert_eq!(c.output_limit, 64 * 1024);
        assert_eq!(c.memory_max, u64::from(max_memory_mib(c.spec)) << 20);
        assert!(c.stdin.is_empty() && c.files.is_empty() && c.fetch.is_empty());
    }

    #[test]
    fn malformed_requests_name_what_is_wrong() {
        assert!(err(req("cobol")).contains("unknown language \"cobol\""));
        let mut r = req("python");
        r.code = "x".repeat(MAX_CODE_BYTES + 1);
        assert!(err(r).contains("code is 1048577 bytes"));
        let mut r = req("python");
        r.files.insert("a.txt".into(), "!!notbase64".into());
        assert!(err(r).contains("files[\"a.txt\"]: not valid base64"));
        for t in [-1.0, 0.0, f64::NAN, 301.0] {
            let mut r = req("python");
            r.timeout_s = Some(t);
            assert!(err(r).contains("timeout_s"), "{t}");
        }
        let mut r = req("python");
        r.compile_timeout_s = Some(-2.0);
        assert!(err(r).contains("compile_timeout_s -2"));
        let mut r = req("python");
        r.memory_mib = Some(1);
        assert!(err(r).contains("memory_mib 1"));
        let mut r = req("python");
        r.memory_mib = Some(1 << 20);
        assert!(err(r).contains("memory_mib"));
        let mut r = req("python");
        r.env.insert("A=B".into(), "x".into());
        assert!(err(r).contains("environment name"));
        let mut r = req("python");
        r.fetch_files.push(String::new());
        assert!(err(r).contains("fetch_files path"));
        let mut r = req("python");
        r.output_limit = Some(MAX_OUTPUT_LIMIT + 1);
        assert!(err(r).contains("output_limit"));
    }

    #[test]
    fn paths_are_relative_to_the_workdir() {
        let mut r = req("python");
        r.files.insert("in/data.txt".into(), "aGk=".into());
        r.files.insert("/etc/x".into(), "".into());
        r.fetch_files.push("out.txt".into());
        let c = check(r).unwrap();
        assert_eq!(
            c.files,
            [
                ("/etc/x".to_string(), vec![]),
                ("/tmp/fncall/in/data.txt".to_string(), b"hi".to_vec())
            ]
        );
        assert_eq!(
            c.fetch,
            [("/tmp/fncall/out.txt".to_string(), "out.txt".to_string())]
        );
    }
}
