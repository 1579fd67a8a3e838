//! FnCall on real guests: one daemon, whose per-language templates are
//! built once (python's warm runner snapshotted waiting for its call),
//! then every behaviour a reward-function caller relies on, each call in
//! a fresh clone: hello world per language, stdin, exit codes, a timeout,
//! an output flood capped, a memory hog contained, files in and out,
//! isolation between calls, a crashed guest, 100 calls in parallel and
//! malformed requests.
//!
//! One test function: one daemon, so each template boots once per test
//! binary.

#[allow(dead_code)]
mod daemon_harness;

use daemon_harness::Daemon;
use serde_json::{json, Value};
use shoal_client::api::{
    BatchItem, BatchRequest, Encoding, ErrorCode, FnCallRequest, FnCallResult, FnCallStatus,
    Language,
};
use shoal_client::Body;
use std::time::Instant;

/// The `base` image and FnCall's built-in layers installed beside `tiny`
/// (built once and cached; FnCall's templates boot them).
fn install_base() {
    use shoal_images::artifacts::{build, Layout};
    let c = build::Checkout::find().expect("the tests run from a Shoal checkout");
    c.build_and_install(
        &Layout::in_cache(),
        &[
            "tiny",
            "base",
            "fncall-python",
            "fncall-cpp",
            "fncall-nodejs",
        ],
        &mut |_| {},
        &mut build::quiet_unless_slow(),
    )
    .unwrap_or_else(|e| panic!("installing the base image: {e}"));
}

/// A call (three minutes to run unless it says otherwise: CI runs the
/// Python suites beside this test on a 2-core host whose guests are
/// emulated, and a node program that printed its line took over 60 s to
/// exit there).
fn call(d: &Daemon, mut req: Value) -> FnCallResult {
    if req.get("timeout_s").is_none() {
        req["timeout_s"] = json!(180);
    }
    let r: FnCallRequest = serde_json::from_value(req.clone()).unwrap();
    d.must(
        &format!("fncall {req}"),
        d.c.call("POST", "/v1/fncall", Some(&r)),
    )
}

fn py(d: &Daemon, code: &str) -> FnCallResult {
    call(d, json!({"language": "python", "code": code}))
}

fn ok(r: &FnCallResult) {
    assert_eq!(r.status, FnCallStatus::Success, "{r:#?}");
    assert_eq!(r.exit_code, Some(0), "{r:#?}");
}

fn b64(s: &str) -> String {
    Encoding::Base64.encode_as(s.as_bytes())
}

fn malformed_requests_are_400s(d: &Daemon) {
    let big = "x".repeat(1 << 21);
    for (body, want) in [
        (
            json!({"language": "cobol", "code": "x"}),
            "unknown language \"cobol\"",
        ),
        (json!({"language": "python", "code": big}), "code is"),
        (
            json!({"language": "python", "code": "", "files": {"a": "%%%"}}),
            "not valid base64",
        ),
        (
            json!({"language": "python", "code": "", "timeout_s": -1}),
            "timeout_s -1",
        ),
        (
            json!({"language": "python", "code": "", "compile_timeout_s": -5}),
            "compile_timeout_s -5",
        ),
        (json!({"language": "python"}), "missing field `code`"),
    ] {
        let (status, code, msg) = d.err("POST", "/v1/fncall", &body.to_string());
        assert_eq!((status, code), (400, ErrorCode::BadRequest), "{msg}");
        assert!(msg.contains(want), "{want:?} not in {msg:?}");
    }
    let (status, _, msg) = d.err(
        "POST",
        "/v1/fncall/batch",
        &json!({"calls": [], "concurrency": 0}).to_string(),
    );
    assert_eq!(status, 400, "{msg}");
    assert!(msg.contains("concurrency 0"), "{msg}");
}

