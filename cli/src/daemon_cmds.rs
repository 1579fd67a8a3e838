//! CLI commands that go through shoald: run, create, ls, exec, cp,
//! snapshot, pause, resume, rm, template, pool, stats.

use crate::daemon_client::{age, connect, table, Progress};
use crate::{ExecArgs, SandboxArgs};
use anyhow::{bail, Context, Result};
use base64::Engine;
use serde_json::{json, Value};
use shoal_client::{enc, Body, DaemonClient};
use shoald::templates::{image_template_name, RootRequest};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};

/// Options every daemon command takes.
#[derive(clap::Args, Clone, Default)]
pub struct Global {
    /// The daemon: a Unix socket path or http://HOST:PORT (token in
    /// SHOAL_TOKEN). Default: SHOAL_DAEMON, else the local one (started
    /// on demand).
    #[arg(long, global = true)]
    pub daemon: Option<String>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
}

fn pairs(v: &[String], what: &str) -> Result<BTreeMap<String, String>> {
    v.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("{what} {kv:?}: expected NAME=VALUE"))
        })
        .collect()
}

fn exec_body(e: &ExecArgs, stdin: Option<Vec<u8>>) -> Result<Value> {
    let mut b = json!({"cmd": e.command, "env": pairs(&e.env, "--env")?});
    if let Some(c) = &e.cwd {
        b["cwd"] = json!(c);
    }
    if let Some(t) = e.timeout {
        b["timeout_s"] = json!(t);
    }
    if let Some(s) = stdin {
        b["stdin_b64"] = json!(base64::engine::general_purpose::STANDARD.encode(s));
    }
    Ok(b)
}

fn decode(ev: &Value) -> Vec<u8> {
    let d = ev["data"].as_str().unwrap_or("");
    if ev["encoding"] == "base64" {
        base64::engine::general_purpose::STANDARD
            .decode(d)
            .unwrap_or_default()
    } else {
        d.as_bytes().to_vec()
    }
}

/// Streams an exec's output to ours; returns the shell-style exit code.
fn stream_exec(c: &DaemonClient, id: &str, body: &Value) -> Result<i32> {
    let mut r = c
        .request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec/stream"),
            Body::Json(serde_json::to_vec(body)?),
        )?
        .ok()?;
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    for line in BufReader::new(r.reader()).lines() {
        let ev: Value = serde_json::from_str(&line?)?;
        match ev["type"].as_str() {
            Some("stdout") => {
                out.write_all(&decode(&ev))?;
                out.flush()?;
            }
            Some("stderr") => err.write_all(&decode(&ev))?,
            Some("exit") => {
                if ev["timed_out"] == true {
                    eprintln!("shoal: command timed out; its processes were killed");
                }
                return Ok(match (ev["exit_code"].as_i64(), ev["signal"].as_i64()) {
                    (Some(c), _) => c as i32,
                    (None, Some(s)) => 128 + s as i32,
                    _ => 1,
                });
            }
            Some("error") => bail!("{}", ev["message"].as_str().unwrap_or("exec failed")),
            _ => {}
        }
    }
    bail!("the daemon closed the stream before the command ended")
}

fn read_stdin(forward: bool) -> Result<Option<Vec<u8>>> {
    if !forward {
        return Ok(None);
    }
    let mut v = Vec::new();
    std::io::stdin().lock().read_to_end(&mut v)?;
    Ok(Some(v))
}

/// Adds a root request's fields to a JSON body (only those set).
fn add_root(body: &mut Value, root: &RootRequest) -> Result<()> {
    if let (Value::Object(b), Value::Object(r)) = (body, serde_json::to_value(root)?) {
        b.extend(r);
    }
    Ok(())
}

/// The images a template of `image` with `root` boots: the image, and
/// the layers that are image names.
fn template_images(image: &str, root: &RootRequest) -> Vec<String> {
    let mut v = vec![image.to_string()];
    for l in &root.layers {
        if crate::IMAGES.contains(&l.as_str()) && !v.contains(l) {
            v.push(l.clone());
        }
    }
    v
}

