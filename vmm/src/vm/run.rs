//! Running a VM: vCPU threads, the event thread, the control socket, and
//! the controller loop that pauses, snapshots, reloads and stops the guest.

use super::{io_err, kvm_err, Event, Vm, VmError};
use crate::cpu::{cpuid, CpuProfile};
use crate::seccomp::{Filters, Role};
use crate::vcpu::{ExitReason, VcpuCmd, VcpuCtx, VcpuEvent, VcpuFlags, VcpuReport};
use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_ioctls::{Kvm, VcpuFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vmm_api::{Command, RestoreInfo, Sample, SnapshotInfo, Stats, VmState};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// How a run ended, with timing.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why the guest stopped.
    pub exit: ExitReason,
    /// When a vCPU first entered the guest (after the last load).
    pub first_run: Option<Instant>,
    /// When the guest wrote its first console byte.
    pub first_console_byte: Option<Instant>,
}

/// How to run a VM.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Stop the guest after this long.
    pub timeout: Option<Duration>,
    /// Serve the control protocol on this Unix socket.
    pub api_sock: Option<PathBuf>,
    /// When the guest stops by itself, keep the VM (and the control socket)
    /// up, waiting for a `restore` or `shutdown` request.
    pub keep_alive: bool,
    /// Gets "ready\n" written and is closed once the vCPUs run (or, with
    /// no guest loaded, once the control socket serves).
    pub ready: Option<std::fs::File>,
    /// Seccomp filters: every thread of the VM installs its role's on
    /// itself, the calling (main) thread once the VM runs. `None` (tests
    /// running VMs in their own process, `--no-seccomp`): no filters.
    pub seccomp: Option<Arc<Filters>>,
}

struct VcpuHandle {
    thread: JoinHandle<VcpuFd>,
    flags: Arc<VcpuFlags>,
    cmds: mpsc::Sender<VcpuCmd>,
}

/// The running VM's vCPU threads and lifecycle state.
struct Controller {
    vcpus: Vec<VcpuHandle>,
    started: Instant,
    paused: bool,
    exit: Option<ExitReason>,
    first_run: Arc<OnceLock<Instant>>,
    /// Bumped whenever vCPU threads are stopped, so their late events
    /// (the `Stopped` exits they send) are ignored.
    generation: u64,
    /// Filters the vCPU threads install.
    seccomp: Option<Arc<Filters>>,
}

impl Vm {
    /// Runs the guest until it stops, or until `timeout` passes.
    pub fn run(self, timeout: Option<Duration>) -> Result<RunOutcome, VmError> {
        self.run_with(RunOptions {
            timeout,
            ..Default::default()
        })
    }

