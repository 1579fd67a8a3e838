//! `shoal bench exec`: exec round trip of `true`, stdout throughput,
//! upload/download throughput, template restore to agent-ready, and the
//! agent's own system calls per exec and per MiB (counted with strace on
//! a host-mode agent, which is stable on any host).

use super::{table, Row};
use crate::stats::{summarize, Samples};
use agent_client::{Client, ExecEvent, ExecRequest, UploadOptions};
use serde::Serialize;
use shoal_runtime::sandbox::{self, Sandbox, SandboxError, TemplateSpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Options.
#[derive(Debug, Clone)]
pub struct ExecBenchOpts {
    /// Template to restore.
    pub template: TemplateSpec,
    /// Execs of `true` timed.
    pub execs: usize,
    /// Restores timed (to agent-ready).
    pub restores: usize,
    /// Bytes for the stdout, upload and download measurements.
    pub bytes: u64,
    /// The host build of `shoal-agent` (for syscall counting); skipped
    /// with a note in the report when `None`.
    pub host_agent: Option<PathBuf>,
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct ExecReport {
    /// Always "exec".
    pub bench: &'static str,
    /// "pvm" or "hardware".
    pub host_kvm: &'static str,
    /// Always "ms".
    pub unit: &'static str,
    /// Latency rows.
    pub rows: Vec<Row>,
    /// Guest stdout to host, MB/s.
    pub stdout_mb_s: f64,
    /// Host to guest file, MB/s.
    pub upload_mb_s: f64,
    /// Guest file to host, MB/s.
    pub download_mb_s: f64,
    /// Bytes moved in each throughput test.
    pub bytes: u64,
    /// The agent's own syscalls per exec of `true` (beyond the command's
    /// clone/exec/wait), host-mode agent under strace.
    pub agent_syscalls_per_exec: Option<f64>,
    /// The agent's syscalls per MiB uploaded.
    pub agent_syscalls_per_mib_upload: Option<f64>,
    /// The agent's syscalls per MiB downloaded.
    pub agent_syscalls_per_mib_download: Option<f64>,
    /// Why syscall counts are missing, if they are.
    pub syscall_note: Option<String>,
    /// The samples behind `rows` (figures only).
    #[serde(skip)]
    pub samples: Vec<Samples>,
}

/// Times from VMM process start (`t0`) to each step of a first connection.
struct ReadyPhases {
    /// The VMM's vsock socket accepts connections.
    socket_ms: f64,
    /// The guest kernel accepted the vsock connection (`OK` to `CONNECT`).
    accepted_ms: f64,
    /// The agent answered the protocol hello: agent-ready.
    ready_ms: f64,
    /// The post-restore step (entropy, clock) answered too.
    post_restore_ms: f64,
}

fn ready_phases(sb: &Sandbox, t0: Instant) -> Result<ReadyPhases, SandboxError> {
    use std::io::{Read, Write};
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
    let deadline = t0 + Duration::from_secs(120);
    let mut s = loop {
        match std::os::unix::net::UnixStream::connect(&sb.vsock) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(SandboxError::Io(sb.vsock.clone(), e))
            }
            Err(_) => std::thread::sleep(Duration::from_micros(200)),
        }
    };
    let socket = Instant::now();
    let io = |e| SandboxError::Io(sb.vsock.clone(), e);
    s.write_all(format!("CONNECT {}\n", agent_proto::VSOCK_PORT).as_bytes())
        .map_err(io)?;
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).map_err(io)? == 1 && b[0] != b'\n' && line.len() < 64 {
        line.push(b[0]);
    }
    if !line.starts_with(b"OK") {
        return Err(SandboxError::Vmm(format!(
            "vsock CONNECT answered {:?}",
            String::from_utf8_lossy(&line)
        )));
    }
    let accepted = Instant::now();
    let c = Client::from_stream(s)?;
    let ready = Instant::now();
    c.post_restore(
        shoal_runtime::fresh::entropy(),
        shoal_runtime::fresh::unix_nanos(),
    )?;
    Ok(ReadyPhases {
        socket_ms: ms(socket),
        accepted_ms: ms(accepted),
        ready_ms: ms(ready),
        post_restore_ms: ms(Instant::now()),
    })
}

