//! The peer of `shoal bench net`: QEMU `-M microvm` booting our kernel and
//! root image (virtio-blk, read-only) with a virtio-net device on the test
//! host's TAP ([`QEMU_TAP`], in the test host's namespace: no routing, no
//! policy between the guest and the servers). Its init runs the same guest
//! script as the Shoal sandbox (fetched from the test host), then the guest
//! reboots, which `-no-reboot` turns into QEMU's exit. QEMU runs in a
//! cgroup beside the sandboxes' (see [`confine`]).

use crate::bench_net_host::{TestHost, HTTP_PORT, QEMU_TAP};
use anyhow::{bail, Context, Result};
use shoal_jailer::cgroup::{plan_here, Cgroup};
use shoal_jailer::CgroupSpec;
use shoal_runtime::console_lines::ConsoleLines;
use shoal_runtime::launch::{BootSpec, Monitor, RootKind, EXIT_PREFIX};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Console lines kept for an error message.
const TAIL_LINES: usize = 40;

/// What the peer boots.
pub struct QemuPeer {
    /// vmlinux (with CONFIG_PVH, as QEMU needs).
    pub kernel: PathBuf,
    /// The `tiny` erofs image.
    pub root: PathBuf,
    /// The base kernel command line.
    pub cmdline: String,
    /// Kernel words of the CPU profile (QEMU does not hide CPU features).
    pub kernel_args: String,
    /// Boot to exit limit.
    pub timeout: Duration,
    /// QEMU's default virtio-net features (checksum and segmentation
    /// offloads, mergeable receive buffers, event index), or none of
    /// them (MAC and link status only: a baseline without offloads).
    pub offloads: bool,
}

/// The device options that leave QEMU's virtio-net with MAC and link
/// status only (no offloads, mergeable buffers or event index).
const NO_OFFLOADS: &str = "csum=off,guest_csum=off,gso=off,guest_tso4=off,guest_tso6=off,\
guest_ecn=off,guest_ufo=off,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,\
mrg_rxbuf=off,event_idx=off,indirect_desc=off,ctrl_vq=off,ctrl_rx=off,ctrl_vlan=off,\
ctrl_rx_extra=off,ctrl_mac_addr=off,ctrl_guest_offloads=off,guest_announce=off";

/// A QEMU process, killed and reaped when dropped (then its cgroup
/// removed).
struct Running(Child, Option<Cgroup>);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if let Some(cg) = &self.1 {
            cg.remove(Duration::from_secs(5));
        }
    }
}

