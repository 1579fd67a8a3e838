//! E2B's sandbox-port relay (`E2b-Sandbox-Id` + `E2b-Sandbox-Port`) at the
//! HTTP level, through the daemon's Unix socket: a fake sandbox's "guest
//! loopback" is the host's, so a server on 127.0.0.1 stands for one in
//! the guest. Checks streaming both ways, chunked bodies, the headers the
//! guest gets, tunnel reuse, E2B's 502s, and the code interpreter's
//! `/execute` and contexts (our `interp_server.py`, started in the sandbox
//! by the agent as the template build does).

use crate::harness::*;
use shoal_client::api::ExecRequest;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// A response: status, headers (lower-case names), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads a head (request or response): first line and headers.
fn read_head(r: &mut impl BufRead) -> Option<(String, Vec<(String, String)>)> {
    let mut first = String::new();
    if r.read_line(&mut first).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).ok()?;
        let l = l.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    Some((first.trim_end().to_string(), headers))
}

/// Reads a body framed by `headers` (chunked or Content-Length); with
/// `on_chunk`, each chunk as it comes.
fn read_body(
    r: &mut impl BufRead,
    headers: &[(String, String)],
    mut on_chunk: impl FnMut(&[u8]),
) -> Vec<u8> {
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            let n = usize::from_str_radix(l.trim().split(';').next().unwrap(), 16).unwrap();
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end).unwrap();
                return body;
            }
            let mut c = vec![0u8; n];
            r.read_exact(&mut c).unwrap();
            on_chunk(&c);
            body.extend_from_slice(&c);
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).unwrap();
        }
    }
    let n: usize = get("content-length").map_or(0, |v| v.parse().unwrap());
    body.resize(n, 0);
    r.read_exact(&mut body).unwrap();
    on_chunk(&body);
    body
}

/// An HTTP/1.1 client connection to the daemon's Unix socket.
struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Conn {
    fn open(d: &TestDaemon) -> Conn {
        let s = UnixStream::connect(d.state_dir().join("shoald.sock")).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    /// Sends a request to `port` of `sandbox` (`chunked`: the body in two
    /// chunks) and reads the reply, calling `on_chunk` per body chunk.
    fn send(
        &mut self,
        sandbox: &str,
        port: u16,
        head: &str,
        body: &[u8],
        chunked: bool,
        on_chunk: impl FnMut(&[u8]),
    ) -> Reply {
        let mut req = format!(
            "{head} HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {sandbox}\r\n\
             E2b-Sandbox-Port: {port}\r\nContent-Type: application/json\r\n"
        )
        .into_bytes();
        if chunked {
            req.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            let (a, b) = body.split_at(body.len() / 2);
            for part in [a, b] {
                req.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                req.extend_from_slice(part);
                req.extend_from_slice(b"\r\n");
            }
            req.extend_from_slice(b"0\r\n\r\n");
        } else {
            req.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            req.extend_from_slice(body);
        }
        self.w.write_all(&req).unwrap();
        let (status, headers) = read_head(&mut self.r).expect("a response");
        let status = status.split(' ').nth(1).unwrap().parse().unwrap();
        let body = read_body(&mut self.r, &headers, on_chunk);
        Reply {
            status,
            headers,
            body,
        }
    }
}

/// A keep-alive echo server on 127.0.0.1: answers each request with a
/// chunked body `METHOD TARGET\n<header names>\n<body>`; counts the TCP
/// connections it accepted.
fn echo_server() -> (u16, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let conns = Arc::new(AtomicUsize::new(0));
    let n = conns.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            n.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                while let Some((line, headers)) = read_head(&mut r) {
                    let body = read_body(&mut r, &headers, |_| {});
                    let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
                    let mut out = format!("{line}\n{}\n", names.join(",")).into_bytes();
                    out.extend_from_slice(&body);
                    let (a, b) = out.split_at(out.len() / 2);
                    let mut resp =
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Echo: 1\r\n\r\n"
                            .to_vec();
                    for part in [a, b] {
                        resp.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                        resp.extend_from_slice(part);
                        resp.extend_from_slice(b"\r\n");
                    }
                    resp.extend_from_slice(b"0\r\n\r\n");
                    if w.write_all(&resp).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, conns)
}

#[test]
fn sandbox_ports_are_relayed_with_streaming_bodies_and_reused_tunnels() {
    let d = TestDaemon::start();
    let sb = d.create();
    let (port, conns) = echo_server();
    let mut c = Conn::open(&d);

    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let r = c.send(&sb.id, port, "POST /echo?x=1", &big, true, |_| {});
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-echo"), Some("1"));
    let text = r.body;
    let (line, rest) = text.split_at(text.iter().position(|&b| b == b'\n').unwrap());
    assert_eq!(line, b"POST /echo?x=1 HTTP/1.1");
    let rest = &rest[1..];
    let (names, body) = rest.split_at(rest.iter().position(|&b| b == b'\n').unwrap());
    let names = String::from_utf8_lossy(names);
    for gone in ["e2b-sandbox-id", "e2b-sandbox-port"] {
        assert!(!names.contains(gone), "{gone} reached the guest: {names}");
    }
    assert!(names.contains("content-type"), "{names}");
    assert!(
        &body[1..] == big.as_slice(),
        "the request body was not relayed whole"
    );

    // A second request goes over the same tunnel (the pool), and a plain
    // Content-Length body works too.
    let r = c.send(&sb.id, port, "PUT /again", b"{}", false, |_| {});
    assert_eq!(r.status, 200);
    assert!(
        r.text().starts_with("PUT /again HTTP/1.1\n"),
        "{}",
        r.text()
    );
    assert!(r.text().ends_with("\n{}"), "{}", r.text());
    assert_eq!(conns.load(Ordering::SeqCst), 1, "the tunnel was not reused");
}

#[test]
fn closed_ports_and_unknown_sandboxes_answer_502_as_e2b() {
    let d = TestDaemon::start();
    let sb = d.create();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut c = Conn::open(&d);
    let r = c.send(&sb.id, port, "GET /", b"", false, |_| {});
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("port is not open"), "{}", r.text());
    let r = c.send("no-such-sandbox", port, "GET /", b"", false, |_| {});
    assert_eq!(r.status, 502);
    assert!(r.text().contains("was not found"), "{}", r.text());
}

