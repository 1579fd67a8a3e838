use super::*;
use serde_json::{json, Value};

fn req(v: Value) -> RunCodeRequest {
    serde_json::from_value(v).unwrap()
}

/// What the stock `sandbox-fusion` 0.3.7 client sends (checked on the
/// wire).
fn stock(code: &str, language: &str) -> Value {
    json!({"compile_timeout": 10, "run_timeout": 10, "code": code, "stdin": null,
           "language": language, "files": {}, "fetch_files": []})
}

fn result(status: FnCallStatus) -> FnCallResult {
    FnCallResult {
        status,
        stdout: "out".into(),
        stderr: "err".into(),
        stdout_truncated: false,
        stderr_truncated: false,
        exit_code: Some(0),
        signal: None,
        duration_ms: 12.5,
        total_ms: 20.0,
        files: Default::default(),
        compile: None,
        error: None,
    }
}

fn compile(exit_code: Option<i32>, timed_out: bool) -> CompileResult {
    CompileResult {
        exit_code,
        stdout: String::new(),
        stderr: "cc".into(),
        duration_ms: 300.0,
        timed_out,
    }
}

#[test]
fn the_stock_clients_request_becomes_a_fncall() {
    let f = to_fncall(req(stock("print(1)", "python"))).unwrap();
    assert_eq!(f.language, "python");
    assert_eq!(f.code, "print(1)");
    assert_eq!(f.stdin, None);
    assert_eq!(f.timeout_s, Some(10.0));
    assert_eq!(f.compile_timeout_s, Some(10.0));
    assert_eq!(f.memory_mib, None);
    assert_eq!(f.output_limit, Some(OUTPUT_LIMIT));
    assert!(f.files.is_empty() && f.fetch_files.is_empty() && f.args.is_empty());
}

#[test]
fn defaults_aliases_and_unknown_fields_as_sandboxfusion() {
    // Only code and language are required; extra fields are ignored
    // (pydantic's default), as are null file contents.
    let f = to_fncall(req(json!({
        "code": "x", "language": "js", "memory_limit_MB": 256, "run_timeout": 2.5,
        "files": {"a.txt": "aGk=", "skip": null, "IGNORE_THIS_FILE_1": "aGk="},
        "fetch_files": ["out.txt"], "args": ["-q"], "extra": {"whatever": 1}
    })))
    .unwrap();
    assert_eq!(f.language, "nodejs");
    assert_eq!(f.timeout_s, Some(2.5));
    assert_eq!(f.compile_timeout_s, Some(10.0));
    assert_eq!(f.memory_mib, Some(256));
    assert_eq!(f.files.keys().collect::<Vec<_>>(), ["a.txt"]);
    assert_eq!(f.fetch_files, ["out.txt"]);
    assert_eq!(f.args, ["-q"]);
    for m in [-1, 0] {
        let f = to_fncall(req(
            json!({"code": "x", "language": "bash", "memory_limit_MB": m}),
        ));
        assert_eq!(f.unwrap().memory_mib, None);
    }
    assert_eq!(fncall_language("ts"), Some("typescript"));
    assert_eq!(fncall_language("cpp"), Some("cpp"));
    assert_eq!(fncall_language("Python"), None);
}

#[test]
fn mime_base64_is_accepted_and_made_canonical() {
    let f = to_fncall(req(json!({"code": "x", "language": "python",
        "files": {"d/b.bin": "aGVs\nbG8=\n"}})))
    .unwrap();
    assert_eq!(f.files["d/b.bin"], "aGVsbG8=");
}

#[test]
fn bad_requests_say_what_is_wrong() {
    let e = to_fncall(req(json!({"code": "x", "language": "cobol"}))).unwrap_err();
    assert!(matches!(e, RequestError::UnknownLanguage(ref l) if l == "cobol"));
    assert!(e.to_string().contains("unknown language 'cobol'"), "{e}");
    assert!(e.to_string().contains("python, python2, cpp"), "{e}");
    for (field, v) in [
        ("run_timeout", json!(-1)),
        ("run_timeout", json!(0)),
        ("compile_timeout", json!(-0.5)),
        ("run_timeout", json!(301)),
    ] {
        let mut body = json!({"code": "x", "language": "python"});
        body[field] = v.clone();
        let e = to_fncall(req(body)).unwrap_err();
        assert!(
            matches!(e, RequestError::Timeout { field: f, .. } if f == field),
            "{field}={v}: {e:?}"
        );
        assert!(e.to_string().starts_with(field), "{e}");
    }
    let e = to_fncall(req(json!({"code": "x", "language": "python",
        "memory_limit_MB": 1_i64 << 40})))
    .unwrap_err();
    assert!(matches!(e, RequestError::Memory(_)), "{e:?}");
    let e = to_fncall(req(json!({"code": "x", "language": "python",
        "files": {"in.txt": "not base64!"}})))
    .unwrap_err();
    assert!(
        e.to_string().starts_with("files['in.txt'] is not base64"),
        "{e}"
    );
}