fn python(d: &Daemon) {
    let t = Instant::now();
    let r = py(d, "print('hello world')");
    ok(&r);
    assert_eq!(r.stdout, "hello world\n");
    eprintln!("first python call (template built): {:?}", t.elapsed());
    let r = py(d, "print('hello again')");
    ok(&r);
    // numpy, from the python layer, imported in the template already.
    let r = py(
        d,
        "import sys, numpy\nprint('numpy' in sys.modules, numpy.arange(4).sum())",
    );
    ok(&r);
    assert_eq!(r.stdout, "True 6\n");
    eprintln!(
        "python call: total {:.0} ms, run {:.0} ms",
        r.total_ms, r.duration_ms
    );

    // stdin, the standard library, args, env, an exit code.
    let r = call(
        d,
        json!({"language": "python",
            "code": "import sys, os, json, collections\n\
                     data = sys.stdin.read()\n\
                     print(json.dumps([data.upper(), sys.argv[1:], os.environ['WHO']]))\n\
                     print(input.__name__, file=sys.stderr)\n\
                     sys.exit(3)",
            "stdin": "abc\n", "args": ["x", "y"], "env": {"WHO": "me"}}),
    );
    assert_eq!(r.status, FnCallStatus::Failed, "{r:#?}");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.stdout, "[\"ABC\\n\", [\"x\", \"y\"], \"me\"]\n", "{r:#?}");
    assert_eq!(r.stderr, "input\n");
    let r = call(
        d,
        json!({"language": "python", "code": "for line in iter(input, 'end'): print(int(line) * 2)",
            "stdin": "1\n2\nend\n"}),
    );
    ok(&r);
    assert_eq!(r.stdout, "2\n4\n");

    // An uncaught exception: exit 1, the traceback as python3 prints it.
    let r = py(d, "def f():\n    return 1 / 0\nf()\n");
    assert_eq!((r.status, r.exit_code), (FnCallStatus::Failed, Some(1)));
    assert!(r.stderr.starts_with("Traceback"), "{}", r.stderr);
    assert!(r.stderr.contains("ZeroDivisionError"), "{}", r.stderr);
    assert!(r.stderr.contains("return 1 / 0"), "{}", r.stderr);
    assert!(!r.stderr.contains("runner"), "{}", r.stderr);
    let r = py(d, "def f(:\n");
    assert_eq!(r.exit_code, Some(1));
    assert!(r.stderr.contains("SyntaxError"), "{}", r.stderr);

    // A timeout kills the clone.
    let t = Instant::now();
    let r = call(
        d,
        json!({"language": "python", "code": "print('start', flush=True)\nwhile True: pass",
            "timeout_s": 1}),
    );
    assert_eq!(r.status, FnCallStatus::Timeout, "{r:#?}");
    assert_eq!((r.exit_code, r.signal), (None, None));
    assert_eq!(r.stdout, "start\n");
    assert!(t.elapsed().as_secs() < 30, "{:?}", t.elapsed());

    // An output flood, capped and flagged.
    let r = call(
        d,
        json!({"language": "python",
            "code": "import sys\nfor i in range(5000): sys.stdout.write('x' * 99 + '\\n')\n\
                     sys.stderr.write('e' * 10)",
            "output_limit": 1000}),
    );
    ok(&r);
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated && !r.stderr_truncated, "{r:#?}");
    assert_eq!(r.stderr, "e".repeat(10));

    // A memory hog is stopped at its limit in its guest (an allocation past
    // it fails at once); the next call is unharmed. (Each page a guest
    // touches first is slow on PVM hosts: small allocations, long timeouts.)
    let r = call(
        d,
        json!({"language": "python", "code": "x = bytearray(100 << 20)\nprint('survived')",
            "memory_mib": 48}),
    );
    assert_eq!(r.status, FnCallStatus::OutOfMemory, "{r:#?}");
    assert_eq!(r.exit_code, Some(1));
    assert!(r.stderr.contains("MemoryError"), "{r:#?}");
    assert_eq!(r.stdout, "");
    let r = call(
        d,
        json!({"language": "python", "code": "x = bytearray(2 << 20)\nprint(len(x) >> 20)",
            "memory_mib": 48, "timeout_s": 120}),
    );
    ok(&r);
    assert_eq!(r.stdout, "2\n");

    // Files in and out (relative paths are the call's working directory).
    let r = call(
        d,
        json!({"language": "python",
            "code": "import helper\nopen('out.txt', 'w').write(open('data/in.txt').read()[::-1])\n\
                     open('/tmp/abs.bin', 'wb').write(bytes(range(256)))\nprint(helper.X)",
            "files": {"data/in.txt": b64("abc"), "helper.py": b64("X = 42\n")},
            "fetch_files": ["out.txt", "/tmp/abs.bin", "missing.txt"]}),
    );
    ok(&r);
    assert_eq!(r.stdout, "42\n");
    assert_eq!(r.files.len(), 2, "{:?}", r.files.keys());
    assert_eq!(r.files["out.txt"], b64("cba"));
    let bin = Encoding::Base64.decode(&r.files["/tmp/abs.bin"]).unwrap();
    assert_eq!(bin, (0..=255u8).collect::<Vec<u8>>());

    // Isolation: a file, an environment variable, a background process, a
    // module global and the random state of one call are not the next's.
    let leave = "import os, json, subprocess, random\n\
        open('/tmp/left', 'w').write('x')\nos.environ['LEFT'] = '1'\n\
        subprocess.Popen(['sleep', '1000'])\njson.LEFT = 1\nprint(random.random())";
    let look = "import os, json, random\n\
        procs = [open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()]\n\
        print(os.path.exists('/tmp/left'), 'LEFT' in os.environ, \
        any(c.startswith('sleep') for c in procs), hasattr(json, 'LEFT'))\nprint(random.random())";
    let a = py(d, leave);
    ok(&a);
    let b = py(d, look);
    ok(&b);
    let lines: Vec<&str> = b.stdout.lines().collect();
    assert_eq!(lines[0], "False False False False", "{b:#?}");
    assert_ne!(
        a.stdout.trim(),
        lines[1],
        "each clone reseeds its random state"
    );
}