    /// Runs the guest, serving the control socket if asked for. A VM with no
    /// guest loaded (pre-warmed) waits for a `restore` request.
    pub fn run_with(mut self, opts: RunOptions) -> Result<RunOutcome, VmError> {
        install_kick_handler();
        let (tx, rx) = mpsc::channel::<Event>();
        if let Some(path) = &opts.api_sock {
            let _ = std::fs::remove_file(path);
            let l = std::os::unix::net::UnixListener::bind(path).map_err(|source| {
                VmError::ApiSocket {
                    path: path.clone(),
                    source,
                }
            })?;
            let tx = Mutex::new(tx.clone());
            // The threads install their filters while the VM is set up; a
            // thread that cannot ends the VMM (no thread serves unfiltered).
            let init: Option<vmm_api::ThreadInit> = opts.seccomp.clone().map(|f| {
                let init: vmm_api::ThreadInit =
                    Arc::new(move |_| f.install(Role::Api).map_err(crate::seccomp::fatal));
                init
            });
            let serve = vmm_api::ServeOptions {
                init,
                ..Default::default()
            };
            vmm_api::serve_with(l, serve, move |c| {
                devices::bus::lock(&tx).send(Event::Control(c)).is_ok()
            })
            .map_err(|source| VmError::ApiSocket {
                path: path.clone(),
                source,
            })?;
        } else if !self.loaded {
            return Err(VmError::NotLoaded);
        }
        let (events, ids) =
            crate::events::start(std::mem::take(&mut self.subscribers), opts.seccomp.clone())?;
        self.subscriber_ids = ids;
        self.events = Some(events);
        let mut ctl = Controller {
            vcpus: Vec::new(),
            started: Instant::now(),
            paused: false,
            exit: None,
            first_run: Arc::new(OnceLock::new()),
            generation: 0,
            seccomp: opts.seccomp.clone(),
        };
        if self.loaded {
            self.spawn_vcpus(&mut ctl, &tx)?;
        }
        if let Some(mut f) = opts.ready {
            // Best effort: a supervisor that went away does not stop the VM.
            let _ = std::io::Write::write_all(&mut f, b"ready\n");
        }
        // Set-up is done: from here the main thread only serves the
        // controller, whose requests wait until the filter is on (vCPU
        // threads started for a later restore inherit it under their own).
        if let Some(f) = &opts.seccomp {
            if let Err(e) = f.install(Role::Main) {
                ctl.stop_all();
                return Err(e.into());
            }
        }
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        let mut finished = None;
        loop {
            if let Some(e) = ctl.exit.take() {
                if !opts.keep_alive || matches!(e, ExitReason::Stopped) {
                    finished = Some(e);
                    break;
                }
                // The guest ended; keep the VM for a reload.
                self.vcpus = ctl.stop_all();
                self.loaded = false;
                finished = Some(e);
            }
            let ev = match deadline {
                Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                    Ok(e) => e,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        ctl.exit = Some(ExitReason::Stopped);
                        continue;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(e) => e,
                    // Only possible with no vCPUs and no control socket.
                    Err(_) => break,
                },
            };
            match ev {
                Event::Vcpu(r) if r.generation != ctl.generation => {}
                Event::Vcpu(VcpuReport {
                    event: VcpuEvent::Exit(_, r),
                    ..
                }) => ctl.exit = Some(r),
                Event::Vcpu(VcpuReport {
                    event: VcpuEvent::Paused(_),
                    ..
                }) => {}
                Event::Control(cmd) => self.handle(&mut ctl, &rx, &tx, cmd),
            }
        }
        let exit = finished.unwrap_or(ExitReason::Stopped);
        ctl.stop_all();
        self.subscriber_ids.clear();
        if let Some(e) = self.events.take() {
            e.stop();
        }
        let mut serial = devices::bus::lock(&self.serial);
        let sink = serial.sink_mut();
        let _ = sink.finish();
        Ok(RunOutcome {
            exit,
            first_run: ctl.first_run.get().copied(),
            first_console_byte: sink.first_byte,
        })
    }

    fn spawn_vcpus(
        &mut self,
        ctl: &mut Controller,
        tx: &mpsc::Sender<Event>,
    ) -> Result<(), VmError> {
        ctl.first_run = Arc::new(OnceLock::new());
        ctl.started = Instant::now();
        ctl.paused = false;
        for (id, fd) in self.vcpus.drain(..).enumerate() {
            let id = u8::try_from(id)
                .map_err(|_| VmError::DeviceState(format!("vCPU {id}: at most 255 vCPUs")))?;
            let flags = Arc::new(VcpuFlags::default());
            let (cmd_tx, cmd_rx) = mpsc::channel();
            let ctx = VcpuCtx {
                id,
                generation: ctl.generation,
                fd,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                mem: self.mem.clone(),
                reset_evt: self.reset_evt.try_clone().map_err(io_err("eventfd"))?,
                flags: flags.clone(),
                cmds: cmd_rx,
                msr_list: self.msr_list.clone(),
                xsave: self.xsave,
                tx: tx.clone(),
                first_run: ctl.first_run.clone(),
                seccomp: ctl.seccomp.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || ctx.run())
                .map_err(VmError::Thread)?;
            ctl.vcpus.push(VcpuHandle {
                thread: h,
                flags,
                cmds: cmd_tx,
            });
        }
        Ok(())
    }

    /// Answers one control request.
    fn handle(
        &mut self,
        ctl: &mut Controller,
        rx: &mpsc::Receiver<Event>,
        tx: &mpsc::Sender<Event>,
        cmd: Command,
    ) {
        let idle = ctl.vcpus.is_empty();
        match cmd {
            c @ (Command::Pause(_)
            | Command::Snapshot { .. }
            | Command::Sample(_)
            | Command::Evict { .. })
                if idle =>
            {
                c.refuse("no guest is running")
            }
            Command::Pause(r) => r.send(ctl.pause_all(rx)),
            Command::Resume(r) => {
                ctl.resume_all();
                r.ok(())
            }
            Command::Sample(r) => {
                let was_paused = ctl.paused;
                if let Err(e) = ctl.pause_all(rx) {
                    return r.refuse(e);
                }
                let res = ctl.save_vcpus();
                if !was_paused {
                    ctl.resume_all();
                }
                match res {
                    Ok(v) => r.ok(Sample {
                        rips: v.iter().map(|s| s.regs.rip).collect(),
                    }),
                    Err(e) => r.refuse(format!("sample failed: {e}")),
                }
            }
            Command::Balloon { target_mib, reply } => reply.send(self.balloon_request(target_mib)),
            Command::Evict { dir, reply } => {
                let t0 = Instant::now();
                let was_paused = ctl.paused;
                if let Err(e) = ctl.pause_all(rx) {
                    return reply.refuse(e);
                }
                let res = self.evict_request(&dir, t0);
                if !was_paused {
                    ctl.resume_all();
                }
                reply.send(res)
            }
            Command::Shutdown(r) => {
                ctl.exit = Some(ExitReason::Stopped);
                r.ok(())
            }
            Command::Stats(r) => {
                let stats = devices::bus::lock(&self.serial).sink_mut().stats();
                let state = if idle {
                    VmState::Empty
                } else if ctl.paused {
                    VmState::Paused
                } else {
                    VmState::Running
                };
                r.ok(Stats {
                    state,
                    vcpus: self.config.vcpus,
                    memory_mib: self.config.memory_mib,
                    uptime_ms: millis(ctl.started.elapsed()),
                    serial_bytes: stats.guest_bytes.load(Ordering::Relaxed),
                    serial_dropped: stats.dropped_bytes.load(Ordering::Relaxed),
                    pid: std::process::id(),
                    pmem_guest_writes: self.pmem_guest_writes(),
                    net: self.net_counters().map(|c| vmm_api::NetStats {
                        rx_packets: c.rx_packets,
                        rx_bytes: c.rx_bytes,
                        rx_dropped: c.rx_too_small + c.rx_malformed + c.rx_tap_errors,
                        tx_packets: c.tx_packets,
                        tx_bytes: c.tx_bytes,
                        tx_dropped: c.tx_spoofed + c.tx_malformed + c.tx_oversize + c.tx_tap_errors,
                    }),
                })
            }
            Command::Snapshot { dir, diff, reply } => {
                let t0 = Instant::now();
                if let Err(e) = ctl.pause_all(rx) {
                    return reply.refuse(e);
                }
                let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
                let t1 = Instant::now();
                let res = ctl
                    .save_vcpus()
                    .and_then(|v| self.save_snapshot(v, &dir, diff));
                match res {
                    Ok((state_bytes, memory_bytes)) => reply.ok(SnapshotInfo {
                        dir,
                        state_bytes,
                        memory_bytes,
                        pause_ms,
                        save_ms: t1.elapsed().as_secs_f64() * 1e3,
                    }),
                    Err(e) => reply.refuse(format!("snapshot failed: {e}")),
                }
            }
            Command::Restore { dir, disks, reply } => {
                let t0 = Instant::now();
                if !idle {
                    self.vcpus = ctl.stop_all();
                }
                if let Err(e) = self.reload_with_disks(&dir, &disks) {
                    // The VM is left empty; another restore may succeed.
                    self.loaded = false;
                    return reply.refuse(format!("restore failed: {e}"));
                }
                if let Err(e) = self.spawn_vcpus(ctl, tx) {
                    return reply.refuse(format!("restore failed: {e}"));
                }
                reply.ok(RestoreInfo {
                    restore_ms: t0.elapsed().as_secs_f64() * 1e3,
                })
            }
        }
    }
}