fn mb_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9)
}

fn row(metric: &str, v: &[f64]) -> Option<Row> {
    summarize(v).map(|s| Row {
        system: "shoal".into(),
        metric: metric.into(),
        n: s.n,
        min: s.min,
        median: s.median,
        p99: s.p99,
        max: s.max,
    })
}

/// Runs the benchmark.
pub fn run(o: &ExecBenchOpts, progress: &mut dyn FnMut(&str)) -> Result<ExecReport, SandboxError> {
    let tpl = sandbox::template(&o.template, progress)?;
    let (mut ready_ms, mut sock_ms, mut accept_ms, mut post_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.restores {
        let t0 = Instant::now();
        let (sb, mut child) = Sandbox::start(&tpl, false)?;
        let r = ready_phases(&sb, t0);
        sb.stop(child.as_mut());
        let p = r?;
        sock_ms.push(p.socket_ms);
        accept_ms.push(p.accepted_ms);
        ready_ms.push(p.ready_ms);
        post_ms.push(p.post_restore_ms);
    }
    progress(&format!(
        "restore to agent-ready: {} samples",
        ready_ms.len()
    ));

    let (sb, mut child) = Sandbox::start(&tpl, false)?;
    let res = measure(&sb, o, progress);
    sb.stop(child.as_mut());
    let (exec_ms, stdout_mb_s, upload_mb_s, download_mb_s) = res?;

    let (per_exec, per_up, per_down, note) = match &o.host_agent {
        Some(a) => match count_syscalls(a) {
            Ok(v) => (Some(v.0), Some(v.1), Some(v.2), None),
            Err(e) => (None, None, None, Some(e)),
        },
        None => (
            None,
            None,
            None,
            Some("host shoal-agent binary not found".into()),
        ),
    };
    let measured = [
        ("exec_true_rtt", exec_ms),
        ("restore_to_agent_ready", ready_ms),
        ("restore_to_vsock_socket", sock_ms),
        ("restore_to_guest_accept", accept_ms),
        ("restore_to_post_restore_done", post_ms),
    ];
    let rows = measured.iter().filter_map(|(m, v)| row(m, v)).collect();
    let samples = measured
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(m, v)| Samples::new("shoal", m, v))
        .collect();
    Ok(ExecReport {
        bench: "exec",
        host_kvm: vmm::host::kvm_kind().as_str(),
        unit: "ms",
        rows,
        stdout_mb_s,
        upload_mb_s,
        download_mb_s,
        bytes: o.bytes,
        agent_syscalls_per_exec: per_exec,
        agent_syscalls_per_mib_upload: per_up,
        agent_syscalls_per_mib_download: per_down,
        syscall_note: note,
        samples,
    })
}

type Measured = (Vec<f64>, f64, f64, f64);