/// Has the daemon make template `body["name"]` (a `POST /v1/templates`
/// body) and waits for it, showing each step. From a checkout, for a
/// daemon on this host, the guest kernel and images are built (the first
/// time: minutes, with the build's progress) and installed in the
/// foreground first, so that shoald only boots and snapshots. There is no
/// deadline: each step ends when it ends, or fails saying what failed.
/// An image template that exists is used as it is (one that failed is
/// made again, unless `explicit`: `shoal template create` of a taken
/// name is refused by the daemon).
fn ensure_template(g: &Global, c: &DaemonClient, body: &Value, explicit: bool) -> Result<Value> {
    use crate::artifacts_cmd::{build_into, build_steps, plan_build};
    use crate::progress::{elapsed, Live};
    let name = body["name"].as_str().context("a template needs a name")?;
    let image = body["image"].as_str().unwrap_or("base");
    let path = format!("/v1/templates/{name}");
    if !explicit {
        match c.call::<Value>("GET", &path, None::<&()>) {
            Ok(t) if t["state"] == "ready" => return Ok(t),
            Ok(t) if t["state"] == "failed" => {
                let _ = c.request("DELETE", &path, Body::Empty);
            }
            _ => {}
        }
    }
    let root: RootRequest = serde_json::from_value(body.clone()).unwrap_or_default();
    let images = template_images(image, &root);
    let layout = shoal_images::artifacts::Layout::default_location();
    let checkout = crate::daemon_client::is_local(g.daemon.as_deref())
        .then(|| plan_build(&layout, &images))
        .flatten();
    let mut steps = match &checkout {
        Some(_) => build_steps(&images),
        None => vec![],
    };
    steps.push("boot and snapshot".into());
    let total = steps.len();
    let live = Live::start_with_line(&format!(
        "shoal: preparing template '{name}' (once): {}",
        steps.join(", ")
    ));
    if let Some(co) = &checkout {
        build_into(co, &layout, &images, &live, 1, total)?;
    }
    let title = format!("  [{total}/{total}] template '{name}'");
    live.step(&title);
    let doing = "booting and snapshotting in shoald";
    live.detail(doing);
    let mut t: Value = match c.call("POST", "/v1/templates", Some(body)) {
        Ok(t) => t,
        // Being made by another client, or made meanwhile.
        Err(shoal_client::ClientError::Http { status: 409, .. }) if !explicit => {
            c.call("GET", &path, None::<&()>)?
        }
        Err(e) => return Err(e.into()),
    };
    while t["state"] == "building" {
        std::thread::sleep(std::time::Duration::from_millis(250));
        t = c.call("GET", &path, None::<&()>)?;
        live.detail(doing);
    }
    if t["state"] != "ready" {
        bail!(
            "template '{name}' failed: {}",
            t["error"].as_str().unwrap_or("(no reason given)")
        );
    }
    live.line(&format!(
        "{title}: ready ({})",
        elapsed(live.step_elapsed())
    ));
    Ok(t)
}

/// Has the daemon make (once) the template `POST /v1/sandboxes` with
/// `image` at this shape uses, showing each step ([`ensure_template`]).
pub fn image_template(
    g: &Global,
    c: &DaemonClient,
    img: &str,
    vcpus: u32,
    mem: u32,
    root: &RootRequest,
) -> Result<Value> {
    let mut t = json!({"name": image_template_name(img, vcpus, mem, root),
        "image": img, "vcpus": vcpus, "memory_mib": mem});
    add_root(&mut t, root)?;
    ensure_template(g, c, &t, false)
}

fn create_sandbox(
    g: &Global,
    c: &DaemonClient,
    body: &Value,
    image: Option<&str>,
    root: &RootRequest,
) -> Result<Value> {
    // The first use of an image at a shape makes its template first.
    if let Some(img) = image {
        let (vcpus, mem) = (
            body["vcpus"].as_u64().unwrap_or(1) as u32,
            body["memory_mib"].as_u64().unwrap_or(128) as u32,
        );
        image_template(g, c, img, vcpus, mem, root)?;
    }
    Ok(c.call("POST", "/v1/sandboxes", Some(body))?)
}

