//! `shoal bench net` (issue 18): a networked Shoal sandbox and QEMU
//! `-M microvm` on a TAP (the peer: our kernel and `tiny` image) talk to
//! the same test host in one run (see [`crate::bench_net_host`]): a guest
//! downloads N MiB over HTTP (busybox `wget`), makes request round trips
//! over one TCP connection (`nc -e /bin/cat` echoing the host's requests),
//! and opens many short HTTP connections (one `wget` process fetching many
//! URLs): throughput, request latency and connections per second, each
//! measured on the host side. Shoal's traffic crosses its slot (nftables
//! policy, conntrack, NAT) and the host's routing; QEMU's TAP is in the
//! test host's namespace. Then the create latency of plain and networked
//! sandboxes, interleaved, from the same private shoald.
//!
//! On PVM hosts every guest figure is bound by the emulated guest kernel
//! (each packet's interrupt, copy and TCP work run ~1000x slower than on
//! hardware), for both systems alike.
//!
//! Needs root (netns, veth, TAP, nftables), KVM and `qemu-system-x86_64`
//! (unless `--no-qemu`). Everything made is removed at the end: the
//! sandboxes, the private daemon and its VMMs, its slots, the QEMU
//! process, the test host's namespace, veth and TAP.

use crate::bench::{Output, PrivateDaemon};
use crate::bench_net_host::{Event, TestHost, ECHO_PORT, HTTP_PORT, MSG};
use crate::bench_net_qemu::QemuPeer;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use shoal_bench::plot::{self, Bar, Out, PlotError, Series};
use shoal_bench::stats::{summarize, Summary};
use shoal_client::api::{CreateSandbox, ExecRequest, NetworkSpec};
use shoal_client::DaemonClient;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `shoal bench net` options.
#[derive(clap::Args, Clone)]
pub struct NetArgs {
    /// MiB per timed download.
    #[arg(long, default_value_t = 4)]
    pub bulk_mib: u64,
    /// Timed downloads per system.
    #[arg(long, default_value_t = 3)]
    pub downloads: usize,
    /// Timed request round trips per system (64-byte requests and answers).
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Short connections per system (connections per second).
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Plain and networked creates timed (interleaved, each killed before
    /// the next).
    #[arg(long, default_value_t = 20)]
    pub creates: usize,
    /// The QEMU peers (comma-separated): `default` (QEMU's virtio-net
    /// with its checksum and segmentation offloads), `no-offload` (MAC
    /// and link status only: no offloads, mergeable buffers or event
    /// index); each boots once.
    #[arg(long, default_value = "default,no-offload")]
    pub qemu: String,
    /// Skip the QEMU peers.
    #[arg(long)]
    pub no_qemu: bool,
    /// Extra arguments of the private shoald.
    #[arg(long, default_value = "")]
    pub daemon_args: String,
    /// Where to write the JSON report (figures beside it, or in --plot).
    #[arg(long = "out", default_value = "bench-net.json")]
    pub out: PathBuf,
}

/// One system's traffic figures (all measured by the test host).
#[derive(Debug, Clone, Serialize)]
pub struct Traffic {
    /// "shoal", "qemu-microvm" or "qemu-no-offload".
    pub system: String,
    /// Each timed download's throughput (MiB/s).
    pub download_mib_s: Vec<f64>,
    /// Their summary.
    pub download: Option<Summary>,
    /// Request round trips (ms).
    #[serde(skip)]
    pub request_ms: Vec<f64>,
    /// Their summary (ms).
    pub request: Option<Summary>,
    /// Short connections accepted per second (first to last accept).
    pub connections_per_s: Option<f64>,
    /// Connections counted.
    pub connections: usize,
}

/// Create latency with and without a network (ms).
#[derive(Debug, Clone, Serialize)]
pub struct Creates {
    /// Plain creates (from the warm pool / VMM stock).
    pub plain: Option<Summary>,
    /// Networked creates.
    pub networked: Option<Summary>,
    /// Networked p50 minus plain p50 (ms).
    pub added_p50_ms: Option<f64>,
    #[serde(skip)]
    plain_ms: Vec<f64>,
    #[serde(skip)]
    networked_ms: Vec<f64>,
}

/// One goal of the issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    /// What.
    pub goal: String,
    /// The measured value.
    pub value: f64,
    /// Met.
    pub met: bool,
}

