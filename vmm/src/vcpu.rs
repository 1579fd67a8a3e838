//! The vCPU run loop: one thread per vCPU, routing I/O exits to the buses
//! and reporting how the guest stopped.

use crate::persist::{StateError, VcpuRef, VcpuState};
use devices::Bus;
use kvm_ioctls::{VcpuExit, VcpuFd};
use snapshot::Persist;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

/// Why the guest stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest asked for a reset (i8042 or KVM system event): `reboot`.
    Reset,
    /// The guest asked to power off (KVM system event).
    PowerOff,
    /// Triple fault.
    TripleFault,
    /// The VMM stopped the guest (timeout or shutdown request).
    Stopped,
    /// A fatal error: KVM internal error, failed entry, or an unexpected exit.
    Error(String),
}

impl ExitReason {
    /// Process exit status the VMM binary uses for this reason.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Reset | Self::PowerOff | Self::Stopped => 0,
            Self::TripleFault => 3,
            Self::Error(_) => 1,
        }
    }
}

/// What a vCPU thread reports to the VM's controller, tagged with the
/// thread's generation (see [`VcpuCtx::generation`]).
pub struct VcpuReport {
    /// The reporting thread's generation.
    pub generation: u64,
    /// What happened.
    pub event: VcpuEvent,
}

/// What happened on a vCPU thread.
pub enum VcpuEvent {
    /// The guest stopped (the thread has ended).
    Exit(u8, ExitReason),
    /// The vCPU is parked, waiting for a [`VcpuCmd`].
    Paused(u8),
}

/// Commands to a parked vCPU.
pub enum VcpuCmd {
    /// Enter the guest again.
    Resume,
    /// Save the vCPU's state and stay parked.
    Save(Sender<Result<VcpuState, StateError>>),
    /// End the thread.
    Stop,
}

/// Flags the controller sets; the vCPU checks them whenever KVM_RUN returns.
#[derive(Default)]
pub struct VcpuFlags {
    /// Park and wait for commands.
    pub pause: AtomicBool,
    /// End the thread.
    pub stop: AtomicBool,
}

/// Everything one vCPU thread needs. Reports go to the controller's inbox,
/// whose message type `E` carries them (and whatever else the controller
/// waits for).
pub struct VcpuCtx<E> {
    /// Index of this vCPU.
    pub id: u8,
    /// Which start of the vCPUs this thread belongs to; the controller
    /// ignores events from threads it has already stopped.
    pub generation: u64,
    /// The KVM vCPU.
    pub fd: VcpuFd,
    /// Port-I/O bus.
    pub pio: Bus,
    /// MMIO bus.
    pub mmio: Bus,
    /// Guest memory, for error reports.
    pub mem: GuestMemoryMmap,
    /// Written by the i8042 on a reset request.
    pub reset_evt: EventFd,
    /// Pause/stop requests.
    pub flags: Arc<VcpuFlags>,
    /// Commands while parked.
    pub cmds: Receiver<VcpuCmd>,
    /// MSRs to save.
    pub msr_list: Arc<Vec<u32>>,
    /// Whether XSAVE state is saved.
    pub xsave: bool,
    /// Where exits and pauses are reported.
    pub tx: Sender<E>,
    /// When the first vCPU first entered the guest.
    pub first_run: Arc<OnceLock<Instant>>,
    /// Seccomp filters; the thread installs the vCPU role's before it
    /// first enters the guest.
    pub seccomp: Option<Arc<crate::seccomp::Filters>>,
}

const I8042_COMMAND_PORT: u16 = 0x64;
const KVM_SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const KVM_SYSTEM_EVENT_RESET: u32 = 2;

impl<E: From<VcpuReport>> VcpuCtx<E> {
    /// Runs until the guest stops or `stop` is set; reports the reason.
    /// Runs the loop; returns the vCPU so the VM can load it again.
    pub fn run(mut self) -> VcpuFd {
        let installed = match &self.seccomp {
            Some(f) => f.install(crate::seccomp::Role::Vcpu),
            None => Ok(()),
        };
        let reason = match installed {
            Ok(()) => self.run_loop(),
            Err(e) => ExitReason::Error(e.to_string()),
        };
        self.report(VcpuEvent::Exit(self.id, reason));
        self.fd
    }

    fn report(&self, event: VcpuEvent) {
        // The controller is gone only when the VM is going away.
        let _ = self.tx.send(E::from(VcpuReport {
            generation: self.generation,
            event,
        }));
    }