/// `shoal run`: a fresh sandbox through the daemon, the command, removal.
pub fn run(g: &Global, a: &SandboxArgs, e: &ExecArgs, stdin: bool) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let mut body = json!({"image": a.image, "vcpus": a.cpus, "memory_mib": a.memory,
        "metadata": {"by": "shoal run"}});
    let root = a.root.request()?;
    add_root(&mut body, &root)?;
    let sb = create_sandbox(g, &c, &body, Some(&a.image), &root)?;
    let id = sb["id"].as_str().context("no id in the reply")?.to_string();
    let res = read_stdin(stdin).and_then(|s| stream_exec(&c, &id, &exec_body(e, s)?));
    let _ = c.request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty);
    res
}

/// Options of `shoal create`.
#[derive(clap::Args, Clone)]
pub struct CreateArgs {
    /// A template name (`shoal template ls`).
    #[arg(long, conflicts_with = "image")]
    pub template: Option<String>,
    /// Or an image: tiny or base.
    #[arg(long)]
    pub image: Option<String>,
    /// vCPUs (with --image).
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Memory in MiB (with --image).
    #[arg(long)]
    pub memory: Option<u32>,
    /// Layers and upper layer (with --image; a template fixes its own).
    #[command(flatten)]
    pub root: crate::RootArgs,
    /// Kill after this many seconds.
    #[arg(long, default_value_t = 0)]
    pub ttl: u64,
    /// Pause after this many idle seconds.
    #[arg(long, default_value_t = 0)]
    pub idle_timeout: u64,
    /// Label KEY=VALUE (repeatable).
    #[arg(long = "meta", short = 'm')]
    pub meta: Vec<String>,
    /// Environment NAME=VALUE for every exec (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Never freeze it while idle (background work keeps running).
    #[arg(long)]
    pub keep_running: bool,
}

/// `shoal create`.
pub fn create(g: &Global, a: &CreateArgs) -> Result<i32> {
    let mut body = json!({"ttl_s": a.ttl, "idle_timeout_s": a.idle_timeout,
        "metadata": pairs(&a.meta, "--meta")?, "env": pairs(&a.env, "--env")?,
        "keep_running": a.keep_running});
    let root = a.root.request()?;
    match (&a.template, &a.image) {
        (Some(t), _) => {
            if !root.is_default() {
                bail!("--layer, --upper-size and --upper-disk go with --image; a template has its own");
            }
            body["template"] = json!(t)
        }
        (None, img) => {
            body["image"] = json!(img.as_deref().unwrap_or("base"));
            body["vcpus"] = json!(a.cpus.unwrap_or(1));
            body["memory_mib"] = json!(a.memory.unwrap_or(128));
            add_root(&mut body, &root)?;
        }
    }
    let img = body["image"].as_str().map(String::from);
    let c = connect(g.daemon.as_deref())?;
    let sb = create_sandbox(g, &c, &body, img.as_deref(), &root)?;
    if g.json {
        println!("{}", serde_json::to_string_pretty(&sb)?);
    } else {
        println!("{}", sb["id"].as_str().unwrap_or(""));
    }
    Ok(0)
}

/// `shoal ls`.
pub fn ls(g: &Global, state: Option<&str>, template: Option<&str>, meta: &[String]) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let mut q = Vec::new();
    if let Some(s) = state {
        q.push(format!("state={}", enc(s)));
    }
    if let Some(t) = template {
        q.push(format!("template={}", enc(t)));
    }
    if !meta.is_empty() {
        let m: Vec<String> = pairs(meta, "--meta")?
            .into_iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        q.push(format!("metadata={}", enc(&m.join(","))));
    }
    let v: Vec<Value> = c.call(
        "GET",
        &format!("/v1/sandboxes?{}", q.join("&")),
        None::<&()>,
    )?;
    if g.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let now = shoald::db::now();
    let rows: Vec<Vec<String>> = v
        .iter()
        .map(|s| {
            let meta: Vec<String> = s["metadata"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect()
                })
                .unwrap_or_default();
            vec![
                s["id"].as_str().unwrap_or("").into(),
                s["state"].as_str().unwrap_or("").into(),
                s["template"].as_str().unwrap_or("").into(),
                format!("{}/{}M", s["vcpus"], s["memory_mib"]),
                age(now - s["created_at"].as_f64().unwrap_or(now)),
                s["pid"]
                    .as_i64()
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                meta.join(","),
            ]
        })
        .collect();
    table(
        &[
            "ID", "STATE", "TEMPLATE", "CPU/MEM", "AGE", "PID", "METADATA",
        ],
        &rows,
    );
    Ok(0)
}