/// The interpreter server's source in this checkout.
fn interp_server() -> String {
    format!("{}/src/e2b/interp_server.py", env!("CARGO_MANIFEST_DIR"))
}

/// The interpreter server running in a fake sandbox (a background
/// command); killed with its process group when dropped.
struct Interp<'a> {
    d: &'a TestDaemon,
    sb: String,
    cmd: String,
    port: u16,
}

impl<'a> Interp<'a> {
    /// Starts it on TCP 127.0.0.1 (`unix` false) or, as in a guest without
    /// IPv4, only on the Unix socket the agent's relay looks for
    /// (`run/shoal/ports/<port>` under the sandbox's directory, the fake
    /// agent's working directory), and waits until it is healthy.
    fn start(d: &'a TestDaemon, sb: &str, unix: bool, c: &mut Conn) -> Interp<'a> {
        let port = free_port();
        let args = if unix {
            format!("--port 0 --unix run/shoal/ports/{port}")
        } else {
            format!("--host 127.0.0.1 --port {port}")
        };
        let script = format!("exec python3 {} {args}", interp_server());
        let req = ExecRequest {
            timeout_s: Some(600.0),
            ..ExecRequest::shell(script)
        };
        let cmd = d.c.start_command(sb, &req).unwrap().id;
        let me = Interp {
            d,
            sb: sb.into(),
            cmd,
            port,
        };
        let t0 = Instant::now();
        loop {
            let r = c.send(sb, port, "GET /health", b"", false, |_| {});
            if r.status == 200 {
                break;
            }
            assert!(
                t0.elapsed() < T,
                "the interpreter never got healthy: {}",
                r.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        me
    }
}

impl Drop for Interp<'_> {
    fn drop(&mut self) {
        // Its contexts end when it does (their command pipes close).
        let _ = self
            .d
            .c
            .signal_command(&self.sb, &self.cmd, libc::SIGKILL, true);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// NDJSON events of one `/execute`.
fn execute(c: &mut Conn, sb: &str, port: u16, body: serde_json::Value) -> Vec<serde_json::Value> {
    let mut lines = 0;
    let r = c.send(
        sb,
        port,
        "POST /execute",
        body.to_string().as_bytes(),
        true,
        |chunk| lines += chunk.iter().filter(|&&b| b == b'\n').count(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let events: Vec<serde_json::Value> = r
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines, events.len());
    assert_eq!(
        events.last().unwrap()["type"],
        "end_of_execution",
        "{events:?}"
    );
    events
}

/// The printed text of an execution, in as many stdout events as its
/// writes reached the server in (print's text and its newline may come
/// apart).
fn stdout_text(ev: &[serde_json::Value]) -> String {
    of_type(ev, "stdout")
        .iter()
        .map(|e| e["text"].as_str().expect("stdout text").to_string())
        .collect()
}

fn of_type<'a>(ev: &'a [serde_json::Value], t: &str) -> Vec<&'a serde_json::Value> {
    ev.iter().filter(|e| e["type"] == t).collect()
}

#[test]
fn the_code_interpreter_serves_execute_and_contexts_through_the_relay() {
    let d = TestDaemon::start();
    let sb = d.create();
    let mut c = Conn::open(&d);
    let interp = Interp::start(&d, &sb.id, true, &mut c);
    let port = interp.port;

    // State across calls, a printed line, the last expression's value.
    let ev = execute(
        &mut c,
        &sb.id,
        port,
        serde_json::json!({"code": "x = 41", "context_id": null}),
    );
    assert!(of_type(&ev, "error").is_empty(), "{ev:?}");
    let ev = execute(
        &mut c,
        &sb.id,
        port,
        serde_json::json!({"code": "print('hello')\nx + 1"}),
    );
    assert_eq!(stdout_text(&ev), "hello\n", "{ev:?}");
    let res = of_type(&ev, "result");
    assert_eq!(res.len(), 1, "{ev:?}");
    assert_eq!(
        (res[0]["text"].as_str(), res[0]["is_main_result"].as_bool()),
        (Some("42"), Some(true))
    );

    // An exception: name, value, traceback.
    let ev = execute(&mut c, &sb.id, port, serde_json::json!({"code": "1/0"}));
    let err = of_type(&ev, "error");
    assert_eq!(err.len(), 1, "{ev:?}");
    assert_eq!(err[0]["name"], "ZeroDivisionError");
    assert_eq!(err[0]["value"], "division by zero");
    assert!(err[0]["traceback"]
        .as_str()
        .unwrap()
        .contains("ZeroDivisionError"));

    // bash, stateful.
    let ev = execute(
        &mut c,
        &sb.id,
        port,
        serde_json::json!({"code": "V=7; cd /tmp", "language": "bash"}),
    );
    assert!(of_type(&ev, "error").is_empty(), "{ev:?}");
    let ev = execute(
        &mut c,
        &sb.id,
        port,
        serde_json::json!({"code": "echo $V $PWD", "language": "bash"}),
    );
    assert_eq!(stdout_text(&ev), "7 /tmp\n", "{ev:?}");

    // Contexts: create, run in it (its own state), list, restart, remove.
    let r = c.send(
        &sb.id,
        port,
        "POST /contexts",
        br#"{"language":"python","cwd":"/tmp"}"#,
        false,
        |_| {},
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ctx: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (ctx["language"].as_str(), ctx["cwd"].as_str()),
        (Some("python"), Some("/tmp"))
    );
    let id = ctx["id"].as_str().unwrap().to_string();
    let ev = execute(
        &mut c,
        &sb.id,
        port,
        serde_json::json!({"code": "'x' in dir()", "context_id": id}),
    );
    assert_eq!(of_type(&ev, "result")[0]["text"], "False", "{ev:?}");
    let r = c.send(&sb.id, port, "GET /contexts", b"", false, |_| {});
    assert!(r.text().contains(&id), "{}", r.text());
    let r = c.send(
        &sb.id,
        port,
        &format!("POST /contexts/{id}/restart"),
        b"",
        false,
        |_| {},
    );
    assert!((200..300).contains(&r.status), "{}", r.text());
    let r = c.send(
        &sb.id,
        port,
        &format!("DELETE /contexts/{id}"),
        b"",
        false,
        |_| {},
    );
    assert!((200..300).contains(&r.status), "{}", r.text());
    let r = c.send(
        &sb.id,
        port,
        "POST /execute",
        format!(r#"{{"code":"1","context_id":"{id}"}}"#).as_bytes(),
        false,
        |_| {},
    );
    assert_eq!(r.status, 404, "{}", r.text());
}

#[test]
fn a_client_that_goes_away_interrupts_the_execution() {
    let d = TestDaemon::start();
    let sb = d.create();
    let mut c = Conn::open(&d);
    let interp = Interp::start(&d, &sb.id, false, &mut c);
    let port = interp.port;
    execute(&mut c, &sb.id, port, serde_json::json!({"code": "y = 5"}));
    // A cell that never ends, abandoned after its first line.
    let mut gone = Conn::open(&d);
    let body = br#"{"code":"while True: pass"}"#;
    let head = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {}\r\nE2b-Sandbox-Port: {port}\r\n\
         Content-Length: {}\r\n\r\n",
        sb.id,
        body.len()
    );
    gone.w.write_all(head.as_bytes()).unwrap();
    gone.w.write_all(body).unwrap();
    let (status, _) = read_head(&mut gone.r).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    drop(gone);
    // The context is interrupted (its state kept), so the next cell runs.
    let t0 = Instant::now();
    let ev = execute(&mut c, &sb.id, port, serde_json::json!({"code": "y"}));
    let res = of_type(&ev, "result");
    assert_eq!(res.len(), 1, "{ev:?}");
    assert_eq!(res[0]["text"], "5", "{ev:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "not interrupted: {:?}",
        t0.elapsed()
    );
}
