//! A small HTTP proxy in front of the test registry: it asks for Basic or
//! Bearer auth (and serves the Bearer tokens itself, at `/token`), logs
//! what it is asked, and can cut one blob's answer halfway, as a registry
//! that dies mid-pull.

#![allow(dead_code)]

use base64::Engine;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The token `/token` issues.
pub const TOKEN: &str = "test-token-7f3a";
/// The `service` of the Bearer challenge.
pub const SERVICE: &str = "test-registry";

/// What the proxy asks of a client.
#[derive(Clone)]
pub enum Mode {
    /// Nothing.
    Open,
    /// `WWW-Authenticate: Basic`: these credentials on every request.
    Basic(String, String),
    /// `WWW-Authenticate: Bearer`: the token `/token` issues, which asks
    /// for these Basic credentials when given.
    Bearer(Option<(String, String)>),
}

/// What the proxy saw and does.
pub struct State {
    mode: Mode,
    upstream: u16,
    port: u16,
    /// A blob digest whose next GET is cut halfway.
    pub cut: Mutex<Option<String>>,
    /// Requests: `METHOD PATH AUTHORIZATION`.
    pub log: Mutex<Vec<String>>,
    /// Queries of `/token` that issued a token.
    pub tokens: Mutex<Vec<String>>,
    /// 401 answers given.
    pub unauthorized: AtomicUsize,
}

/// A running proxy (its threads end with the test process).
pub struct Proxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// What it saw.
    pub state: Arc<State>,
}

fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

impl Proxy {
    /// Starts one in front of the registry on `upstream`.
    pub fn start(upstream: u16, mode: Mode) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(State {
            mode,
            upstream,
            port,
            cut: Mutex::new(None),
            log: Mutex::new(Vec::new()),
            tokens: Mutex::new(Vec::new()),
            unauthorized: AtomicUsize::new(0),
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = serve(&s, c);
                });
            }
        });
        Proxy { port, state }
    }

    /// `127.0.0.1:PORT/NAME`.
    pub fn reference(&self, name: &str) -> String {
        format!("127.0.0.1:{}/{name}", self.port)
    }
}

fn respond(
    c: &mut TcpStream,
    code: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.write_all(head.as_bytes())?;
    c.write_all(body)
}

fn serve(s: &State, mut c: TcpStream) -> std::io::Result<()> {
    let mut r = BufReader::new(c.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let mut auth = String::new();
    let mut accept = String::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "authorization" => auth = v.trim().to_string(),
                "accept" => accept = v.trim().to_string(),
                _ => {}
            }
        }
    }
    s.log
        .lock()
        .unwrap()
        .push(format!("{method} {target} {auth}"));
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    if path == "/token" {
        let Mode::Bearer(creds) = &s.mode else {
            return respond(&mut c, 404, &[], b"");
        };
        if let Some((u, p)) = creds {
            if auth != basic(u, p) {
                s.unauthorized.fetch_add(1, Ordering::SeqCst);
                return respond(&mut c, 401, &[], b"{\"details\":\"bad credentials\"}");
            }
        }
        s.tokens.lock().unwrap().push(query.to_string());
        let body = format!("{{\"token\":\"{TOKEN}\",\"expires_in\":300}}");
        return respond(
            &mut c,
            200,
            &[("Content-Type", "application/json".into())],
            body.as_bytes(),
        );
    }
    let challenge = match &s.mode {
        Mode::Open => None,
        Mode::Basic(u, p) => (auth != basic(u, p)).then(|| "Basic realm=\"test\"".to_string()),
        Mode::Bearer(_) => (auth != format!("Bearer {TOKEN}")).then(|| {
            // The repository: /v2/<repo>/(manifests|blobs)/...
            let repo = path
                .strip_prefix("/v2/")
                .and_then(|p| p.rsplit_once("/manifests/").or_else(|| p.rsplit_once("/blobs/")))
                .map(|(r, _)| r.to_string())
                .unwrap_or_default();
            format!(
                "Bearer realm=\"http://127.0.0.1:{}/token\",service=\"{SERVICE}\",scope=\"repository:{repo}:pull\"",
                s.port
            )
        }),
    };
    if let Some(ch) = challenge {
        s.unauthorized.fetch_add(1, Ordering::SeqCst);
        return respond(
            &mut c,
            401,
            &[
                ("WWW-Authenticate", ch),
                ("Content-Type", "application/json".into()),
            ],
            b"{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}",
        );
    }
    let url = format!("http://127.0.0.1:{}{target}", s.upstream);
    let mut req = ureq::get(&url);
    if !accept.is_empty() {
        req = req.set("Accept", &accept);
    }
    let (code, resp) = match req.call() {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => return respond(&mut c, 502, &[], e.to_string().as_bytes()),
    };
    let mut headers = vec![("Content-Type", resp.content_type().to_string())];
    if let Some(d) = resp.header("docker-content-digest") {
        headers.push(("Docker-Content-Digest", d.to_string()));
    }
    let mut body = Vec::new();
    resp.into_reader().read_to_end(&mut body)?;
    let cut = {
        let mut g = s.cut.lock().unwrap();
        let hit = g
            .as_deref()
            .is_some_and(|d| path.ends_with(&format!("/blobs/{d}")));
        if hit {
            *g = None;
        }
        hit
    };
    if cut {
        // The whole length promised, half of it sent, then gone.
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes())?;
        c.write_all(&body[..body.len() / 2])?;
        c.flush()?;
        return c.shutdown(std::net::Shutdown::Both);
    }
    respond(&mut c, code, &headers, &body)
}
