//! The measuring side of the hostile-guest battery (tests/tests/hostile.rs):
//! an attacker and a neighbour sandbox, and what is watched while an
//! attack runs.

use crate::daemon_harness::{alive, Daemon};
use shoal_client::api::{self, CreateSandbox, ExecResult, ListFilter};
use shoal_client::DaemonClient;
use shoal_runtime::vm;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Guest RAM of the sandboxes (the image default).
pub const GUEST_MIB: u64 = 128;
/// What a VMM may hold beyond guest RAM and its pmem image.
pub const RSS_SLACK_MIB: u64 = 48;
/// Open fds of a VMM at most: its own (~25) plus the vsock muxer's cap on
/// connections (1,024, `devices::virtio::vsock::MAX_CONNECTIONS`) and some.
pub const FD_BOUND: usize = 1024 + 64;
/// A stat and a list of the daemon each answer within this.
pub const DAEMON_DEADLINE: Duration = Duration::from_secs(2);
/// A neighbour's exec latency during an attack, at most this times normal.
pub const NEIGHBOUR_FACTOR: f64 = 2.0;
/// Neighbour execs measured for its normal latency before each attack.
const NORMAL_SAMPLES: usize = 5;
/// Pause after each neighbour exec (before the attack and during it): a
/// neighbour that execs back to back would be a CPU hog of its own.
const NEIGHBOUR_GAP: Duration = Duration::from_millis(500);
/// What one attack did to its surroundings.
#[derive(Debug)]
struct Outcome {
    name: String,
    normal: Duration,
    during: Option<Duration>,
    neighbour_samples: usize,
    daemon_max: Duration,
    /// The attacker's VMM before the attack, at most during it, after it.
    rss_kib: [u64; 3],
    fds: [usize; 3],
    /// The daemon's RSS before the attack and at most during it.
    daemon_rss_kib: [u64; 2],
    took: Duration,
}

/// The battery's sandboxes and measurements.
pub struct Battery<'a> {
    pub d: &'a Daemon,
    pub attacker: String,
    /// The attacker's VM process (a jailed VMM's jailer: what the daemon
    /// starts, watches and kills).
    pub vmm: vm::Proc,
    /// The attacker's VMM itself (the jailer's child when jailed): whose
    /// memory and fds are bounded.
    vmm_pid: i32,
    neighbour: String,
    /// A client of its own with a deadline, for the daemon checks.
    side: DaemonClient,
    rss_bound_kib: u64,
    outcomes: Vec<Outcome>,
}

fn median(mut v: Vec<Duration>) -> Option<Duration> {
    v.sort();
    v.get(v.len() / 2).copied()
}

