//! Building a VM from a [`VmConfig`] and running it to completion.

use crate::api::{self, ControlMsg, Request, Response, SnapshotInfo, Stats};
use crate::boot::{self, BootError};
use crate::config::{BootSource, ConfigError, SerialOutput, VmConfig};
use crate::cpu::cpuid;
use crate::cpu::mptable::{self, MptableError};
use crate::cpu::regs::{self, RegsError};
use crate::cpu::CpuProfile;
use crate::layout::{ram_ranges, KVM_TSS_ADDR, VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE};
use crate::persist::{SnapshotMeta, SnapshotState, StateError, VcpuRef, VmRef};
use crate::vcpu::{ExitReason, VcpuCmd, VcpuCtx, VcpuEvent, VcpuFlags};
use devices::bus::BusError;
use devices::i8042::{I8042, I8042_PORT, I8042_PORT_LEN};
use devices::serial::{BoundedSink, Serial, COM1_IRQ, COM1_PORT, UART_PORT_LEN};
use devices::virtio::blk::{Block, BlockConfig, BlockError};
use devices::virtio::mmio::{MmioTransport, MMIO_LEN};
use devices::virtio::persist::MmioRestoreError;
use devices::{Bus, BusDevice, IrqLine};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use snapshot::{Persist, SnapshotError};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// Errors building or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// /dev/kvm could not be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available and accessible to this user?)")]
    KvmOpen(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Kvm {
        /// Which step.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Guest memory could not be allocated.
    #[error("cannot allocate {0} MiB of guest memory")]
    Memory(u32),
    /// Kernel, initrd or command line.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// vCPU register set-up.
    #[error(transparent)]
    Regs(#[from] RegsError),
    /// MP table.
    #[error(transparent)]
    Mptable(#[from] MptableError),
    /// A disk.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// Device placement.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// Serial output file or eventfds.
    #[error("{what}: {source}")]
    Io {
        /// What failed.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A vCPU thread could not be started.
    #[error("cannot start vCPU thread: {0}")]
    Thread(std::io::Error),
    /// Snapshot state file.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// KVM state save/restore.
    #[error("snapshot: {0}")]
    State(#[from] StateError),
    /// A device's saved state does not fit.
    #[error("snapshot: {0}")]
    DeviceState(String),
    /// The snapshot was taken elsewhere or is inconsistent.
    #[error("cannot restore snapshot {dir}: {reason}")]
    Incompatible {
        /// The snapshot.
        dir: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The control socket could not be created.
    #[error("cannot create control socket {path}: {source}")]
    ApiSocket {
        /// The path.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<MmioRestoreError> for VmError {
    fn from(e: MmioRestoreError) -> Self {
        VmError::DeviceState(e.to_string())
    }
}

/// What the controller thread receives.
pub enum Event {
    /// From a vCPU thread.
    Vcpu(VcpuEvent),
    /// From the control socket.
    Control(ControlMsg),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// How a run ended, with timing.
#[derive(Debug)]
pub struct RunOutcome {
    /// Why the guest stopped.
    pub exit: ExitReason,
    /// When a vCPU first entered the guest.
    pub first_run: Option<Instant>,
    /// When the guest wrote its first console byte.
    pub first_console_byte: Option<Instant>,
}

/// A built, not yet running VM.
pub struct Vm {
    config: VmConfig,
    vm_fd: VmFd,
    mem: GuestMemoryMmap,
    vcpus: Vec<kvm_ioctls::VcpuFd>,
    pio: Bus,
    mmio: Bus,
    reset_evt: EventFd,
    serial: Arc<Mutex<Serial>>,
    virtio: Vec<Arc<Mutex<MmioTransport>>>,
    profile: CpuProfile,
    cmdline: Option<String>,
    msr_list: Arc<Vec<u32>>,
    xsave: bool,
}

/// KVM handles common to boot and restore.
struct Base {
    kvm: Kvm,
    vm_fd: VmFd,
}

fn create_base() -> Result<Base, VmError> {
    let kvm = Kvm::new().map_err(VmError::KvmOpen)?;
    let vm_fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm_fd
        .set_tss_address(KVM_TSS_ADDR)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm_fd
        .create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    let pit = kvm_pit_config {
        flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm_fd.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))?;
    Ok(Base { kvm, vm_fd })
}

fn register_memory(vm_fd: &VmFd, mem: &GuestMemoryMmap) -> Result<(), VmError> {
    for (slot, region) in mem.iter().enumerate() {
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: region.as_ptr() as u64,
            flags: 0,
        };
        // SAFETY: the region is a live mapping owned by `mem`, which the Vm
        // keeps alive for as long as the VM fd exists.
        unsafe { vm_fd.set_user_memory_region(r) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

fn console_sink(
    cfg: &VmConfig,
    console: Option<Box<dyn Write + Send>>,
) -> Result<BoundedSink, VmError> {
    let out: Box<dyn Write + Send> = match console {
        Some(c) => c,
        None => match &cfg.serial {
            SerialOutput::Stdout => Box::new(std::io::stdout()),
            SerialOutput::File(p) => Box::new(
                std::fs::File::create(p)
                    .map_err(io_err(format!("cannot create serial file {}", p.display())))?,
            ),
            SerialOutput::Null => Box::new(std::io::sink()),
        },
    };
    Ok(BoundedSink::new(out, cfg.serial_limit_bytes))
}

fn default_profile(cfg: &VmConfig) -> CpuProfile {
    cfg.cpu_profile.unwrap_or_else(|| {
        CpuProfile::auto(crate::host::kvm_kind() != crate::host::KvmKind::Hardware)
    })
}

impl Vm {
    /// Legacy devices, memory and empty buses around `base`.
    fn assemble(
        cfg: &VmConfig,
        base: Base,
        mem: GuestMemoryMmap,
        serial: impl FnOnce(IrqLine) -> Result<Serial, VmError>,
        profile: CpuProfile,
    ) -> Result<(Vm, Kvm, Vec<u32>), VmError> {
        let Base { kvm, vm_fd } = base;
        register_memory(&vm_fd, &mem)?;
        let mut pio = Bus::new();
        let reset_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(io_err("eventfd"))?;
        let i8042 = I8042::new(reset_evt.try_clone().map_err(io_err("eventfd"))?);
        pio.insert(Arc::new(Mutex::new(i8042)), I8042_PORT, I8042_PORT_LEN)?;
        let com1_irq = IrqLine::new(COM1_IRQ).map_err(io_err("eventfd"))?;
        vm_fd
            .register_irqfd(com1_irq.eventfd(), COM1_IRQ)
            .map_err(kvm_err("KVM_IRQFD"))?;
        let serial = Arc::new(Mutex::new(serial(com1_irq)?));
        pio.insert(serial.clone(), COM1_PORT, UART_PORT_LEN)?;
        let msr_list = kvm
            .get_msr_index_list()
            .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?
            .as_slice()
            .to_vec();
        let xsave = kvm.check_extension(kvm_ioctls::Cap::Xsave);
        Ok((
            Vm {
                config: cfg.clone(),
                vm_fd,
                mem,
                vcpus: vec![],
                pio,
                mmio: Bus::new(),
                reset_evt,
                serial,
                virtio: vec![],
                profile,
                cmdline: None,
                msr_list: Arc::new(vec![]),
                xsave,
            },
            kvm,
            msr_list,
        ))
    }

    /// Builds the VM: memory, devices, kernel, vCPUs. `console` overrides the
    /// configured serial destination (tests capture output this way).
    pub fn new(cfg: &VmConfig, console: Option<Box<dyn Write + Send>>) -> Result<Self, VmError> {
        cfg.validate()?;
        let base = create_base()?;
        let profile = default_profile(cfg);
        let mem_bytes = cfg.mem_bytes();
        let ranges: Vec<(GuestAddress, usize)> = ram_ranges(mem_bytes)
            .into_iter()
            .map(|(s, l)| (GuestAddress(s), l as usize))
            .collect();
        let mem =
            GuestMemoryMmap::from_ranges(&ranges).map_err(|_| VmError::Memory(cfg.memory_mib))?;
        let sink = console_sink(cfg, console)?;
        let (mut vm, kvm, supported_msrs) =
            Self::assemble(cfg, base, mem, |irq| Ok(Serial::new(irq, sink)), profile)?;
        let device_args = vm.attach_disks()?;

        let base_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
        let mut profile_args = String::new();
        for id in 0..cfg.vcpus {
            let fd = vm
                .vm_fd
                .create_vcpu(u64::from(id))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            let mut c = base_cpuid.clone();
            cpuid::setup(&mut c, profile, id, cfg.vcpus);
            fd.set_cpuid2(&c).map_err(kvm_err("KVM_SET_CPUID2"))?;
            if id == 0 {
                let held = fd
                    .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                    .map_err(kvm_err("KVM_GET_CPUID2"))?;
                profile_args = cpuid::kernel_args(profile, &held);
            }
            regs::setup_lapic(&fd)?;
            vm.vcpus.push(fd);
        }

        match &cfg.boot {
            BootSource::Linux {
                kernel,
                cmdline,
                initrd,
            } => {
                let k = boot::load_kernel(&vm.mem, kernel)?;
                let initrd = initrd
                    .as_ref()
                    .map(|p| boot::load_initrd(&vm.mem, mem_bytes, k.end, p))
                    .transpose()?;
                let mut extra = vec![profile_args];
                extra.extend(device_args);
                let extra = extra
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                let full = boot::insert_kernel_args(cmdline, &extra);
                boot::write_boot_params(&vm.mem, mem_bytes, &full, initrd)?;
                mptable::write(&vm.mem, cfg.vcpus)?;
                for fd in &vm.vcpus {
                    // Application processors wait for INIT/SIPI from the
                    // boot CPU; their MSRs still need boot values.
                    regs::setup_long_mode(fd, &vm.mem, k.entry, &supported_msrs)?;
                }
                vm.cmdline = Some(full);
            }
            BootSource::RealMode { code, addr } => {
                vm_memory::Bytes::write_slice(&vm.mem, code, GuestAddress(u64::from(*addr)))
                    .map_err(|_| BootError::Write("real-mode code"))?;
                regs::setup_real_mode(&vm.vcpus[0], *addr)?;
            }
        }
        if let Some(fd) = vm.vcpus.first() {
            vm.msr_list = Arc::new(crate::persist::readable_msrs(fd, &supported_msrs));
        }
        Ok(vm)
    }

    /// Rebuilds a VM from the snapshot in `dir`: guest memory is mapped
    /// copy-on-write from `dir/memory`, so restored VMs share clean pages.
    pub fn restore(
        dir: &Path,
        console: Option<Box<dyn Write + Send>>,
        serial: Option<SerialOutput>,
    ) -> Result<Self, VmError> {
        let bad = |reason: String| VmError::Incompatible {
            dir: dir.into(),
            reason,
        };
        let st: SnapshotState = snapshot::load(&dir.join("state"))?;
        let mut cfg: VmConfig = serde_json::from_str(&st.config_json)
            .map_err(|e| bad(format!("saved configuration: {e}")))?;
        if let Some(s) = serial {
            cfg.serial = s;
        }
        cfg.validate()?;
        let host = crate::host::kvm_kind().as_str();
        if st.meta.host_kvm != host {
            return Err(bad(format!(
                "it was taken on a {} KVM host; this host is {host}",
                st.meta.host_kvm
            )));
        }
        let profile = default_profile(&cfg);
        if st.meta.cpu_profile != profile {
            return Err(bad(format!(
                "it was taken with CPU profile {}; this host uses {profile}",
                st.meta.cpu_profile
            )));
        }
        if st.meta.memory_bytes != cfg.mem_bytes()
            || st.memory_regions != ram_ranges(cfg.mem_bytes())
        {
            return Err(bad("memory layout does not match its configuration".into()));
        }
        if st.vcpus.len() != usize::from(cfg.vcpus) || st.meta.vcpus != cfg.vcpus {
            return Err(bad("vCPU count does not match its configuration".into()));
        }
        if st.virtio.len() != cfg.disks.len() {
            return Err(bad(format!(
                "{} saved virtio devices, configuration has {}",
                st.virtio.len(),
                cfg.disks.len()
            )));
        }
        let mem = map_memory_file(&dir.join("memory"), &st.memory_regions).map_err(bad)?;
        let base = create_base()?;
        let sink = console_sink(&cfg, console)?;
        let (mut vm, _, _) = Self::assemble(
            &cfg,
            base,
            mem,
            |irq| {
                Serial::restore(irq, sink, &st.serial)
                    .map_err(|e| VmError::DeviceState(e.to_string()))
            },
            profile,
        )?;
        vm.attach_disks()?;
        for (t, s) in vm.virtio.iter().zip(&st.virtio) {
            devices::bus::lock(t).restore_state(s)?;
        }
        VmRef::restore(VmRef(&vm.vm_fd), &st.vm)?;
        for (id, vs) in st.vcpus.iter().enumerate() {
            let fd = vm
                .vm_fd
                .create_vcpu(id as u64)
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            VcpuRef::restore(
                VcpuRef {
                    fd: &fd,
                    msr_list: &[],
                    xsave: vm.xsave,
                },
                vs,
            )?;
            vm.vcpus.push(fd);
        }
        vm.msr_list = Arc::new(st.vcpus[0].msrs.iter().map(|m| m.0).collect());
        Ok(vm)
    }

    /// Adds the configured disks; returns their kernel command-line words.
    fn attach_disks(&mut self) -> Result<Vec<String>, VmError> {
        let disks = self.config.disks.clone();
        let mut args = Vec::new();
        for (i, d) in disks.iter().enumerate() {
            let blk = Block::new(&BlockConfig {
                path: d.path.clone(),
                read_only: d.read_only,
                id: format!("shoal-disk{i}"),
            })?;
            args.push(self.add_virtio(Box::new(blk), i)?);
        }
        Ok(args)
    }

    /// Adds a virtio device as MMIO device number `index`; returns the
    /// kernel command-line word that announces it.
    fn add_virtio(
        &mut self,
        dev: Box<dyn devices::virtio::VirtioDevice>,
        index: usize,
    ) -> Result<String, VmError> {
        let irq = VIRTIO_IRQ_BASE + index as u32;
        let base = VIRTIO_MMIO_BASE + index as u64 * MMIO_LEN;
        let line = IrqLine::new(irq).map_err(io_err("eventfd"))?;
        self.vm_fd
            .register_irqfd(line.eventfd(), irq)
            .map_err(kvm_err("KVM_IRQFD"))?;
        let t = Arc::new(Mutex::new(MmioTransport::new(dev, self.mem.clone(), line)));
        self.mmio.insert(t.clone(), base, MMIO_LEN)?;
        self.virtio.push(t);
        Ok(format!("virtio_mmio.device=4K@{base:#x}:{irq}"))
    }

    /// Adds an extra port-I/O device (tests use this for probe devices).
    pub fn add_pio_device(
        &mut self,
        dev: Arc<Mutex<dyn BusDevice>>,
        base: u16,
        len: u16,
    ) -> Result<(), VmError> {
        Ok(self.pio.insert(dev, u64::from(base), u64::from(len))?)
    }

    /// Adds an extra MMIO device.
    pub fn add_mmio_device(
        &mut self,
        dev: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), VmError> {
        Ok(self.mmio.insert(dev, base, len)?)
    }

    /// Registers `evt` to raise guest interrupt `gsi` (tests).
    pub fn register_irq(&self, evt: &EventFd, gsi: u32) -> Result<(), VmError> {
        self.vm_fd
            .register_irqfd(evt, gsi)
            .map_err(kvm_err("KVM_IRQFD"))
    }

    /// The CPUID table KVM holds for vCPU `index` (before `run`).
    pub fn vcpu_cpuid(&self, index: usize) -> Result<kvm_bindings::CpuId, VmError> {
        let fd = self.vcpus.get(index).ok_or_else(|| VmError::Io {
            what: format!("no vCPU {index}"),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_CPUID2"))
    }

    /// The CPU profile in use.
    pub fn profile(&self) -> CpuProfile {
        self.profile
    }

    /// The full kernel command line given to the guest (Linux boots only).
    pub fn cmdline(&self) -> Option<&str> {
        self.cmdline.as_deref()
    }

    /// Guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Runs the guest until it stops, or until `timeout` passes.
    pub fn run(self, timeout: Option<Duration>) -> Result<RunOutcome, VmError> {
        self.run_with(RunOptions {
            timeout,
            ..Default::default()
        })
    }

    /// Runs the guest, serving the control socket if asked for.
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
            api::serve(l, move |m| {
                devices::bus::lock(&tx).send(Event::Control(m)).is_ok()
            });
        }
        let first_run = Arc::new(OnceLock::new());
        let mut ctl = Controller {
            vcpus: Vec::new(),
            started: Instant::now(),
            paused: false,
            exit: None,
        };
        for (id, fd) in self.vcpus.drain(..).enumerate() {
            let flags = Arc::new(VcpuFlags::default());
            let (cmd_tx, cmd_rx) = mpsc::channel();
            let ctx = VcpuCtx {
                id: id as u8,
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
                first_run: first_run.clone(),
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
        drop(tx);
        let deadline = opts.timeout.map(|t| Instant::now() + t);
        while ctl.exit.is_none() {
            let ev = match deadline {
                Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                    Ok(e) => e,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        ctl.exit = Some(ExitReason::Stopped);
                        break;
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(e) => e,
                    Err(_) => break,
                },
            };
            match ev {
                Event::Vcpu(VcpuEvent::Exit(_, r)) => ctl.exit = Some(r),
                Event::Vcpu(VcpuEvent::Paused(_)) => {}
                Event::Control((req, reply)) => {
                    let resp = self.handle(&mut ctl, &rx, req);
                    let _ = reply.send(resp);
                }
            }
        }
        let exit = ctl.exit.clone().unwrap_or(ExitReason::Stopped);
        ctl.stop_all();
        let mut serial = devices::bus::lock(&self.serial);
        let sink = serial.sink_mut();
        let _ = sink.finish();
        Ok(RunOutcome {
            exit,
            first_run: first_run.get().copied(),
            first_console_byte: sink.first_byte,
        })
    }

    fn handle(&self, ctl: &mut Controller, rx: &mpsc::Receiver<Event>, req: Request) -> Response {
        match req {
            Request::Pause => match ctl.pause_all(rx) {
                Ok(_) => Response::ok(),
                Err(e) => Response::error(e),
            },
            Request::Resume => {
                ctl.resume_all();
                Response::ok()
            }
            Request::Shutdown => {
                ctl.exit = Some(ExitReason::Stopped);
                Response::ok()
            }
            Request::Stats => {
                let stats = devices::bus::lock(&self.serial).sink_mut().stats();
                Response {
                    ok: true,
                    stats: Some(Stats {
                        state: if ctl.paused { "paused" } else { "running" }.into(),
                        vcpus: self.config.vcpus,
                        memory_mib: self.config.memory_mib,
                        uptime_ms: ctl.started.elapsed().as_millis() as u64,
                        serial_bytes: stats.guest_bytes.load(Ordering::Relaxed),
                        serial_dropped: stats.dropped_bytes.load(Ordering::Relaxed),
                        pid: std::process::id(),
                    }),
                    ..Default::default()
                }
            }
            Request::Snapshot { dir } => {
                let t0 = Instant::now();
                if let Err(e) = ctl.pause_all(rx) {
                    return Response::error(e);
                }
                let pause_ms = t0.elapsed().as_secs_f64() * 1e3;
                let t1 = Instant::now();
                match self.save_snapshot(ctl, &dir) {
                    Ok((state_bytes, memory_bytes)) => Response {
                        ok: true,
                        snapshot: Some(SnapshotInfo {
                            dir,
                            state_bytes,
                            memory_bytes,
                            pause_ms,
                            save_ms: t1.elapsed().as_secs_f64() * 1e3,
                        }),
                        ..Default::default()
                    },
                    Err(e) => Response::error(format!("snapshot failed: {e}")),
                }
            }
        }
    }

    /// Writes `dir/memory` and `dir/state` (vCPUs must be paused).
    fn save_snapshot(&self, ctl: &Controller, dir: &Path) -> Result<(u64, u64), VmError> {
        std::fs::create_dir_all(dir).map_err(io_err(format!("cannot create {}", dir.display())))?;
        let mut vcpus = Vec::with_capacity(ctl.vcpus.len());
        for v in &ctl.vcpus {
            let (tx, rx) = mpsc::channel();
            v.cmds
                .send(VcpuCmd::Save(tx))
                .map_err(|_| VmError::DeviceState("vCPU thread is gone".into()))?;
            let s = rx
                .recv()
                .map_err(|_| VmError::DeviceState("vCPU thread is gone".into()))??;
            vcpus.push(s);
        }
        let vm = VmRef(&self.vm_fd).save()?;
        let serial = devices::bus::lock(&self.serial).save_state();
        let virtio = self
            .virtio
            .iter()
            .map(|t| devices::bus::lock(t).save_state())
            .collect();
        let regions: Vec<(u64, u64)> = self
            .mem
            .iter()
            .map(|r| (r.start_addr().0, r.len()))
            .collect();
        // Memory first, to a temporary name: a VM restored from an older
        // snapshot in this directory keeps its mapping of the old file.
        let mem_path = dir.join("memory");
        let tmp = dir.join("memory.tmp");
        let werr = io_err(format!("cannot write {}", mem_path.display()));
        let mut f = std::fs::File::create(&tmp)
            .map_err(io_err(format!("cannot create {}", tmp.display())))?;
        let mut total = 0u64;
        for &(start, len) in &regions {
            vm_memory::Bytes::write_all_volatile_to(
                &self.mem,
                GuestAddress(start),
                &mut f,
                len as usize,
            )
            .map_err(|e| VmError::DeviceState(format!("writing guest memory: {e}")))?;
            total += len;
        }
        f.sync_all().map_err(werr)?;
        std::fs::rename(&tmp, &mem_path)
            .map_err(io_err(format!("cannot write {}", mem_path.display())))?;
        let state = SnapshotState {
            meta: SnapshotMeta {
                vmm_version: env!("CARGO_PKG_VERSION").into(),
                host_kvm: crate::host::kvm_kind().as_str().into(),
                cpu_profile: self.profile,
                memory_bytes: self.config.mem_bytes(),
                vcpus: self.config.vcpus,
            },
            config_json: serde_json::to_string(&self.config)
                .map_err(|e| VmError::DeviceState(e.to_string()))?,
            vm,
            vcpus,
            serial,
            virtio,
            memory_regions: regions,
        };
        let state_path = dir.join("state");
        snapshot::save(&state_path, &state)?;
        let state_bytes = std::fs::metadata(&state_path).map(|m| m.len()).unwrap_or(0);
        Ok((state_bytes, total))
    }
}

/// Maps a snapshot's memory file privately (copy-on-write) at `regions`.
fn map_memory_file(path: &Path, regions: &[(u64, u64)]) -> Result<GuestMemoryMmap, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    let want: u64 = regions.iter().map(|r| r.1).sum();
    if len != want {
        return Err(format!(
            "memory file is {len} bytes, the saved layout needs {want}"
        ));
    }
    let f = Arc::new(f);
    let mut out = Vec::with_capacity(regions.len());
    let mut off = 0u64;
    for &(start, size) in regions {
        let region = vm_memory::MmapRegion::build(
            Some(vm_memory::FileOffset::from_arc(f.clone(), off)),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
        )
        .map_err(|e| format!("cannot map guest memory: {e}"))?;
        out.push(
            vm_memory::GuestRegionMmap::new(region, GuestAddress(start))
                .ok_or_else(|| "invalid memory region".to_string())?,
        );
        off += size;
    }
    GuestMemoryMmap::from_regions(out).map_err(|e| format!("invalid memory layout: {e}"))
}

/// How to run a VM.
#[derive(Debug, Default, Clone)]
pub struct RunOptions {
    /// Stop the guest after this long.
    pub timeout: Option<Duration>,
    /// Serve the control protocol on this Unix socket.
    pub api_sock: Option<std::path::PathBuf>,
}

struct VcpuHandle {
    thread: JoinHandle<()>,
    flags: Arc<VcpuFlags>,
    cmds: mpsc::Sender<VcpuCmd>,
}

/// The running VM's vCPU threads and lifecycle state.
struct Controller {
    vcpus: Vec<VcpuHandle>,
    started: Instant,
    paused: bool,
    exit: Option<ExitReason>,
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
                Ok(Event::Vcpu(VcpuEvent::Paused(_))) => waiting -= 1,
                Ok(Event::Vcpu(VcpuEvent::Exit(_, r))) => {
                    self.exit = Some(r);
                    return Err("the guest stopped while pausing".into());
                }
                Ok(Event::Control((_, reply))) => {
                    let _ = reply.send(Response::error("busy: a pause is in progress"));
                }
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

    fn resume_all(&mut self) {
        if !self.paused {
            return;
        }
        for v in &self.vcpus {
            let _ = v.cmds.send(VcpuCmd::Resume);
        }
        self.paused = false;
    }

    /// Ends every vCPU thread.
    fn stop_all(self) {
        for v in &self.vcpus {
            v.flags.stop.store(true, Ordering::Release);
            let _ = v.cmds.send(VcpuCmd::Stop);
        }
        for v in self.vcpus {
            // A vCPU only sees `stop` when KVM_RUN returns; a signal makes it
            // return. Repeat until the thread is gone (a signal that lands
            // outside KVM_RUN is harmless and re-sent).
            while !v.thread.is_finished() {
                let _ = v.thread.kill(SIGRTMIN());
                std::thread::sleep(Duration::from_micros(200));
            }
            let _ = v.thread.join();
        }
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
