//! `shoal fncall`: one function call (`POST /v1/fncall`) — code run in a
//! fresh clone of the language's warm template, destroyed once it
//! answers. The program's stdout and stderr are printed as they were
//! (the compiler's stderr first), and `shoal` exits as the program did.

use crate::daemon_client::connect;
use crate::daemon_cmds::Global;
use anyhow::{bail, Context, Result};
use base64::Engine;
use shoal_client::api::fncall::{FnCallRequest, FnCallResult, FnCallStatus};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Exit status of `shoal fncall` when the call timed out (as timeout(1)).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the sandbox failed (not the program's fault).
pub const EXIT_SANDBOX_ERROR: i32 = 125;

/// Options of `shoal fncall`.
#[derive(clap::Args, Clone)]
pub struct FnCallArgs {
    /// Language: python, bash, cpp, nodejs (`GET /v1/fncall/languages`).
    #[arg(long, short = 'l', default_value = "python")]
    pub language: String,
    /// The code.
    #[arg(
        short = 'c',
        long = "code",
        value_name = "CODE",
        conflicts_with = "source"
    )]
    pub code: Option<String>,
    /// Or a file holding it ('-': our standard input).
    #[arg(value_name = "FILE")]
    pub source: Option<PathBuf>,
    /// What the program reads on stdin (text).
    #[arg(long, value_name = "TEXT", conflicts_with = "stdin_file")]
    pub stdin: Option<String>,
    /// Or a file of it ('-': our standard input).
    #[arg(long, value_name = "FILE")]
    pub stdin_file: Option<PathBuf>,
    /// A file to write before the run: PATH (in the call's working
    /// directory, or absolute) = LOCAL file (repeatable).
    #[arg(long = "file", value_name = "PATH=LOCAL")]
    pub files: Vec<String>,
    /// A file to read back after the run (repeatable), written under
    /// --out-dir by its path.
    #[arg(long = "fetch", value_name = "PATH")]
    pub fetch: Vec<String>,
    /// Where fetched files go.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub out_dir: PathBuf,
    /// Run timeout, seconds (default 10, at most 300).
    #[arg(long, value_name = "S")]
    pub timeout: Option<f64>,
    /// Compile timeout, seconds (compiled languages; default: --timeout).
    #[arg(long, value_name = "S")]
    pub compile_timeout: Option<f64>,
    /// The program's memory limit, MiB (default: the language's).
    #[arg(long, value_name = "MIB")]
    pub memory: Option<u32>,
    /// Environment variable NAME=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_name = "NAME=VALUE")]
    pub env: Vec<String>,
    /// A command-line argument of the program (repeatable).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Bytes kept of each of stdout and stderr (default 64 KiB).
    #[arg(long, value_name = "BYTES")]
    pub output_limit: Option<u64>,
}

fn read_source(p: &Path) -> Result<Vec<u8>> {
    if p == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b)?;
        return Ok(b);
    }
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

fn text(b: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(b).map_err(|_| anyhow::anyhow!("{what} is not UTF-8 text"))
}

/// The request `a` describes.
pub fn request(a: &FnCallArgs) -> Result<FnCallRequest> {
    let code = match (&a.code, &a.source) {
        (Some(c), _) => c.clone(),
        (None, Some(p)) => text(read_source(p)?, "the code")?,
        (None, None) => bail!("give the code: -c CODE, or a FILE ('-' for stdin)"),
    };
    let stdin = match (&a.stdin, &a.stdin_file) {
        (Some(s), _) => Some(s.clone()),
        (None, Some(p)) => Some(text(read_source(p)?, "--stdin-file")?),
        (None, None) => None,
    };
    let mut files = BTreeMap::new();
    for f in &a.files {
        let (path, local) = f
            .split_once('=')
            .with_context(|| format!("--file {f:?}: expected PATH=LOCAL"))?;
        let data =
            std::fs::read(local).with_context(|| format!("--file {f:?}: reading {local}"))?;
        files.insert(
            path.to_string(),
            base64::engine::general_purpose::STANDARD.encode(data),
        );
    }
    let mut env = BTreeMap::new();
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?}: expected NAME=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    Ok(FnCallRequest {
        language: a.language.clone(),
        code,
        stdin,
        files,
        fetch_files: a.fetch.clone(),
        timeout_s: a.timeout,
        compile_timeout_s: a.compile_timeout,
        memory_mib: a.memory,
        env,
        args: a.args.clone(),
        output_limit: a.output_limit,
    })
}

/// Where a fetched guest `path` goes under `dir`: its normal components
/// only (no `..`, no root), so a path cannot leave `dir`.
pub fn local_path(dir: &Path, path: &str) -> Result<PathBuf> {
    let mut out = dir.to_path_buf();
    let mut any = false;
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => {
                out.push(n);
                any = true;
            }
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                bail!("fetched file {path:?}: '..' is not allowed")
            }
        }
    }
    if !any {
        bail!("fetched file {path:?}: no file name");
    }
    Ok(out)
}