    /// Parks until resumed; `false` means the thread must end.
    fn park(&mut self) -> bool {
        self.report(VcpuEvent::Paused(self.id));
        loop {
            match self.cmds.recv() {
                // The controller cleared `pause` before sending this; if it
                // is set again, the run loop parks again at once.
                Ok(VcpuCmd::Resume) => return true,
                Ok(VcpuCmd::Save(reply)) => {
                    let r = VcpuRef {
                        fd: &self.fd,
                        msr_list: &self.msr_list,
                        xsave: self.xsave,
                    }
                    .save();
                    let _ = reply.send(r);
                }
                Ok(VcpuCmd::Stop) | Err(_) => return false,
            }
        }
    }

    fn run_loop(&mut self) -> ExitReason {
        loop {
            if self.flags.stop.load(Ordering::Acquire) {
                return ExitReason::Stopped;
            }
            if self.flags.pause.load(Ordering::Acquire) {
                if !self.park() {
                    return ExitReason::Stopped;
                }
                continue;
            }
            self.first_run.get_or_init(Instant::now);
            match self.fd.run() {
                Ok(VcpuExit::IoOut(port, data)) => {
                    self.pio.write(u64::from(port), data);
                    if port == I8042_COMMAND_PORT && self.reset_evt.read().is_ok() {
                        return ExitReason::Reset;
                    }
                }
                Ok(VcpuExit::IoIn(port, data)) => {
                    if !self.pio.read(u64::from(port), data) {
                        data.fill(0xff);
                    }
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    if !self.mmio.read(addr, data) {
                        data.fill(0);
                    }
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    self.mmio.write(addr, data);
                }
                Ok(VcpuExit::Hlt) => {
                    // Only reached without an in-kernel irqchip.
                    return ExitReason::Error("vCPU halted with no irqchip".into());
                }
                Ok(VcpuExit::Shutdown) => return ExitReason::TripleFault,
                Ok(VcpuExit::SystemEvent(ty, _)) => {
                    return match ty {
                        KVM_SYSTEM_EVENT_RESET => ExitReason::Reset,
                        KVM_SYSTEM_EVENT_SHUTDOWN => ExitReason::PowerOff,
                        t => ExitReason::Error(format!("unexpected KVM system event {t}")),
                    }
                }
                Ok(VcpuExit::InternalError) => return ExitReason::Error(self.internal_error()),
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return ExitReason::Error(format!(
                        "KVM failed to enter the guest on vCPU {}: hardware reason {reason:#x} (cpu {cpu}); {}",
                        self.id,
                        self.where_()
                    ))
                }
                Ok(other) => {
                    let what = format!("{other:?}");
                    return ExitReason::Error(format!(
                        "unexpected vCPU exit {what}; {}",
                        self.where_()
                    ));
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    // Kicked by the VMM or interrupted: re-check `stop`.
                }
                Err(e) => return ExitReason::Error(format!("KVM_RUN failed: {e}")),
            }
        }
    }

    fn internal_error(&mut self) -> String {
        // SAFETY: the last exit was KVM_EXIT_INTERNAL_ERROR, so the kernel
        // filled the `internal` member of the exit union; we only read it.
        let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
        let what = match suberror {
            1 => "emulation failure",
            2 => "simultaneous exception",
            3 => "delivery event",
            _ => "internal error",
        };
        let mut s = format!(
            "KVM internal error on vCPU {} (suberror {suberror}: {what}); {}",
            self.id,
            self.where_()
        );
        if crate::host::is_pvm() {
            s.push_str(
                ". On this PVM host this usually means the host's instruction emulator lacks \
                 that instruction (host `dmesg | grep kvm-pvm` shows it); check the CPU profile \
                 and the guest kernel's shoal.pvm patches",
            );
        }
        s
    }

    /// "rip=... (gpa ...) bytes: ..." for error reports.
    fn where_(&self) -> String {
        let Ok(regs) = self.fd.get_regs() else {
            return "registers unavailable".into();
        };
        let mut s = format!("guest rip={:#x}", regs.rip);
        let gpa = self
            .fd
            .translate_gva(regs.rip)
            .ok()
            .filter(|t| t.valid != 0)
            .map(|t| t.physical_address);
        match gpa {
            Some(pa) => {
                let mut bytes = [0u8; 16];
                if self.mem.read_slice(&mut bytes, GuestAddress(pa)).is_ok() {
                    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
                    s.push_str(&format!(
                        " (gpa {pa:#x}) instruction bytes: {}",
                        hex.join(" ")
                    ));
                } else {
                    s.push_str(&format!(" (gpa {pa:#x}, outside guest RAM)"));
                }
            }
            None => s.push_str(" (not translatable)"),
        }
        s
    }
}