/// Whole milliseconds of `d`, saturating (u64 milliseconds are 584 million
/// years).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Controller {
    /// Parks every vCPU; returns once all have confirmed.
    fn pause_all(&mut self, rx: &mpsc::Receiver<Event>) -> Result<(), String> {
        if self.paused {
            return Ok(());
        }
        for v in &self.vcpus {
            v.flags.pause.store(true, Ordering::Release);
        }
        let mut waiting = self.vcpus.len();
        let deadline = Instant::now() + Duration::from_secs(10);
        while waiting > 0 {
            for v in &self.vcpus {
                let _ = v.thread.kill(SIGRTMIN());
            }
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(Event::Vcpu(r)) if r.generation != self.generation => {}
                Ok(Event::Vcpu(VcpuReport {
                    event: VcpuEvent::Paused(_),
                    ..
                })) => waiting -= 1,
                Ok(Event::Vcpu(VcpuReport {
                    event: VcpuEvent::Exit(_, r),
                    ..
                })) => {
                    self.exit = Some(r);
                    return Err("the guest stopped while pausing".into());
                }
                Ok(Event::Control(cmd)) => cmd.refuse("busy: a pause is in progress"),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("vCPU threads are gone".into())
                }
            }
            if Instant::now() > deadline {
                return Err("vCPUs did not pause within 10 s".into());
            }
        }
        self.paused = true;
        Ok(())
    }

    /// Saves every (paused) vCPU's state.
    fn save_vcpus(&self) -> Result<Vec<crate::persist::VcpuState>, VmError> {
        let gone = || VmError::DeviceState("vCPU thread is gone".into());
        let mut out = Vec::with_capacity(self.vcpus.len());
        for v in &self.vcpus {
            let (tx, rx) = mpsc::channel();
            v.cmds.send(VcpuCmd::Save(tx)).map_err(|_| gone())?;
            out.push(rx.recv().map_err(|_| gone())??);
        }
        Ok(out)
    }

    fn resume_all(&mut self) {
        if !self.paused {
            return;
        }
        for v in &self.vcpus {
            // The controller owns the flag: cleared here, before the vCPU
            // wakes, so a pause requested right after this resume (which
            // sets it again) cannot be undone by a vCPU that is slow to
            // take its Resume.
            v.flags.pause.store(false, Ordering::Release);
            let _ = v.cmds.send(VcpuCmd::Resume);
        }
        self.paused = false;
    }

    /// Ends every vCPU thread and returns the vCPUs.
    fn stop_all(&mut self) -> Vec<VcpuFd> {
        for v in &self.vcpus {
            v.flags.stop.store(true, Ordering::Release);
            let _ = v.cmds.send(VcpuCmd::Stop);
        }
        let mut fds = Vec::with_capacity(self.vcpus.len());
        for v in self.vcpus.drain(..) {
            // A vCPU only sees `stop` when KVM_RUN returns; a signal makes it
            // return. Repeat until the thread is gone (a signal that lands
            // outside KVM_RUN is harmless and re-sent).
            while !v.thread.is_finished() {
                let _ = v.thread.kill(SIGRTMIN());
                std::thread::sleep(Duration::from_micros(200));
            }
            if let Ok(fd) = v.thread.join() {
                fds.push(fd);
            }
        }
        self.paused = false;
        self.generation += 1;
        fds
    }
}

/// The kernel command-line words a guest needs for `profile` on this host
/// (see [`cpuid::kernel_args`]), for monitors that do not shape CPUID
/// themselves (the QEMU peer in benchmarks).
pub fn profile_kernel_args(profile: Option<CpuProfile>) -> Result<String, VmError> {
    let kvm = Kvm::new().map_err(VmError::KvmOpen)?;
    let profile = profile.unwrap_or_else(|| {
        CpuProfile::auto(crate::host::kvm_kind() != crate::host::KvmKind::Hardware)
    });
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let fd = vm.create_vcpu(0).map_err(kvm_err("KVM_CREATE_VCPU"))?;
    let mut c = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    cpuid::setup(&mut c, profile, 0, 1);
    fd.set_cpuid2(&c).map_err(kvm_err("KVM_SET_CPUID2"))?;
    let held = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_CPUID2"))?;
    Ok(cpuid::kernel_args(profile, &held))
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_kick_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Failing to install means kicks would kill the process instead; a
        // handler for a real-time signal is always installable.
        let _ = register_signal_handler(SIGRTMIN(), kick_handler);
    });
}