fn bash(d: &Daemon) {
    let r = call(d, json!({"language": "bash", "code": "echo hello world"}));
    ok(&r);
    assert_eq!(r.stdout, "hello world\n");
    let r = call(
        d,
        json!({"language": "bash", "code": "read x; echo \"got $x $1 $FOO\" >&2; exit 7",
            "stdin": "line\n", "args": ["arg1"], "env": {"FOO": "bar"}}),
    );
    assert_eq!(
        (r.status, r.exit_code),
        (FnCallStatus::Failed, Some(7)),
        "{r:#?}"
    );
    assert_eq!(r.stderr, "got line arg1 bar\n");
    let r = call(
        d,
        json!({"language": "bash", "code": "sleep 100", "timeout_s": 1}),
    );
    assert_eq!(r.status, FnCallStatus::Timeout, "{r:#?}");
}

/// cpp and nodejs run when this build has their layer images; without
/// them a call says so (sandbox_error naming the layer).
fn compiled_and_node(d: &Daemon, langs: &[Language]) {
    let cases = [
        (
            "cpp",
            "#include <cstdio>\nint main(){char s[16]; if (scanf(\"%15s\", s) != 1) return 1; \
             printf(\"hello %s\\n\", s); return 4;}",
        ),
        (
            "nodejs",
            "const s = require('fs').readFileSync(0, 'utf8').trim();\n\
             console.log('hello ' + s); process.exit(4);",
        ),
    ];
    for (lang, code) in cases {
        let l = langs.iter().find(|l| l.name == lang).unwrap();
        // (g++ is slow on emulated guest kernels: a long compile timeout.)
        let r = call(
            d,
            json!({"language": lang, "code": code, "stdin": "you\n",
                   "compile_timeout_s": 280, "timeout_s": 300}),
        );
        match &l.error {
            None => {
                assert_eq!(
                    (r.status, r.exit_code),
                    (FnCallStatus::Failed, Some(4)),
                    "{r:#?}"
                );
                assert_eq!(r.stdout, "hello you\n", "{r:#?}");
            }
            Some(e) => {
                assert_eq!(r.status, FnCallStatus::SandboxError, "{r:#?}");
                assert!(
                    r.error.as_deref().unwrap_or("").contains(e.as_str()),
                    "{r:#?}"
                );
                eprintln!("{lang}: not in this build: {e}");
            }
        }
    }
    // (A compile error's `compile_error` status and compiler output are
    // checked through the stock SandboxFusion client, cpp, in
    // sdk/python/tests/test_sandbox_fusion.py: one g++ run less here,
    // ~1 min of emulated guest kernel on PVM hosts.)
}

