//! Building a VM from a [`VmConfig`] and running it to completion.

use crate::boot::{self, BootError};
use crate::config::{BootSource, ConfigError, SerialOutput, VmConfig};
use crate::cpu::cpuid;
use crate::cpu::mptable::{self, MptableError};
use crate::cpu::regs::{self, RegsError};
use crate::cpu::CpuProfile;
use crate::layout::{ram_ranges, KVM_TSS_ADDR, VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE};
use crate::vcpu::{ExitReason, VcpuCtx};
use devices::bus::BusError;
use devices::i8042::{I8042, I8042_PORT, I8042_PORT_LEN};
use devices::serial::{BoundedSink, Serial, COM1_IRQ, COM1_PORT, UART_PORT_LEN};
use devices::virtio::blk::{Block, BlockConfig, BlockError};
use devices::virtio::mmio::{MmioTransport, MMIO_LEN};
use devices::{Bus, BusDevice, IrqLine};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
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
    vm_fd: VmFd,
    mem: GuestMemoryMmap,
    vcpus: Vec<kvm_ioctls::VcpuFd>,
    pio: Bus,
    mmio: Bus,
    reset_evt: EventFd,
    serial: Arc<Mutex<Serial>>,
    profile: CpuProfile,
    cmdline: Option<String>,
}

impl Vm {
    /// Builds the VM: memory, devices, kernel, vCPUs. `console` overrides the
    /// configured serial destination (tests capture output this way).
    pub fn new(cfg: &VmConfig, console: Option<Box<dyn Write + Send>>) -> Result<Self, VmError> {
        cfg.validate()?;
        let kvm = Kvm::new().map_err(VmError::KvmOpen)?;
        let profile = cfg.cpu_profile.unwrap_or_else(|| {
            CpuProfile::auto(crate::host::kvm_kind() != crate::host::KvmKind::Hardware)
        });
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

        let mem_bytes = cfg.mem_bytes();
        let ranges: Vec<(GuestAddress, usize)> = ram_ranges(mem_bytes)
            .into_iter()
            .map(|(s, l)| (GuestAddress(s), l as usize))
            .collect();
        let mem =
            GuestMemoryMmap::from_ranges(&ranges).map_err(|_| VmError::Memory(cfg.memory_mib))?;
        for (slot, region) in mem.iter().enumerate() {
            let r = kvm_userspace_memory_region {
                slot: slot as u32,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                flags: 0,
            };
            // SAFETY: the region is a live mapping owned by `mem`, which the
            // returned Vm keeps alive for as long as the VM fd exists.
            unsafe { vm_fd.set_user_memory_region(r) }
                .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
        }

        let mut pio = Bus::new();
        let mmio = Bus::new();
        let reset_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(io_err("eventfd"))?;
        let i8042 = I8042::new(reset_evt.try_clone().map_err(io_err("eventfd"))?);
        pio.insert(Arc::new(Mutex::new(i8042)), I8042_PORT, I8042_PORT_LEN)?;

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
        let com1_irq = IrqLine::new(COM1_IRQ).map_err(io_err("eventfd"))?;
        vm_fd
            .register_irqfd(com1_irq.eventfd(), COM1_IRQ)
            .map_err(kvm_err("KVM_IRQFD"))?;
        let serial = Arc::new(Mutex::new(Serial::new(
            com1_irq,
            BoundedSink::new(out, cfg.serial_limit_bytes),
        )));
        pio.insert(serial.clone(), COM1_PORT, UART_PORT_LEN)?;

        let mut vm = Vm {
            vm_fd,
            mem,
            vcpus: vec![],
            pio,
            mmio,
            reset_evt,
            serial,
            profile,
            cmdline: None,
        };
        let mut device_args = Vec::new();
        for (i, d) in cfg.disks.iter().enumerate() {
            let blk = Block::new(&BlockConfig {
                path: d.path.clone(),
                read_only: d.read_only,
                id: format!("shoal-disk{i}"),
            })?;
            device_args.push(vm.add_virtio(Box::new(blk), i)?);
        }

        let msr_list = kvm
            .get_msr_index_list()
            .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?;
        let supported_msrs = msr_list.as_slice().to_vec();
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
        Ok(vm)
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
        let t = MmioTransport::new(dev, self.mem.clone(), line);
        self.mmio.insert(Arc::new(Mutex::new(t)), base, MMIO_LEN)?;
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
    pub fn run(mut self, timeout: Option<Duration>) -> Result<RunOutcome, VmError> {
        install_kick_handler();
        let stop = Arc::new(AtomicBool::new(false));
        let first_run = Arc::new(OnceLock::new());
        let (tx, rx) = mpsc::channel();
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        for (id, fd) in self.vcpus.drain(..).enumerate() {
            let ctx = VcpuCtx {
                id: id as u8,
                fd,
                pio: self.pio.clone(),
                mmio: self.mmio.clone(),
                mem: self.mem.clone(),
                reset_evt: self.reset_evt.try_clone().map_err(io_err("eventfd"))?,
                stop: stop.clone(),
                tx: tx.clone(),
                first_run: first_run.clone(),
            };
            let h = std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || ctx.run())
                .map_err(VmError::Thread)?;
            threads.push(h);
        }
        drop(tx);
        let exit = match timeout {
            Some(t) => match rx.recv_timeout(t) {
                Ok((_, r)) => r,
                Err(_) => ExitReason::Stopped,
            },
            None => rx.recv().map(|(_, r)| r).unwrap_or(ExitReason::Stopped),
        };
        stop.store(true, Ordering::Release);
        for h in threads {
            // A vCPU only sees `stop` when KVM_RUN returns; a signal makes it
            // return. Repeat until the thread is gone (a signal that lands
            // outside KVM_RUN is harmless and re-sent).
            while !h.is_finished() {
                let _ = h.kill(SIGRTMIN());
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = h.join();
        }
        let mut serial = devices::bus::lock(&self.serial);
        let sink = serial.sink_mut();
        let _ = sink.finish();
        Ok(RunOutcome {
            exit,
            first_run: first_run.get().copied(),
            first_console_byte: sink.first_byte,
        })
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