#[test]
fn a_success_is_finished_with_return_code_zero() {
    let r = from_fncall(result(FnCallStatus::Success));
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v,
        json!({"status": "Success", "message": "", "compile_result": null,
            "run_result": {"status": "Finished", "execution_time": 0.0125, "return_code": 0,
                "stdout": "out", "stderr": "err"},
            "executor_pod_name": null, "files": {}})
    );
}

#[test]
fn non_zero_exits_and_signals_are_failed() {
    let mut f = result(FnCallStatus::Failed);
    f.exit_code = Some(3);
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.run_result.unwrap().return_code, Some(3));
    let mut f = result(FnCallStatus::Failed);
    f.exit_code = None;
    f.signal = Some(11);
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    let run = r.run_result.unwrap();
    assert_eq!(
        (run.status, run.return_code),
        (CommandRunStatus::Finished, Some(-11))
    );
}

#[test]
fn a_timeout_has_no_return_code_and_keeps_the_output() {
    let mut f = result(FnCallStatus::Timeout);
    f.exit_code = None;
    f.signal = Some(9);
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.message, "");
    let run = r.run_result.unwrap();
    assert_eq!(run.status, CommandRunStatus::TimeLimitExceeded);
    assert_eq!(run.return_code, None);
    assert_eq!(run.stdout.as_deref(), Some("out"));
    assert_eq!(run.execution_time, Some(0.0125));
}

#[test]
fn compile_steps() {
    // Compiled and ran.
    let mut f = result(FnCallStatus::Success);
    f.compile = Some(compile(Some(0), false));
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Success);
    let c = r.compile_result.unwrap();
    assert_eq!(
        (c.status, c.return_code),
        (CommandRunStatus::Finished, Some(0))
    );
    assert_eq!(
        (c.execution_time, c.stderr.as_deref()),
        (Some(0.3), Some("cc"))
    );
    assert!(r.run_result.is_some());
    // Did not compile: no run.
    let mut f = result(FnCallStatus::CompileError);
    f.exit_code = None;
    f.compile = Some(compile(Some(1), false));
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    assert_eq!(r.compile_result.unwrap().return_code, Some(1));
    assert!(r.run_result.is_none());
    // The compile timed out.
    let mut f = result(FnCallStatus::Timeout);
    f.compile = Some(compile(None, true));
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    let c = r.compile_result.unwrap();
    assert_eq!(
        (c.status, c.return_code),
        (CommandRunStatus::TimeLimitExceeded, None)
    );
    assert!(r.run_result.is_none());
    // Compiled, then the run timed out.
    let mut f = result(FnCallStatus::Timeout);
    f.compile = Some(compile(Some(0), false));
    let r = from_fncall(f);
    assert_eq!(r.compile_result.unwrap().status, CommandRunStatus::Finished);
    assert_eq!(
        r.run_result.unwrap().status,
        CommandRunStatus::TimeLimitExceeded
    );
}

#[test]
fn out_of_memory_is_a_failed_run() {
    let mut f = result(FnCallStatus::OutOfMemory);
    f.exit_code = None;
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::Failed);
    let run = r.run_result.unwrap();
    assert_eq!(
        (run.status, run.return_code),
        (CommandRunStatus::Finished, Some(-9))
    );
}

#[test]
fn a_sandbox_error_is_sandboxfusions() {
    let mut f = result(FnCallStatus::SandboxError);
    f.error = Some("the guest crashed".into());
    let r = from_fncall(f);
    assert_eq!(r.status, RunStatus::SandboxError);
    assert_eq!(r.message, "the guest crashed");
    let run = r.run_result.unwrap();
    assert_eq!(run.status, CommandRunStatus::Error);
    assert_eq!(run.stderr.as_deref(), Some("the guest crashed"));
    assert_eq!((run.return_code, run.execution_time), (None, None));
}

#[test]
fn fetched_files_are_passed_back() {
    let mut f = result(FnCallStatus::Success);
    f.files.insert("out.txt".into(), "aGk=".into());
    let r = from_fncall(f);
    assert_eq!(r.files["out.txt"], "aGk=");
}
