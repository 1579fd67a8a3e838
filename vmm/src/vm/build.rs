//! Creating the KVM VM, its memory and devices, and booting a kernel.

use super::{console_sink, default_profile, io_err, kvm_err, Vm, VmError};
use crate::boot::{self, BootError};
use crate::config::{BootSource, VmConfig};
use crate::cpu::cpuid;
use crate::cpu::mptable;
use crate::cpu::regs;
use crate::layout::{ram_ranges, KVM_TSS_ADDR, VIRTIO_IRQ_BASE, VIRTIO_MMIO_BASE};
use crate::persist::SnapshotState;
use devices::i8042::{I8042, I8042_PORT, I8042_PORT_LEN};
use devices::serial::{BoundedSink, Serial, SerialArgs, COM1_IRQ, COM1_PORT, UART_PORT_LEN};
use devices::virtio::blk::{Block, BlockConfig};
use devices::virtio::mmio::{MmioTransport, MMIO_LEN};
use devices::virtio::persist::{MmioArgs, MmioState};
use devices::virtio::vsock::Vsock;
use devices::{Bus, BusDevice, IrqLine};
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use snapshot::Persist;
use std::io::Write;
use std::sync::{Arc, Mutex};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

/// KVM handles common to boot and restore.
pub(super) struct Base {
    pub kvm: Kvm,
    pub vm_fd: VmFd,
}

/// The KVM VM alone. Its in-kernel irqchip and PIT come later, in
/// [`Vm::finish_shell`], after every memory slot (RAM and pmem) is
/// registered: on some hosts (measured on PVM) each slot change on a VM
/// that has an irqchip waits for an expedited SRCU grace period, ~7 ms,
/// against ~0.2 ms before it.
pub(super) fn create_base() -> Result<Base, VmError> {
    let kvm = Kvm::new().map_err(VmError::KvmOpen)?;
    let vm_fd = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    vm_fd
        .set_tss_address(KVM_TSS_ADDR)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    Ok(Base { kvm, vm_fd })
}