/// A guest that dies mid-call (its VMM killed, as a guest kernel crash
/// ends it) is a `sandbox_error` at once, not a wait for the timeout.
fn crashed_guest(d: &Daemon) {
    daemon_harness::wait_for("earlier clones to go", 30, || d.vmms().is_empty());
    let t = Instant::now();
    let r = std::thread::scope(|s| {
        let h = s.spawn(|| {
            call(
                d,
                json!({"language": "python",
                    "code": "import time\nprint('up', flush=True)\ntime.sleep(300)",
                    "timeout_s": 300}),
            )
        });
        daemon_harness::wait_for("the call's clone", 60, || !d.vmms().is_empty());
        // Running the program by now (a second for the attach).
        std::thread::sleep(std::time::Duration::from_secs(3));
        for p in d.vmms() {
            // SAFETY: kill(2) on a pid this test's daemon started.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
        h.join().unwrap()
    });
    assert_eq!(r.status, FnCallStatus::SandboxError, "{r:#?}");
    assert!(r.error.is_some(), "{r:#?}");
    assert!(t.elapsed().as_secs() < 90, "{:?}", t.elapsed());
}

fn hundred_in_parallel(d: &Daemon) {
    let calls: Vec<FnCallRequest> = (0..100)
        .map(|i| FnCallRequest {
            language: "python".into(),
            code: format!("import sys\nprint({i} * {i}, sys.stdin.read())"),
            stdin: Some(format!("in{i}")),
            // All hundred at once on two cores of emulated guest kernels:
            // each may wait minutes for its turn.
            timeout_s: Some(300.0),
            ..Default::default()
        })
        .collect();
    let req = BatchRequest {
        calls,
        // At most 20 at once: on a 2-core host of emulated guest kernels a
        // hundred at once overloaded it (load average 51; one clone's agent
        // was not reached in 300 s).
        concurrency: Some(20),
    };
    let t = Instant::now();
    let body = serde_json::to_vec(&req).unwrap();
    let r = d.must(
        "batch",
        d.c.request("POST", "/v1/fncall/batch", Body::Json(body))
            .and_then(|r| r.ok()),
    );
    let bytes = d.must("batch body", r.bytes());
    let items: Vec<BatchItem> = std::str::from_utf8(&bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(items.len(), 100);
    let mut seen = [false; 100];
    for it in &items {
        ok(&it.result);
        let i = it.index;
        assert_eq!(it.result.stdout, format!("{} in{i}\n", i * i));
        assert!(!seen[i], "index {i} twice");
        seen[i] = true;
    }
    eprintln!("100 python calls in parallel: {:?}", t.elapsed());
}

/// Runs one part of the test and says how long it took (on stderr: shown
/// when the test fails, and with `--nocapture`).
fn timed(what: &str, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    eprintln!("fncall test: {what}: {:.1} s", t.elapsed().as_secs_f64());
}

#[test]
fn fncall_on_real_guests() {
    install_base();
    // A crowded test host: keep less disk free than a production daemon,
    // and allow minutes to reach an agent (a hundred clones
    // restored at once on two cores with emulated guest kernels can take
    // longer than that).
    let d = Daemon::start(&[
        "--no-pools",
        "--min-free-disk-mib",
        "256",
        "--agent-timeout",
        "300",
    ]);
    let langs: Vec<Language> = d.must(
        "languages",
        d.c.call("GET", "/v1/fncall/languages", None::<&()>),
    );
    let names: Vec<&str> = langs.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["python", "bash", "cpp", "nodejs"]);
    assert!(langs[0].warm && !langs[0].ready);
    malformed_requests_are_400s(&d);
    timed("python", || python(&d));
    timed("bash", || bash(&d));
    timed("cpp and nodejs", || compiled_and_node(&d, &langs));
    timed("a crashed guest", || crashed_guest(&d));
    timed("100 calls", || hundred_in_parallel(&d));
    let langs: Vec<Language> = d.must(
        "languages",
        d.c.call("GET", "/v1/fncall/languages", None::<&()>),
    );
    assert!(langs[0].ready && langs[0].template.is_some(), "{langs:?}");
    // Every clone is gone.
    daemon_harness::wait_for("the clones to be removed", 30, || d.vmms().is_empty());
}