fn measure(
    sb: &Sandbox,
    o: &ExecBenchOpts,
    progress: &mut dyn FnMut(&str),
) -> Result<Measured, SandboxError> {
    let c = sb.connect(Duration::from_secs(120), true)?;
    c.set_timeout(Some(Duration::from_secs(600)));
    let t = ExecRequest::argv(["/bin/true"]);
    c.exec_simple(&t)?;
    let mut exec_ms = Vec::with_capacity(o.execs);
    for _ in 0..o.execs {
        let t0 = Instant::now();
        c.exec_simple(&t)?;
        exec_ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    progress(&format!("{} execs of /bin/true done", o.execs));
    let cmd = format!("head -c {} /dev/zero", o.bytes);
    let t0 = Instant::now();
    let mut h = c.exec(&ExecRequest::argv(["/bin/sh", "-c", &cmd]))?;
    let mut got = 0u64;
    while let Some(ev) = h.next_event()? {
        match ev {
            ExecEvent::Stdout(d) => got += d.len() as u64,
            ExecEvent::Exit(_) => break,
            ExecEvent::Stderr(_) => {}
        }
    }
    let stdout = mb_s(got, t0.elapsed());
    // Exact on the 64-bit hosts KVM runs on.
    let data = vec![0x5au8; usize::try_from(o.bytes).unwrap_or(usize::MAX)];
    let t0 = Instant::now();
    c.upload(&mut &data[..], "/tmp/bench.bin", UploadOptions::default())?;
    let up = mb_s(o.bytes, t0.elapsed());
    let t0 = Instant::now();
    let n = c.download("/tmp/bench.bin", &mut std::io::sink())?;
    let down = mb_s(n, t0.elapsed());
    Ok((exec_ms, stdout, up, down))
}

/// (per exec, per MiB up, per MiB down) for a host-mode agent under strace.
fn count_syscalls(agent: &Path) -> Result<(f64, f64, f64), String> {
    use agent_client::syscount::{analyse, mark};
    let dir = tempfile_dir()?;
    let sock = dir.join("agent.sock");
    let trace = dir.join("trace.txt");
    let mut child = Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&trace)
        .arg(agent)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run strace (apt-get install strace): {e}"))?;
    let end = Instant::now() + Duration::from_secs(30);
    let c = loop {
        match Client::connect_unix(&sock) {
            Ok(c) => break c,
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                let _ = child.kill();
                return Err(format!("host agent did not come up: {e}"));
            }
        }
    };
    const N: usize = 100;
    const MIB: usize = 32;
    let t = ExecRequest::argv(["/bin/true"]);
    let run = || -> Result<(), agent_client::ClientError> {
        for _ in 0..5 {
            c.exec_simple(&t)?;
        }
        mark(&c, "exec-start");
        for _ in 0..N {
            c.exec_simple(&t)?;
        }
        mark(&c, "exec-end");
        let file = dir.join("up.bin");
        c.write_file(&file, b"warm", 0o644)?;
        let data = vec![7u8; MIB << 20];
        mark(&c, "upload-start");
        c.upload(&mut &data[..], &file, UploadOptions::default())?;
        mark(&c, "upload-end");
        mark(&c, "download-start");
        c.download(&file, &mut std::io::sink())?;
        mark(&c, "download-end");
        c.poweroff()
    };
    let r = run();
    let _ = child.wait();
    let text = std::fs::read_to_string(&trace).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    r.map_err(|e| e.to_string())?;
    let e = analyse(&text, "exec").ok_or("exec markers missing")?;
    let u = analyse(&text, "upload").ok_or("upload markers missing")?;
    let d = analyse(&text, "download").ok_or("download markers missing")?;
    // The command's own clone and the wait that reaps it are not the agent's cost.
    let own = |p: &agent_client::syscount::Phase| {
        let skip = ["clone", "clone3", "wait4", "waitid"];
        p.agent
            .iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .map(|(_, v)| *v)
            .sum::<usize>()
    };
    Ok((
        own(&e) as f64 / N as f64,
        u.agent_total() as f64 / MIB as f64,
        d.agent_total() as f64 / MIB as f64,
    ))
}

fn tempfile_dir() -> Result<PathBuf, String> {
    let d = std::env::temp_dir().join(format!("shoal-bench-exec-{}", std::process::id()));
    std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
    Ok(d)
}

impl ExecReport {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut s = format!("exec benchmark, host KVM: {}\n", self.host_kvm);
        s.push_str(&table(&self.rows, self.unit));
        s.push_str(&format!(
            "stdout {:.1} MB/s, upload {:.1} MB/s, download {:.1} MB/s ({} bytes each)\n",
            self.stdout_mb_s, self.upload_mb_s, self.download_mb_s, self.bytes
        ));
        match (
            self.agent_syscalls_per_exec,
            self.agent_syscalls_per_mib_upload,
            self.agent_syscalls_per_mib_download,
        ) {
            (Some(e), Some(u), Some(d)) => s.push_str(&format!(
                "agent syscalls: {e:.1} per exec, {u:.2} per MiB uploaded, {d:.2} per MiB downloaded\n"
            )),
            _ => s.push_str(&format!(
                "agent syscalls: not measured ({})\n",
                self.syscall_note.as_deref().unwrap_or("unknown")
            )),
        }
        s
    }
}