fn register_memory(vm_fd: &VmFd, mem: &GuestMemoryMmap) -> Result<(), VmError> {
    for (slot, region) in (0u32..).zip(mem.iter()) {
        let r = kvm_userspace_memory_region {
            slot,
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

/// Anonymous guest RAM for `cfg`.
pub(super) fn anonymous_memory(cfg: &VmConfig) -> Result<GuestMemoryMmap, VmError> {
    let ranges = ram_ranges(cfg.mem_bytes())
        .into_iter()
        .map(|(s, l)| Ok((GuestAddress(s), usize::try_from(l)?)))
        .collect::<Result<Vec<_>, std::num::TryFromIntError>>()
        .map_err(|_| VmError::Memory(cfg.memory_mib))?;
    GuestMemoryMmap::from_ranges(&ranges).map_err(|_| VmError::Memory(cfg.memory_mib))
}

impl Vm {
    /// The VM shell: KVM VM and registered RAM; no irqchip, vCPUs or
    /// devices yet (map pmem images, then [`Vm::finish_shell`]). Boot,
    /// restore and pre-warm all start here.
    pub(super) fn shell(
        cfg: &VmConfig,
        base: Base,
        mem: GuestMemoryMmap,
        sink: BoundedSink,
    ) -> Result<(Vm, Kvm), VmError> {
        // COM1 proper is created by attach_devices; until then the sink
        // waits in an unattached UART.
        let serial = Serial::new(IrqLine::new(COM1_IRQ).map_err(io_err("eventfd"))?, sink);
        let Base { kvm, vm_fd } = base;
        register_memory(&vm_fd, &mem)?;
        let supported_msrs = kvm
            .get_msr_index_list()
            .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?
            .as_slice()
            .to_vec();
        let xsave = kvm.check_extension(kvm_ioctls::Cap::Xsave);
        let ram_spans = super::balloon_dev::anonymous_spans(&mem);
        let vm = Vm {
            config: cfg.clone(),
            vm_fd,
            mem,
            vcpus: Vec::new(),
            pio: Bus::new(),
            mmio: Bus::new(),
            reset_evt: EventFd::new(libc::EFD_NONBLOCK).map_err(io_err("eventfd"))?,
            serial: Arc::new(Mutex::new(serial)),
            virtio: vec![],
            irq_lines: vec![],
            profile: default_profile(cfg),
            cmdline: None,
            supported_msrs,
            msr_list: Arc::new(vec![]),
            xsave,
            loaded: false,
            subscribers: vec![],
            events: None,
            subscriber_ids: vec![],
            vsock: None,
            vsock_path: cfg.vsock.as_ref().map(|v| v.uds_path.clone()),
            memory_base: None,
            pmem: vec![],
            net: None,
            net_override: None,
            balloon: None,
            ram_spans,
            evictor: Default::default(),
        };
        Ok((vm, kvm))
    }

    /// Completes a shell once its memory slots are registered: in-kernel
    /// irqchip and PIT, then the vCPUs (KVM wants the irqchip first).
    pub(super) fn finish_shell(&mut self) -> Result<(), VmError> {
        self.vm_fd
            .create_irq_chip()
            .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config {
            flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        self.vm_fd
            .create_pit2(pit)
            .map_err(kvm_err("KVM_CREATE_PIT2"))?;
        for id in 0..self.config.vcpus {
            let fd = self
                .vm_fd
                .create_vcpu(u64::from(id))
                .map_err(kvm_err("KVM_CREATE_VCPU"))?;
            self.vcpus.push(fd);
        }
        Ok(())
    }

    /// (Re)creates the device set on fresh buses: i8042, COM1 (it keeps the
    /// current console sink), and the configured virtio devices in MMIO slot
    /// order: disks, vsock, pmem, net, balloon (the pmem images must be mapped already,
    /// see `pmem_dev`). With `saved`, COM1 and the virtio transports are
    /// restored from it ([`Persist::restore`]; activated devices are
    /// re-activated at their saved queue positions). Returns the kernel
    /// command-line words announcing the virtio devices.
    pub(super) fn attach_devices(
        &mut self,
        saved: Option<&SnapshotState>,
    ) -> Result<Vec<String>, VmError> {
        for line in self.irq_lines.drain(..) {
            // Unregistering a line we registered cannot fail in a way we
            // could act on; a stale irqfd only raises a now unused GSI.
            let _ = self.vm_fd.unregister_irqfd(line.eventfd(), line.gsi());
        }
        // Old device handlers go first: the vsock's drops its socket.
        self.drop_subscribers()?;
        self.pio = Bus::new();
        self.mmio = Bus::new();
        self.virtio.clear();
        self.vsock = None;
        self.net = None;
        self.balloon = None;
        let i8042 = I8042::new(self.reset_evt.try_clone().map_err(io_err("eventfd"))?);
        self.pio
            .insert(Arc::new(Mutex::new(i8042)), I8042_PORT, I8042_PORT_LEN)?;
        let com1_irq = self.irq_line(COM1_IRQ)?;
        let sink = self.take_sink();
        let serial = match saved {
            None => Serial::new(com1_irq, sink),
            Some(st) => Serial::restore(
                SerialArgs {
                    irq: com1_irq,
                    sink,
                },
                &st.serial,
            )
            .map_err(|e| VmError::DeviceState(e.to_string()))?,
        };
        let saved = saved.map(|st| st.virtio.as_slice());
        self.serial = Arc::new(Mutex::new(serial));
        self.pio
            .insert(self.serial.clone(), COM1_PORT, UART_PORT_LEN)?;
        let disks = self.config.disks.clone();
        let mut args = Vec::new();
        for (i, d) in disks.iter().enumerate() {
            let blk = Block::new(&BlockConfig {
                path: d.path.clone(),
                read_only: d.read_only,
                id: format!("shoal-disk{i}"),
            })?;
            args.push(self.add_virtio(Box::new(blk), i, saved)?);
        }
        if let Some(v) = self.config.vsock.clone() {
            let mut dev = Vsock::new(u64::from(v.cid), &v.uds_path)?;
            let events = dev.take_events();
            self.vsock = Some(dev.handle());
            args.push(self.add_virtio(Box::new(dev), disks.len(), saved)?);
            if let Some(e) = events {
                self.add_subscriber(Box::new(e))?;
            }
        }
        let first_pmem = disks.len() + usize::from(self.config.vsock.is_some());
        let pmem = self.pmem_devices()?;
        let net_index = first_pmem + pmem.len();
        for (j, p) in pmem.into_iter().enumerate() {
            args.push(self.add_virtio(Box::new(p.device), first_pmem + j, saved)?);
            self.mmio.insert(p.sink, p.base, p.len)?;
        }
        if let Some(n) = self.config.net.clone() {
            let tap = super::net_dev::open_tap(&n.tap)?;
            let mut dev = devices::virtio::net::Net::new(tap, &n.device_config())
                .map_err(|e| VmError::DeviceState(format!("net: {e}")))?;
            let events = dev.take_events();
            self.net = Some(dev.handle());
            args.push(self.add_virtio(Box::new(dev), net_index, saved)?);
            if let Some(e) = events {
                self.add_subscriber(Box::new(e))?;
            }
        }
        let balloon_index = net_index + usize::from(self.config.net.is_some());
        if let Some((dev, timer)) = self.balloon_device()? {
            args.push(self.add_virtio(Box::new(dev), balloon_index, saved)?);
            if let Some(t) = timer {
                self.add_subscriber(Box::new(t))?;
            }
        }
        Ok(args)
    }

    /// Hands a device's event handler to the event thread (now, if it runs).
    fn add_subscriber(&mut self, s: crate::events::Subscriber) -> Result<(), VmError> {
        match &self.events {
            Some(t) => self.subscriber_ids.push(t.add(s)?),
            None => self.subscribers.push(s),
        }
        Ok(())
    }

    /// Removes every device event handler.
    fn drop_subscribers(&mut self) -> Result<(), VmError> {
        self.subscribers.clear();
        if let Some(t) = &self.events {
            for id in self.subscriber_ids.drain(..) {
                t.remove(id)?;
            }
        }
        Ok(())
    }

    /// Control handle of the vsock device.
    pub fn vsock(&self) -> Option<&devices::virtio::vsock::VsockHandle> {
        self.vsock.as_ref()
    }

    fn irq_line(&mut self, gsi: u32) -> Result<IrqLine, VmError> {
        let line = IrqLine::new(gsi).map_err(io_err("eventfd"))?;
        self.vm_fd
            .register_irqfd(line.eventfd(), gsi)
            .map_err(kvm_err("KVM_IRQFD"))?;
        self.irq_lines.push(line.clone());
        Ok(line)
    }

    /// Adds a virtio device as MMIO device number `index` (its transport
    /// restored from `saved[index]` if given); returns the kernel
    /// command-line word that announces it.
    fn add_virtio(
        &mut self,
        dev: Box<dyn devices::virtio::VirtioDevice>,
        index: usize,
        saved: Option<&[MmioState]>,
    ) -> Result<String, VmError> {
        let irq = u32::try_from(index)
            .ok()
            .and_then(|i| VIRTIO_IRQ_BASE.checked_add(i))
            .ok_or_else(|| {
                VmError::DeviceState(format!("no interrupt for virtio device {index}"))
            })?;
        let base = VIRTIO_MMIO_BASE + index as u64 * MMIO_LEN;
        let line = self.irq_line(irq)?;
        let t = match saved {
            None => MmioTransport::new(dev, self.mem.clone(), line),
            Some(states) => {
                let s = states.get(index).ok_or_else(|| {
                    VmError::DeviceState(format!("no saved state for virtio device {index}"))
                })?;
                let args = MmioArgs {
                    device: dev,
                    mem: self.mem.clone(),
                    irq: line,
                };
                MmioTransport::restore(args, s)?
            }
        };
        let t = Arc::new(Mutex::new(t));
        self.mmio.insert(t.clone(), base, MMIO_LEN)?;
        self.virtio.push(t);
        Ok(format!("virtio_mmio.device=4K@{base:#x}:{irq}"))
    }

    /// Builds the VM: memory, devices, kernel, vCPUs. `console` overrides the
    /// configured serial destination (tests capture output this way).
    pub fn new(cfg: &VmConfig, console: Option<Box<dyn Write + Send>>) -> Result<Self, VmError> {
        cfg.validate()?;
        let base = create_base()?;
        let mem = anonymous_memory(cfg)?;
        let sink = console_sink(cfg, console)?;
        let (mut vm, kvm) = Self::shell(cfg, base, mem, sink)?;
        vm.map_pmem_for_boot()?;
        vm.finish_shell()?;
        let device_args = vm.attach_devices(None)?;
        let profile = vm.profile;

        let base_cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
        let mut profile_args = String::new();
        for (id, fd) in (0..cfg.vcpus).zip(vm.vcpus.iter()) {
            let mut c = base_cpuid.clone();
            cpuid::setup(&mut c, profile, id, cfg.vcpus);
            fd.set_cpuid2(&c).map_err(kvm_err("KVM_SET_CPUID2"))?;
            if id == 0 {
                let held = fd
                    .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                    .map_err(kvm_err("KVM_GET_CPUID2"))?;
                profile_args = cpuid::kernel_args(profile, &held);
            }
            regs::setup_lapic(fd)?;
        }

        match &cfg.boot {
            BootSource::Linux {
                kernel,
                cmdline,
                initrd,
            } => {
                let mem_bytes = cfg.mem_bytes();
                let k = boot::load_kernel(&vm.mem, kernel)?;
                vm.ram_booted(k.end);
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
                let full = vmm_api::cmdline::insert_kernel_args(cmdline, &extra);
                boot::write_boot_params(&vm.mem, mem_bytes, &full, initrd)?;
                mptable::write(&vm.mem, cfg.vcpus)?;
                for fd in &vm.vcpus {
                    // Application processors wait for INIT/SIPI from the
                    // boot CPU; their MSRs still need boot values.
                    regs::setup_long_mode(fd, &vm.mem, k.entry, &vm.supported_msrs)?;
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
            vm.msr_list = Arc::new(crate::persist::readable_msrs(fd, &vm.supported_msrs));
        }
        vm.loaded = true;
        Ok(vm)
    }

    /// Takes the console sink out of the current serial device, leaving a
    /// discarding one in its place.
    fn take_sink(&mut self) -> BoundedSink {
        let mut s = devices::bus::lock(&self.serial);
        std::mem::replace(s.sink_mut(), BoundedSink::new(Box::new(std::io::sink()), 0))
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
    pub fn profile(&self) -> crate::cpu::CpuProfile {
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

    /// Reads guest-physical MMIO address `addr` as a vCPU would (device
    /// registers, pmem config space); false when no device is there.
    /// For tests and debugging.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        self.mmio.read(addr, data)
    }
}