/// `shoal exec`.
pub fn exec(g: &Global, id: &str, e: &ExecArgs, stdin: bool) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    stream_exec(&c, id, &exec_body(e, read_stdin(stdin)?)?)
}

/// `shoal cp LOCAL ID:PATH` or `shoal cp ID:PATH LOCAL`.
pub fn cp(g: &Global, src: &str, dst: &str) -> Result<i32> {
    let remote = |s: &str| {
        s.split_once(':')
            .filter(|(id, p)| {
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) && p.starts_with('/')
            })
            .map(|(id, p)| (id.to_string(), p.to_string()))
    };
    let c = connect(g.daemon.as_deref())?;
    match (remote(src), remote(dst)) {
        (None, Some((id, path))) => {
            let mut f = std::fs::File::open(src).with_context(|| format!("cannot open {src}"))?;
            let mode = f
                .metadata()
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
                .unwrap_or(0o644);
            let r = c
                .request(
                    "PUT",
                    &format!("/v1/sandboxes/{id}/files?path={}&mode={mode:o}", enc(&path)),
                    Body::Stream(&mut f),
                )?
                .ok()?;
            let v: Value = serde_json::from_slice(&r.bytes()?)?;
            eprintln!("copied {} bytes to {id}:{path}", v["bytes"]);
        }
        (Some((id, path)), None) => {
            let mut r = c
                .request(
                    "GET",
                    &format!("/v1/sandboxes/{id}/files?path={}", enc(&path)),
                    Body::Empty,
                )?
                .ok()?;
            let tmp = format!("{dst}.shoal-partial");
            let mut f =
                std::fs::File::create(&tmp).with_context(|| format!("cannot create {tmp}"))?;
            match std::io::copy(r.reader(), &mut f) {
                Ok(n) => {
                    std::fs::rename(&tmp, dst)?;
                    eprintln!("copied {n} bytes from {id}:{path}");
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    bail!("download failed: {e}");
                }
            }
        }
        _ => bail!("exactly one of SRC and DST must be ID:/PATH (a sandbox path)"),
    }
    Ok(0)
}

fn print(g: &Global, v: &Value, short: impl FnOnce(&Value) -> String) -> Result<i32> {
    if g.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        println!("{}", short(v));
    }
    Ok(0)
}

/// `shoal pause|resume ID`.
pub fn lifecycle(g: &Global, id: &str, op: &str) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let v: Value = c.call("POST", &format!("/v1/sandboxes/{id}/{op}"), None::<&()>)?;
    print(g, &v, |v| {
        format!("{id} {}", v["state"].as_str().unwrap_or(""))
    })
}

/// `shoal rm ID...`.
pub fn rm(g: &Global, ids: &[String]) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let mut code = 0;
    for id in ids {
        match c
            .request("DELETE", &format!("/v1/sandboxes/{id}"), Body::Empty)?
            .ok()
        {
            Ok(_) => println!("{id}"),
            Err(e) => {
                eprintln!("shoal: {id}: {e}");
                code = 1;
            }
        }
    }
    Ok(code)
}

/// `shoal snapshot ID [--template NAME]`.
pub fn snapshot(g: &Global, id: &str, template: Option<&str>) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let _p = Progress::start(&format!("shoal: snapshotting {id}"));
    let v: Value = c.call(
        "POST",
        &format!("/v1/sandboxes/{id}/snapshot"),
        Some(&json!({"template": template})),
    )?;
    drop(_p);
    print(g, &v, |v| v["name"].as_str().unwrap_or("").into())
}

/// A template's upper layer in a few words.
fn upper_text(t: &Value) -> String {
    match (t["upper_disk_mib"].as_u64(), t["upper_size_mib"].as_u64()) {
        (Some(d), _) => format!("disk {d}M"),
        (None, Some(s)) => format!("tmpfs {s}M"),
        (None, None) => "tmpfs".into(),
    }
}