/// The exit status `shoal fncall` gives for `r`: the program's exit code,
/// 128 + a signal, [`EXIT_TIMEOUT`], the compiler's exit code for a
/// compile error, [`EXIT_SANDBOX_ERROR`].
pub fn exit_status(r: &FnCallResult) -> i32 {
    match r.status {
        FnCallStatus::Success => 0,
        FnCallStatus::Timeout => EXIT_TIMEOUT,
        FnCallStatus::SandboxError => EXIT_SANDBOX_ERROR,
        FnCallStatus::CompileError => r
            .compile
            .as_ref()
            .and_then(|c| c.exit_code)
            .filter(|c| *c != 0)
            .unwrap_or(1),
        FnCallStatus::Failed | FnCallStatus::OutOfMemory => match (r.exit_code, r.signal) {
            (Some(c), _) if c != 0 => c,
            (_, Some(s)) => 128 + s,
            _ => 1,
        },
    }
}

/// `shoal fncall ...`.
pub fn run(g: &Global, a: &FnCallArgs) -> Result<i32> {
    let req = request(a)?;
    let c = connect(g.daemon.as_deref())?;
    let r: FnCallResult = c.call("POST", "/v1/fncall", Some(&req))?;
    for (path, b64) in &r.files {
        let to = local_path(&a.out_dir, path)?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .with_context(|| format!("fetched file {path:?}: bad base64 from the daemon"))?;
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(&to, data).with_context(|| format!("writing {}", to.display()))?;
    }
    if g.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(exit_status(&r));
    }
    let mut err = std::io::stderr().lock();
    if let Some(comp) = &r.compile {
        err.write_all(comp.stderr.as_bytes())?;
    }
    std::io::stdout().lock().write_all(r.stdout.as_bytes())?;
    err.write_all(r.stderr.as_bytes())?;
    let note = |what: &str| format!("shoal: {what}\n");
    let mut notes = Vec::new();
    if r.stdout_truncated || r.stderr_truncated {
        notes.push(note("output cut at the output limit (--output-limit)"));
    }
    match r.status {
        FnCallStatus::Timeout => notes.push(note("timed out (--timeout)")),
        FnCallStatus::OutOfMemory => notes.push(note("killed: over its memory limit (--memory)")),
        FnCallStatus::CompileError => notes.push(note("did not compile")),
        FnCallStatus::SandboxError => notes.push(note(&format!(
            "sandbox error: {}",
            r.error.as_deref().unwrap_or("unknown")
        ))),
        _ => {}
    }
    for n in notes {
        err.write_all(n.as_bytes())?;
    }
    Ok(exit_status(&r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_client::api::fncall::CompileResult;

    fn res(status: FnCallStatus, exit_code: Option<i32>, signal: Option<i32>) -> FnCallResult {
        FnCallResult {
            status,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            exit_code,
            signal,
            duration_ms: 1.0,
            total_ms: 2.0,
            files: BTreeMap::new(),
            compile: None,
            error: None,
        }
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(&res(FnCallStatus::Success, Some(0), None)), 0);
        assert_eq!(exit_status(&res(FnCallStatus::Failed, Some(3), None)), 3);
        assert_eq!(exit_status(&res(FnCallStatus::Failed, None, Some(9))), 137);
        assert_eq!(exit_status(&res(FnCallStatus::Timeout, None, Some(9))), 124);
        assert_eq!(
            exit_status(&res(FnCallStatus::SandboxError, None, None)),
            125
        );
        assert_eq!(
            exit_status(&res(FnCallStatus::OutOfMemory, None, Some(9))),
            137
        );
        let mut c = res(FnCallStatus::CompileError, None, None);
        c.compile = Some(CompileResult {
            exit_code: Some(4),
            stdout: String::new(),
            stderr: String::new(),
            duration_ms: 1.0,
            timed_out: false,
        });
        assert_eq!(exit_status(&c), 4);
    }

    #[test]
    fn fetched_paths_stay_under_the_out_dir() {
        let d = Path::new("/o");
        assert_eq!(local_path(d, "a/b.txt").unwrap(), Path::new("/o/a/b.txt"));
        assert_eq!(local_path(d, "/tmp/x").unwrap(), Path::new("/o/tmp/x"));
        assert!(local_path(d, "../x").is_err());
        assert!(local_path(d, "a/../../x").is_err());
        assert!(local_path(d, "/").is_err());
    }

    #[test]
    fn the_request_has_what_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("in.bin");
        std::fs::write(&local, b"\x00\xff").unwrap();
        let a = FnCallArgs {
            language: "python".into(),
            code: Some("print(input())".into()),
            source: None,
            stdin: Some("hi\n".into()),
            stdin_file: None,
            files: vec![format!("data/in.bin={}", local.display())],
            fetch: vec!["out.txt".into()],
            out_dir: ".".into(),
            timeout: Some(2.0),
            compile_timeout: None,
            memory: Some(64),
            env: vec!["A=1".into()],
            args: vec!["-x".into()],
            output_limit: None,
        };
        let r = request(&a).unwrap();
        assert_eq!(r.code, "print(input())");
        assert_eq!(r.stdin.as_deref(), Some("hi\n"));
        assert_eq!(r.files["data/in.bin"], "AP8=");
        assert_eq!(r.fetch_files, ["out.txt"]);
        assert_eq!((r.timeout_s, r.memory_mib), (Some(2.0), Some(64)));
        assert_eq!(r.env["A"], "1");
        assert_eq!(r.args, ["-x"]);
        let mut bad = a.clone();
        bad.files = vec!["nolocal".into()];
        assert!(request(&bad)
            .unwrap_err()
            .to_string()
            .contains("PATH=LOCAL"));
        bad.files.clear();
        bad.code = None;
        assert!(request(&bad).unwrap_err().to_string().contains("-c CODE"));
    }
}