/// VmRSS of a process in KiB.
fn rss_kib(pid: i32) -> Option<u64> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = st.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn fd_count(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

impl<'a> Battery<'a> {
    pub fn new(d: &'a Daemon, neighbour: String) -> Battery<'a> {
        let image = shoal_test_support::artifacts()
            .dir
            .join("images/tiny.erofs");
        let pmem_kib = std::fs::metadata(&image)
            .unwrap_or_else(|e| panic!("{}: {e}", image.display()))
            .len()
            / 1024;
        let mut side = DaemonClient::unix(d.dir.join("shoald.sock"));
        side.timeout = Some(DAEMON_DEADLINE * 5);
        Battery {
            d,
            attacker: String::new(),
            vmm: vm::Proc { pid: 0, start: 0 },
            vmm_pid: 0,
            neighbour,
            side,
            rss_bound_kib: (GUEST_MIB + RSS_SLACK_MIB) * 1024 + pmem_kib,
            outcomes: Vec::new(),
        }
    }

    /// A fresh attacker sandbox from the template.
    pub fn new_attacker(&mut self) {
        self.new_attacker_with(CreateSandbox::default());
    }

    /// A fresh attacker sandbox made by `req` (the `tiny` image).
    pub fn new_attacker_with(&mut self, req: CreateSandbox) {
        let sb = self.d.create(req);
        self.vmm = alive(&sb).expect("the attacker's VMM runs");
        let dir = self.d.dir.join("sandboxes").join(&sb.id);
        self.vmm_pid = shoal_runtime::jail::vmm_pid(self.vmm.pid, &dir).unwrap_or(self.vmm.pid);
        let comm =
            std::fs::read_to_string(format!("/proc/{}/comm", self.vmm_pid)).unwrap_or_default();
        assert_eq!(
            comm.trim(),
            "shoal-vmm",
            "pid {} is not the attacker's VMM (jailer {})",
            self.vmm_pid,
            self.vmm.pid
        );
        self.attacker = sb.id;
    }

    /// Removes the attacker: gone from the API, its directory removed.
    pub fn remove_attacker(&self) {
        let id = &self.attacker;
        self.d.kill(id);
        assert!(self.d.get(id).is_none(), "{id} still listed");
        let dir = self.d.dir.join("sandboxes").join(id);
        assert!(!dir.exists(), "{} left", dir.display());
    }

    /// Runs a shell command in the attacker.
    pub fn attacker_sh(&self, script: &str) -> ExecResult {
        let req = api::ExecRequest::shell(script).with_timeout(60.0);
        self.d.must(script, self.d.c.exec(&self.attacker, &req))
    }

    /// The attacker answers an exec again, within a short deadline.
    pub fn assert_attacker_answers(&self) {
        let mut c = DaemonClient::unix(self.d.dir.join("shoald.sock"));
        c.timeout = Some(Duration::from_secs(30));
        let t = Instant::now();
        let req = api::ExecRequest::shell("echo ok").with_timeout(20.0);
        let r = c.exec(&self.attacker, &req);
        match r {
            Ok(r) if r.stdout == "ok\n" => {}
            other => panic!(
                "the attacker does not answer after the attack ({:?}): {other:?}",
                t.elapsed()
            ),
        }
    }

    /// One neighbour exec's latency (then [`NEIGHBOUR_GAP`] of rest).
    fn neighbour_exec(&self) -> Duration {
        let t = Instant::now();
        let req = api::ExecRequest::shell("true").with_timeout(60.0);
        let r = self.d.c.exec(&self.neighbour, &req);
        let took = t.elapsed();
        match r {
            Ok(r) if r.exit_code == Some(0) => {
                std::thread::sleep(NEIGHBOUR_GAP);
                took
            }
            other => panic!("the neighbour's exec failed: {other:?}"),
        }
    }

    /// Runs `script` in the attacker (one-shot exec with `timeout_s`) and
    /// watches everything while it runs (and for `window` at least).
    pub fn attack(
        &mut self,
        name: &str,
        script: &str,
        timeout_s: f64,
        window: Option<Duration>,
    ) -> ExecResult {
        let normal: Vec<Duration> = (0..NORMAL_SAMPLES).map(|_| self.neighbour_exec()).collect();
        let normal = median(normal).unwrap_or_default();
        let daemon_pid = self
            .d
            .pid()
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(0);
        let rss0 = rss_kib(self.vmm_pid).unwrap_or(0);
        let fds0 = fd_count(self.vmm_pid).unwrap_or(0);
        let daemon_rss0 = rss_kib(daemon_pid).unwrap_or(0);
        let mut daemon_rss_max = daemon_rss0;
        let t0 = Instant::now();
        let c = DaemonClient::unix(self.d.dir.join("shoald.sock"));
        let (id, req) = (
            self.attacker.clone(),
            api::ExecRequest::shell(script).with_timeout(timeout_s),
        );
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let h = std::thread::spawn(move || {
            let r = c.exec(&id, &req);
            flag.store(true, Ordering::Release);
            r
        });
        let until = window.map(|w| t0 + w);
        let (mut during, mut daemon_max, mut rss_max, mut fds_max) =
            (Vec::new(), Duration::ZERO, 0, 0);
        loop {
            let finished = done.load(Ordering::Acquire);
            if finished && until.is_none_or(|u| Instant::now() >= u) && !during.is_empty() {
                break;
            }
            if let Some(r) = rss_kib(self.vmm_pid) {
                rss_max = rss_max.max(r);
            }
            if let Some(n) = fd_count(self.vmm_pid) {
                fds_max = fds_max.max(n);
            }
            if let Some(r) = rss_kib(daemon_pid) {
                daemon_rss_max = daemon_rss_max.max(r);
            }
            let t = Instant::now();
            let st = self.side.sandbox(&self.attacker);
            let list = self.side.list(&ListFilter::default());
            let took = t.elapsed();
            assert!(
                st.is_ok() && list.is_ok(),
                "{name}: the daemon did not answer a stat and a list: {:?} {:?}",
                st.err(),
                list.err()
            );
            daemon_max = daemon_max.max(took);
            if finished && !during.is_empty() && until.is_none() {
                break;
            }
            during.push(self.neighbour_exec());
        }
        let r = h.join().expect("the attack thread");
        let took = t0.elapsed();
        let r = r.unwrap_or_else(|e| panic!("{name}: the attack's exec failed: {e}"));
        let o = Outcome {
            name: name.into(),
            normal,
            neighbour_samples: during.len(),
            during: median(during),
            daemon_max,
            rss_kib: [rss0, rss_max, rss_kib(self.vmm_pid).unwrap_or(0)],
            fds: [fds0, fds_max, fd_count(self.vmm_pid).unwrap_or(0)],
            daemon_rss_kib: [daemon_rss0, daemon_rss_max],
            took,
        };
        eprintln!("battery: {o:?}");
        self.outcomes.push(o);
        r
    }

    /// Keeps watching (without an attack exec) until `when`.
    pub fn wait_until(&mut self, when: Instant) {
        while Instant::now() < when {
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Uploads the guest tool as /tmp/hostile.
    pub fn upload_tool(&self, tool: &Path) {
        let data = std::fs::read(tool).unwrap();
        let mut q = api::UploadQuery::new("/tmp/hostile");
        q.mode = Some(0o755);
        self.d.must(
            "upload the guest tool",
            self.d.c.put_file(&self.attacker, &q, &mut &data[..]),
        );
    }

    /// A host listener for guest connections to host port `port` of the
    /// attacker (the VMM forwards them to `<vsock socket>_<port>`), which
    /// accepts and holds every connection.
    pub fn host_vsock_listener(&self, port: u32) -> HostListener {
        let dir = self.d.dir.join("sandboxes").join(&self.attacker);
        let sock = vsock_socket(&dir);
        let path = PathBuf::from(format!("{}_{port}", sock.display()));
        let l = UnixListener::bind(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A jailed VMM runs as the sandbox directory's owner: the socket
        // is its to connect to.
        let owner = std::fs::metadata(&dir).unwrap();
        std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid()))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (s, a) = (stop.clone(), accepted.clone());
        let thread = std::thread::spawn(move || {
            let mut held: Vec<UnixStream> = Vec::new();
            while !s.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((c, _)) => {
                        held.push(c);
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        HostListener {
            path,
            stop,
            accepted,
            thread: Some(thread),
        }
    }

    /// Prints what every attack did: one line each, the attacker's VMM
    /// RSS and fds before / at most during / after, the daemon's RSS before
    /// / at most during, and the neighbour's median exec before and during.
    pub fn report(&self) {
        eprintln!(
            "battery: bounds: VMM RSS <= {} KiB, fds <= {FD_BOUND}, daemon <= {:?}, \
             neighbour <= {NEIGHBOUR_FACTOR}x normal",
            self.rss_bound_kib, DAEMON_DEADLINE
        );
        eprintln!(
            "battery: | attack | s | VMM RSS KiB before/max/after | VMM fds before/max/after \
             | daemon RSS KiB before/max | daemon answer max ms | neighbour p50 ms normal/during \
             (execs) | ratio |"
        );
        for o in &self.outcomes {
            let ratio = o
                .during
                .map(|d| d.as_secs_f64() / o.normal.as_secs_f64().max(1e-3));
            eprintln!(
                "battery: | {} | {:.1} | {}/{}/{} | {}/{}/{} | {}/{} | {} | {}/{} ({}) | {:.2}x |",
                o.name,
                o.took.as_secs_f64(),
                o.rss_kib[0],
                o.rss_kib[1],
                o.rss_kib[2],
                o.fds[0],
                o.fds[1],
                o.fds[2],
                o.daemon_rss_kib[0],
                o.daemon_rss_kib[1],
                o.daemon_max.as_millis(),
                o.normal.as_millis(),
                o.during.unwrap_or_default().as_millis(),
                o.neighbour_samples,
                ratio.unwrap_or(0.0)
            );
        }
    }

    /// Fails listing every attack that broke a bound.
    pub fn assert_bounds(&self) {
        let mut bad = Vec::new();
        for o in &self.outcomes {
            if o.rss_kib[1] > self.rss_bound_kib {
                bad.push(format!("{}: VMM RSS {} KiB", o.name, o.rss_kib[1]));
            }
            if o.fds[1] > FD_BOUND {
                bad.push(format!("{}: VMM fds {}", o.name, o.fds[1]));
            }
            if o.daemon_max > DAEMON_DEADLINE {
                bad.push(format!("{}: daemon took {:?}", o.name, o.daemon_max));
            }
            let limit = o.normal.mul_f64(NEIGHBOUR_FACTOR);
            if o.during.is_none_or(|d| d > limit) {
                bad.push(format!(
                    "{}: neighbour exec {:?} during, {:?} normal",
                    o.name, o.during, o.normal
                ));
            }
        }
        assert!(bad.is_empty(), "bounds broken:\n{}", bad.join("\n"));
    }
}

/// The VMM's vsock socket in a sandbox directory.
fn vsock_socket(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.path())
        .collect();
    entries
        .iter()
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().contains("vsock"))
        })
        .cloned()
        .unwrap_or_else(|| panic!("no vsock socket in {}: {entries:?}", dir.display()))
}

/// A host listener for guest-initiated vsock connections.
pub struct HostListener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostListener {
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for HostListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