/// The JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct NetReport {
    /// Always "net".
    pub bench: &'static str,
    /// "pvm", "vmx", "svm".
    pub host_kvm: String,
    /// Bytes per timed download.
    pub bulk_bytes: u64,
    /// Bytes per request and per answer.
    pub request_bytes: usize,
    /// Shoal, then the peer.
    pub traffic: Vec<Traffic>,
    /// Create latency.
    pub creates: Creates,
    /// Shoal / each QEMU peer ("PEER FIGURE"; throughput and
    /// connections: higher is better; request p50: lower is better).
    pub ratio_shoal_over_qemu: Vec<(String, f64)>,
    /// The goals.
    pub goals: Vec<Goal>,
    /// How to read it.
    pub notes: Vec<String>,
}

/// The guest's script (both systems): a warm-up download, the timed
/// downloads, the request exchange, the short connections.
fn script(a: &NetArgs) -> String {
    let url = |p: &str| format!("http://@HOST@:{HTTP_PORT}{p}");
    let conns = vec![url("/c"); a.connections].join(" ");
    format!(
        "set -e\n\
         wget -q -O /dev/null {warm}\n\
         i=0; while [ $i -lt {n} ]; do wget -q -O /dev/null {bulk}; i=$((i+1)); done\n\
         nc @HOST@ {ECHO_PORT} -e /bin/cat\n\
         {fetch}\n\
         echo net-bench-done\n",
        warm = url("/warm/65536"),
        n = a.downloads,
        bulk = url(&format!("/bulk/{}", a.bulk_mib << 20)),
        fetch = if a.connections > 0 {
            format!("wget -q -O /dev/null {conns}")
        } else {
            String::new()
        },
    )
}

/// What a guest's run left in the test host's records.
fn traffic(system: &str, events: Vec<Event>) -> Traffic {
    let mut t = Traffic {
        system: system.into(),
        download_mib_s: vec![],
        download: None,
        request_ms: vec![],
        request: None,
        connections_per_s: None,
        connections: 0,
    };
    let mut conns = vec![];
    for e in events {
        match e {
            Event::Bulk { bytes, secs } if secs > 0.0 => {
                t.download_mib_s
                    .push(bytes as f64 / f64::from(1 << 20) / secs);
            }
            Event::Bulk { .. } => {}
            Event::Conn(at) => conns.push(at),
            Event::Rtts(v) => t.request_ms.extend(v),
        }
    }
    conns.sort();
    t.connections = conns.len();
    if let (Some(first), Some(last)) = (conns.first(), conns.last()) {
        let secs = last.duration_since(*first).as_secs_f64();
        if conns.len() > 1 && secs > 0.0 {
            t.connections_per_s = Some((conns.len() - 1) as f64 / secs);
        }
    }
    t.download = summarize(&t.download_mib_s);
    t.request = summarize(&t.request_ms);
    t
}

fn network(host: &TestHost) -> NetworkSpec {
    NetworkSpec {
        allow_out: vec![format!("{}/32", host.addr)],
        deny_out: vec![],
        allow_dns: false,
    }
}

fn tiny(net: Option<NetworkSpec>) -> CreateSandbox {
    CreateSandbox {
        vcpus: Some(1),
        memory_mib: Some(128),
        network: net,
        ..CreateSandbox::from_image("tiny")
    }
}

/// The Shoal side of the traffic: one networked sandbox runs the script.
fn shoal_traffic(c: &DaemonClient, host: &TestHost, ids: &mut Vec<String>) -> Result<Traffic> {
    let sb = c.create(&tiny(Some(network(host))))?;
    ids.push(sb.id.clone());
    eprintln!(
        "shoal: sandbox {} at {:?} runs the script",
        sb.id, sb.guest_addr
    );
    let _ = host.take_events();
    let run = format!(
        "wget -q -O /tmp/s http://{}:{HTTP_PORT}/script && sh /tmp/s",
        host.addr
    );
    let r = c.exec(&sb.id, &ExecRequest::shell(run).with_timeout(900.0))?;
    if r.exit_code != Some(0) {
        bail!(
            "the script failed in the sandbox: {:?}\n{}{}",
            r.exit_code,
            r.stdout,
            r.stderr
        );
    }
    let t = traffic("shoal", host.take_events());
    let _ = c.kill(&sb.id);
    ids.retain(|i| *i != sb.id);
    Ok(t)
}