/// Puts `pid` (all its threads) in a cgroup of its own beside the jailed
/// sandbox VMMs' (`<own cgroup>/shoal/<id>`, the same CPU weight), so the
/// peer competes for the CPU as one sandbox does, not as a task of the
/// root group (where it would weigh as much as every sandbox together).
fn confine(id: &str, pid: u32) -> Result<Cgroup> {
    let spec = CgroupSpec {
        cpu_weight: Some(shoal_runtime::jail::CPU_WEIGHT),
        ..Default::default()
    };
    let cg = Cgroup::create(plan_here(id, &spec).context("the peer's cgroup")?)
        .context("the peer's cgroup")?;
    for d in &cg.plan().dirs {
        std::fs::write(d.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving QEMU into {}", d.display()))?;
    }
    Ok(cg)
}

impl QemuPeer {
    /// Its name in the report.
    pub fn name(&self) -> &'static str {
        if self.offloads {
            "qemu-microvm"
        } else {
            "qemu-no-offload"
        }
    }

    /// The monitor command line (run inside the test host's namespace,
    /// where its TAP is).
    fn command(&self, host: &TestHost) -> Result<Command> {
        let guest = host.qemu_guest;
        let init = format!(
            "\"ip addr add {guest}/24 dev eth0 && ip link set eth0 up && \
             wget -q -O /tmp/s http://{}:{HTTP_PORT}/script && sh /tmp/s\"",
            host.tap_addr
        );
        let spec = BootSpec {
            kernel: self.kernel.clone(),
            root: self.root.clone(),
            root_kind: RootKind::Blk,
            cmdline: self.cmdline.clone(),
            init_args: vec!["/bin/sh".into(), "-c".into(), init],
            memory_mib: 128,
            vcpus: 1,
            vsock_uds: None,
            extra_pmem: vec![],
            upper_disk: None,
            upper_size_mib: None,
        };
        // The boot benchmark's QEMU microvm line (runtime::launch) plus a
        // virtio-net device on the TAP. QEMU puts the first device (the
        // root disk, named by launch) on the last of microvm's eight
        // virtio-mmio transports and the next on the one before; it would
        // append these words after the init's " -- " itself, so the net
        // device's is named here.
        let qemu = spec.command(&Monitor::QemuMicrovm {
            kernel_args: format!("{} virtio_mmio.device=512@0xfeb00c00:11", self.kernel_args),
        })?;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.ns])
            .arg(qemu.get_program())
            .args(qemu.get_args())
            .arg("-netdev")
            .arg(format!(
                "tap,id=n0,ifname={QEMU_TAP},script=no,downscript=no"
            ))
            .arg("-device")
            .arg(format!(
                "virtio-net-device,netdev=n0,mac=02:5a:0a:d6:00:02{}",
                if self.offloads {
                    String::new()
                } else {
                    format!(",{NO_OFFLOADS}")
                }
            ));
        Ok(c)
    }

    /// Boots the peer and waits until its script has run (the guest's
    /// `SHOAL-EXIT 0`) and QEMU has exited; `progress` gets the guest's
    /// console lines that are not the kernel's.
    pub fn run(&self, host: &TestHost, progress: &mut dyn FnMut(&str)) -> Result<()> {
        let mut cmd = self.command(host)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = Running(
            cmd.spawn()
                .context("cannot start qemu-system-x86_64 (apt-get install qemu-system-x86)")?,
            None,
        );
        let id = format!("{}-{}", host.ns, self.name());
        child.1 = Some(confine(&id, child.0.id())?);
        let (tx, rx) = mpsc::channel::<String>();
        let out = child.0.stdout.take();
        let err = child.0.stderr.take();
        let tx2 = tx.clone();
        std::thread::spawn(move || {
            for l in out.into_iter().flat_map(ConsoleLines::new) {
                if tx.send(String::from_utf8_lossy(&l).into_owned()).is_err() {
                    break;
                }
            }
        });
        std::thread::spawn(move || {
            for l in err.into_iter().flat_map(ConsoleLines::new) {
                if tx2
                    .send(format!("qemu: {}", String::from_utf8_lossy(&l)))
                    .is_err()
                {
                    break;
                }
            }
        });
        let end = Instant::now() + self.timeout;
        let mut tail: Vec<String> = vec![];
        let mut exit = None;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "the QEMU peer did not finish within {:?}; its console:\n{}",
                    self.timeout,
                    tail.join("\n")
                );
            }
            match rx.recv_timeout(left.min(Duration::from_millis(500))) {
                Ok(l) => {
                    let l = l.trim_end_matches('\r').to_string();
                    if let Some(c) = l.trim().strip_prefix(EXIT_PREFIX) {
                        exit = c.trim().parse::<i32>().ok();
                    }
                    // Kernel lines start with "[  time]".
                    if !l.starts_with('[') {
                        progress(&format!("qemu guest: {l}"));
                    }
                    tail.push(l);
                    if tail.len() > TAIL_LINES {
                        tail.remove(0);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Both streams closed: QEMU has exited.
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.0.wait()?;
        if exit != Some(0) {
            bail!(
                "the QEMU peer's script failed (guest exit {exit:?}, QEMU {status}); its console:\n{}",
                tail.join("\n")
            );
        }
        Ok(())
    }
}