/// `shoal template create|ls|rm`.
pub fn template(g: &Global, op: &crate::TemplateCmd) -> Result<i32> {
    use crate::TemplateCmd as T;
    let c = connect(g.daemon.as_deref())?;
    match op {
        T::Create {
            name,
            image,
            cpus,
            memory,
            root,
        } => {
            let mut body =
                json!({"name": name, "image": image, "vcpus": cpus, "memory_mib": memory});
            add_root(&mut body, &root.request()?)?;
            let v = ensure_template(g, &c, &body, true)?;
            print(g, &v, |v| v["name"].as_str().unwrap_or("").into())
        }
        T::Ls => {
            let v: Value = c.call("GET", "/v1/templates", None::<&()>)?;
            if g.json {
                return print(g, &v, |_| String::new());
            }
            let rows: Vec<Vec<String>> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    vec![
                        t["name"].as_str().unwrap_or("").into(),
                        t["state"].as_str().unwrap_or("").into(),
                        t["source"].as_str().unwrap_or("").into(),
                        format!("{}/{}M", t["vcpus"], t["memory_mib"]),
                        upper_text(t),
                        t["layers"]
                            .as_array()
                            .map(|l| l.len().to_string())
                            .unwrap_or_else(|| "0".into()),
                    ]
                })
                .collect();
            table(
                &["NAME", "STATE", "SOURCE", "CPU/MEM", "UPPER", "LAYERS"],
                &rows,
            );
            Ok(0)
        }
        T::Rm { name } => {
            c.request("DELETE", &format!("/v1/templates/{name}"), Body::Empty)?
                .ok()?;
            println!("{name}");
            Ok(0)
        }
    }
}

/// `shoal pool set|ls|rm`.
pub fn pool(g: &Global, op: &crate::PoolCmd) -> Result<i32> {
    use crate::PoolCmd as P;
    let c = connect(g.daemon.as_deref())?;
    match op {
        P::Set { template, target } => {
            let v: Value = c.call(
                "PUT",
                &format!("/v1/pools/{template}"),
                Some(&json!({"target": target})),
            )?;
            print(g, &v, |v| {
                format!("{template}: target {} ready {}", v["target"], v["ready"])
            })
        }
        P::Ls => {
            let v: Value = c.call("GET", "/v1/pools", None::<&()>)?;
            if g.json {
                return print(g, &v, |_| String::new());
            }
            let rows: Vec<Vec<String>> = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    vec![
                        p["template"].as_str().unwrap_or("").into(),
                        p["target"].to_string(),
                        p["ready"].to_string(),
                    ]
                })
                .collect();
            table(&["TEMPLATE", "TARGET", "READY"], &rows);
            Ok(0)
        }
        P::Rm { template } => {
            c.request("DELETE", &format!("/v1/pools/{template}"), Body::Empty)?
                .ok()?;
            println!("{template}");
            Ok(0)
        }
    }
}

/// `shoal stats`.
pub fn stats(g: &Global) -> Result<i32> {
    let c = connect(g.daemon.as_deref())?;
    let v: Value = c.call("GET", "/v1/stats", None::<&()>)?;
    if g.json {
        return print(g, &v, |_| String::new());
    }
    let u = &v["usage"];
    println!("sandboxes   {}", u["by_state"]);
    println!(
        "reserved    {} vCPUs of {}, {} MiB guest memory of {}",
        u["vcpus"], v["vcpu_budget"], u["memory_mib"], v["memory_budget_mib"]
    );
    println!(
        "host        {} CPUs, {} MiB available of {} MiB, load {}",
        v["host"]["cpus"],
        v["host"]["memory_available_mib"],
        v["host"]["memory_total_mib"],
        v["host"]["load1"]
    );
    for p in v["pools"].as_array().into_iter().flatten() {
        println!(
            "pool        {} ready {}/{}",
            p["template"].as_str().unwrap_or(""),
            p["ready"],
            p["target"]
        );
    }
    Ok(0)
}