/// Plain and networked creates, interleaved, each killed before the next
/// (the pools refill between, as at a steady rate).
fn creates(c: &DaemonClient, host: &TestHost, n: usize, ids: &mut Vec<String>) -> Result<Creates> {
    let mut one = |net: Option<NetworkSpec>| -> Result<f64> {
        let t = Instant::now();
        let sb = c.create(&tiny(net))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        ids.push(sb.id.clone());
        c.kill(&sb.id)?;
        ids.pop();
        Ok(ms)
    };
    // Both templates and pools ready first (the daemon answers 504 while
    // a template boots, which can take minutes on a loaded PVM host).
    let end = Instant::now() + Duration::from_secs(900);
    for net in [None, Some(network(host))] {
        loop {
            match one(net.clone()) {
                Err(e) if Instant::now() < end && is_building(&e) => {}
                r => break r.map(drop)?,
            }
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let (mut plain, mut networked) = (vec![], vec![]);
    for i in 0..n {
        plain.push(one(None)?);
        std::thread::sleep(Duration::from_millis(500));
        networked.push(one(Some(network(host)))?);
        std::thread::sleep(Duration::from_millis(500));
        eprintln!(
            "create {}/{n}: plain {:.1} ms, networked {:.1} ms",
            i + 1,
            plain[i],
            networked[i]
        );
    }
    let (p, q) = (summarize(&plain), summarize(&networked));
    Ok(Creates {
        added_p50_ms: p.as_ref().zip(q.as_ref()).map(|(p, q)| q.median - p.median),
        plain: p,
        networked: q,
        plain_ms: plain,
        networked_ms: networked,
    })
}

fn is_building(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<shoal_client::ClientError>(),
        Some(shoal_client::ClientError::Api { status: 504, .. })
    )
}

/// Removes what a daemon with these prefixes may have left: its slots'
/// namespaces and host-side links.
fn sweep(netns_prefix: &str, link_prefix: &str) {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for n in out.lines().filter_map(|l| l.split_whitespace().next()) {
        if n.starts_with(netns_prefix) {
            eprintln!("removing the slot namespace {n} left behind");
            let _ = crate::bench_net_host::ip(&["netns", "del", n]);
        }
    }
    let out = std::process::Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for l in out.lines() {
        let name = l.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if name.starts_with(link_prefix) {
            let _ = crate::bench_net_host::ip(&["link", "del", name]);
        }
    }
}

/// Runs it.
pub fn run(g: &crate::daemon_cmds::Global, a: &NetArgs, out: &Output) -> Result<()> {
    if g.daemon.is_some() {
        bail!(
            "bench net runs a private shoald (its slots and sandboxes are its own): drop --daemon"
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench net needs root (network namespaces, veths, TAPs, nftables)");
    }
    if a.bulk_mib == 0 || a.bulk_mib << 20 > crate::bench_net_host::BULK_CAP || a.downloads == 0 {
        bail!("--bulk-mib must be 1 to 1024 and --downloads at least 1");
    }
    let tag = std::process::id() % 10_000;
    let host = TestHost::new(tag, a.requests)?;
    host.set_script(&script(a));
    let (netns_prefix, link_prefix) = (format!("shnb{tag}-"), format!("shvb{tag}x"));
    let args = format!(
        "--net --net-slots 2 --net-dns off --net-pool 10.215.{}.0/24 \
         --net-netns-prefix {netns_prefix} --net-link-prefix {link_prefix} {}",
        tag % 250,
        a.daemon_args
    );
    let (c, daemon) = PrivateDaemon::start("net", &args)?;
    let mut ids = vec![];
    let res = (|| -> Result<(Vec<Traffic>, Creates)> {
        crate::daemon_cmds::image_template(g, &c, "tiny", 1, 128, &Default::default())?;
        eprintln!("create latency: {} plain and networked creates", a.creates);
        let cr = creates(&c, &host, a.creates, &mut ids)?;
        let mut t = vec![shoal_traffic(&c, &host, &mut ids)?];
        for offloads in qemu_variants(a)? {
            let peer = QemuPeer {
                kernel: shoal_images::artifacts::kernel()?,
                root: crate::image_path("tiny")?,
                cmdline: shoal_images::artifacts::base_cmdline(),
                kernel_args: qemu_kernel_args()?,
                timeout: Duration::from_secs(900),
                offloads,
            };
            eprintln!(
                "{}: booting the peer on a TAP (~20 s on PVM hosts)",
                peer.name()
            );
            let _ = host.take_events();
            peer.run(&host, &mut |l| eprintln!("{l}"))?;
            t.push(traffic(peer.name(), host.take_events()));
        }
        Ok((t, cr))
    })();
    for id in &ids {
        let _ = c.kill(id);
    }
    drop(daemon);
    sweep(&netns_prefix, &link_prefix);
    drop(host);
    let (traffic, creates) = res?;
    let report = report(a, traffic, creates);
    out.emit(&report.render(), &report, figures)
}

/// The QEMU peers asked for: with offloads (true) and/or without.
fn qemu_variants(a: &NetArgs) -> Result<Vec<bool>> {
    if a.no_qemu {
        return Ok(vec![]);
    }
    a.qemu
        .split(',')
        .map(|v| match v.trim() {
            "default" => Ok(true),
            "no-offload" => Ok(false),
            o => bail!("--qemu: unknown peer {o:?} (default, no-offload)"),
        })
        .collect()
}

/// QEMU's guest boots with the CPU profile's words, except the
/// clocksource (as in `shoal bench boot`: QEMU's guests are never
/// restored, and with kvm-clock one idled without finishing its boot).
fn qemu_kernel_args() -> Result<String> {
    Ok(vmm::vm::profile_kernel_args(None)
        .context("the CPU profile's kernel words")?
        .split_whitespace()
        .filter(|w| !w.starts_with("clocksource="))
        .collect::<Vec<_>>()
        .join(" "))
}

fn report(a: &NetArgs, traffic: Vec<Traffic>, creates: Creates) -> NetReport {
    let mut ratios = vec![];
    let mut goals = vec![];
    let shoal = traffic.iter().find(|t| t.system == "shoal");
    for q in traffic.iter().filter(|t| t.system != "shoal") {
        let Some(s) = shoal else { break };
        let pairs = [
            (
                "download_mib_s_p50",
                s.download.as_ref().map(|x| x.median),
                q.download.as_ref().map(|x| x.median),
            ),
            (
                "request_ms_p50",
                s.request.as_ref().map(|x| x.median),
                q.request.as_ref().map(|x| x.median),
            ),
            (
                "connections_per_s",
                s.connections_per_s,
                q.connections_per_s,
            ),
        ];
        for (name, x, y) in pairs {
            if let (Some(x), Some(y)) = (x, y) {
                if y > 0.0 {
                    ratios.push((format!("{} {name}", q.system), x / y));
                }
            }
        }
    }
    if let Some((_, r)) = ratios
        .iter()
        .find(|(n, _)| n == "qemu-microvm download_mib_s_p50")
    {
        goals.push(Goal {
            goal: "throughput no worse than the QEMU peer (shoal/qemu-microvm >= 1)".into(),
            value: *r,
            met: *r >= 1.0,
        });
    }
    if let Some(d) = creates.added_p50_ms {
        goals.push(Goal {
            goal: "network adds <= 1 ms to a create from a warm pool (p50, ms)".into(),
            value: d,
            met: d <= 1.0,
        });
    }
    NetReport {
        bench: "net",
        host_kvm: vmm::host::kvm_kind().as_str().into(),
        bulk_bytes: a.bulk_mib << 20,
        request_bytes: MSG,
        traffic,
        creates,
        ratio_shoal_over_qemu: ratios,
        goals,
        notes: vec![
            "every traffic figure is measured by the test host (a netns); on PVM hosts it is \
             bound by the guest kernel's emulation, for both systems"
                .into(),
            "shoal: guest -> virtio-net (checksum and TCP segmentation offloads, event \
             index; no mergeable receive buffers) -> TAP in the sandbox's slot (nftables \
             policy, conntrack) -> veth -> host routing and NAT -> the test host's veth"
                .into(),
            "qemu-microvm: guest -> virtio-net (QEMU's defaults: checksum and segmentation \
             offloads, mergeable receive buffers, event index) -> a TAP in the test host's \
             namespace; qemu-no-offload: the same with none of those (MAC and link status only)"
                .into(),
            "downloads: busybox wget to /dev/null; requests: 64-byte request, 64-byte echo by \
             `nc -e /bin/cat` on one TCP connection; connections: one wget fetching many URLs"
                .into(),
        ],
    }
}

impl NetReport {
    /// The table.
    pub fn render(&self) -> String {
        let mut s = format!(
            "net benchmark, host KVM: {} ({} MiB downloads, {}-byte requests)\n\
             {:<14} {:>12} {:>12} {:>12} {:>12} {:>12}\n",
            self.host_kvm,
            self.bulk_bytes >> 20,
            self.request_bytes,
            "SYSTEM",
            "MiB/s p50",
            "req p50 ms",
            "req p90 ms",
            "req p99 ms",
            "conn/s"
        );
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        for t in &self.traffic {
            s.push_str(&format!(
                "{:<14} {:>12} {:>12} {:>12} {:>12} {:>12}\n",
                t.system,
                f(t.download.as_ref().map(|x| x.median)),
                f(t.request.as_ref().map(|x| x.median)),
                f(t.request.as_ref().map(|x| x.p90)),
                f(t.request.as_ref().map(|x| x.p99)),
                f(t.connections_per_s),
            ));
        }
        for (n, r) in &self.ratio_shoal_over_qemu {
            s.push_str(&format!("ratio shoal/{n:<38} {r:>6.2}x\n"));
        }
        for (label, x) in [
            ("create plain", &self.creates.plain),
            ("create networked", &self.creates.networked),
        ] {
            if let Some(x) = x {
                s.push_str(&format!(
                    "{label:<17} n={:<3} p50 {:>8.2} ms  p90 {:>8.2} ms  max {:>8.2} ms\n",
                    x.n, x.median, x.p90, x.max
                ));
            }
        }
        for g in &self.goals {
            s.push_str(&format!(
                "goal: {} -> {:.2} ({})\n",
                g.goal,
                g.value,
                if g.met { "met" } else { "NOT met" }
            ));
        }
        s
    }
}

/// The figures: request latency and create latency CDFs, download
/// throughput and connections per second as bars.
fn figures(r: &NetReport, out: &Out) -> Result<Vec<PathBuf>, PlotError> {
    let mut files = vec![];
    let req: Vec<Series> = r
        .traffic
        .iter()
        .filter(|t| !t.request_ms.is_empty())
        .map(|t| Series::new(t.system.clone(), t.request_ms.clone()))
        .collect();
    if !req.is_empty() {
        let p = out.path("cdf-request");
        let fig = out
            .figure("Request round trip, guest <-> test host (one TCP connection)")
            .unit("ms")
            .subtitle(format!(
                "{}-byte request and answer; guest kernel emulated on PVM hosts",
                r.request_bytes
            ));
        plot::latency_cdf(&p, &fig, &req)?;
        files.push(p);
    }
    let c = &r.creates;
    let cr: Vec<Series> = [
        ("plain create", &c.plain_ms),
        ("networked create", &c.networked_ms),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(l, v)| Series::new(l, v.clone()))
    .collect();
    if !cr.is_empty() {
        let p = out.path("cdf-create");
        let fig = out
            .figure("Create latency with and without a network (private shoald)")
            .unit("ms")
            .subtitle("tiny, 1 vCPU, 128 MiB; interleaved, each killed before the next");
        plot::latency_cdf(&p, &fig, &cr)?;
        files.push(p);
    }
    let tput: Vec<Bar> = r
        .traffic
        .iter()
        .filter_map(|t| {
            t.download
                .as_ref()
                .map(|d| Bar::new(t.system.clone(), d.median))
        })
        .collect();
    if !tput.is_empty() {
        let p = out.path("bars-throughput");
        let fig = out
            .figure("TCP download throughput, guest <- test host (p50)")
            .axes("", "MiB/s")
            .subtitle(format!(
                "{} MiB HTTP downloads (busybox wget); guest kernel emulated on PVM hosts",
                r.bulk_bytes >> 20
            ));
        plot::bars(&p, &fig, &tput)?;
        files.push(p);
    }
    let conns: Vec<Bar> = r
        .traffic
        .iter()
        .filter_map(|t| t.connections_per_s.map(|v| Bar::new(t.system.clone(), v)))
        .collect();
    if !conns.is_empty() {
        let p = out.path("bars-connections");
        let fig = out
            .figure("Short TCP connections per second, guest -> test host")
            .axes("", "connections/s")
            .subtitle("one wget fetching many URLs; Shoal's through its nftables policy");
        plot::bars(&p, &fig, &conns)?;
        files.push(p);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> NetArgs {
        #[derive(Parser)]
        struct A {
            #[command(flatten)]
            n: NetArgs,
        }
        A::parse_from(std::iter::once("x").chain(extra.iter().copied())).n
    }

    #[test]
    fn the_script_downloads_exchanges_and_connects() {
        let s = script(&args(&[
            "--bulk-mib",
            "2",
            "--downloads",
            "3",
            "--connections",
            "4",
        ]));
        assert!(s.contains("-lt 3 ]"), "{s}");
        assert!(s.contains(&format!("http://@HOST@:{HTTP_PORT}/bulk/{}", 2 << 20)));
        assert!(s.contains(&format!("nc @HOST@ {ECHO_PORT} -e /bin/cat")));
        let c = format!(":{HTTP_PORT}/c");
        assert_eq!(
            s.matches(&format!("{c} ")).count() + s.matches(&format!("{c}\n")).count(),
            4
        );
        assert!(!script(&args(&["--connections", "0"])).contains(&c));
    }

    #[test]
    fn events_become_figures_and_ratios() {
        let t0 = Instant::now();
        let ev = |rate: f64| {
            vec![
                Event::Bulk {
                    bytes: 4 << 20,
                    secs: 4.0 / rate,
                },
                Event::Bulk {
                    bytes: 1,
                    secs: 0.0,
                },
                Event::Rtts(vec![2.0, 4.0]),
                Event::Conn(t0),
                Event::Conn(t0 + Duration::from_millis(500)),
                Event::Conn(t0 + Duration::from_secs(1)),
            ]
        };
        let s = traffic("shoal", ev(1.0));
        assert_eq!(s.download_mib_s, vec![1.0]);
        assert_eq!(s.request_ms, vec![2.0, 4.0]);
        assert_eq!((s.connections, s.connections_per_s), (3, Some(2.0)));
        let q = traffic("qemu-microvm", ev(2.0));
        let r = report(&args(&[]), vec![s, q], {
            let mut c = Creates {
                plain: None,
                networked: None,
                added_p50_ms: Some(0.5),
                plain_ms: vec![],
                networked_ms: vec![],
            };
            c.plain = summarize(&[1.0]);
            c
        });
        let ratio = |n: &str| {
            r.ratio_shoal_over_qemu
                .iter()
                .find(|x| x.0 == n)
                .map(|x| x.1)
        };
        assert_eq!(ratio("qemu-microvm download_mib_s_p50"), Some(0.5));
        assert_eq!(ratio("qemu-microvm connections_per_s"), Some(1.0));
        assert_eq!(r.goals.len(), 2);
        assert!(!r.goals[0].met && r.goals[1].met, "{:?}", r.goals);
        assert!(r.render().contains("NOT met"));
    }

    #[test]
    fn qemu_peers_are_named() {
        assert_eq!(qemu_variants(&args(&[])).unwrap(), vec![true, false]);
        assert_eq!(
            qemu_variants(&args(&["--qemu", "no-offload"])).unwrap(),
            vec![false]
        );
        assert!(qemu_variants(&args(&["--no-qemu"])).unwrap().is_empty());
        assert!(qemu_variants(&args(&["--qemu", "kvmtool"])).is_err());
    }
}
