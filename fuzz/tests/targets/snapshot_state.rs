//! The snapshot loader: a `state` file's bytes through the container
//! (magic, version, length, CRC, bincode body) and restore's checks
//! (`vmm::vm::fuzzing::check_state_file`). Inputs are either raw bytes or
//! a well-formed state whose body is edited (bytes overwritten, inserted,
//! cut) and re-sealed with a valid CRC, so the edits reach the decoder and
//! the checks. Checks: an error or a configuration, never a panic; memory
//! stays a small multiple of the input (a huge declared length or list
//! count allocates nothing); what is accepted is a valid configuration
//! whose disks are all read-only (no caller gave a file).

use bolero::{check, TypeGenerator};
use devices::serial::SerialState;
use devices::virtio::persist::{MmioState, QueueState};
use std::sync::OnceLock;
use vmm::persist::{SnapshotMeta, SnapshotState, VcpuState, VmState};
use vmm::{DiskConfig, VmConfig};

#[derive(Debug, Clone, TypeGenerator)]
enum Edit {
    Set { at: u32, byte: u8 },
    SetU64 { at: u32, value: u64 },
    Insert { at: u32, bytes: Vec<u8> },
    Cut { at: u32, len: u16 },
}

#[derive(Debug, Clone, TypeGenerator)]
enum Input {
    Raw(Vec<u8>),
    Edited {
        disk_rw: bool,
        edits: Vec<Edit>,
        reseal: bool,
    },
}

fn good_body(disk_rw: bool) -> Vec<u8> {
    static BODIES: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
    let b = BODIES.get_or_init(|| [body(false), body(true)]);
    b[usize::from(disk_rw)].clone()
}

/// A state as a VM with one disk would save it (on this host's KVM kind).
fn body(disk_rw: bool) -> Vec<u8> {
    let mut cfg = VmConfig::linux("/nonexistent/kernel".into());
    cfg.disks.push(DiskConfig {
        path: "/etc/passwd".into(),
        read_only: !disk_rw,
    });
    let host = vmm::host::kvm_kind();
    let profile = cfg
        .cpu_profile
        .unwrap_or_else(|| vmm::CpuProfile::auto(host != vmm::host::KvmKind::Hardware));
    let st = SnapshotState {
        meta: SnapshotMeta {
            vmm_version: "0".into(),
            host_kvm: host.as_str().into(),
            cpu_profile: profile,
            memory_bytes: cfg.mem_bytes(),
            vcpus: cfg.vcpus,
        },
        config_json: serde_json::to_string(&cfg).unwrap(),
        vm: VmState {
            pic_master: Default::default(),
            pic_slave: Default::default(),
            ioapic: Default::default(),
            pit: Default::default(),
            clock: Default::default(),
        },
        vcpus: (0..cfg.vcpus).map(|_| vcpu()).collect(),
        serial: SerialState {
            regs: [0; 9],
            in_buffer: vec![],
        },
        // The disk's transport, as a driver left it before DRIVER_OK.
        virtio: vec![MmioState {
            device_type: 2,
            status: 3,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            config_generation: 0,
            activated: false,
            interrupt_status: 0,
            queues: vec![QueueState {
                max_size: 256,
                next_avail: 0,
                next_used: 0,
                event_idx_enabled: false,
                size: 256,
                ready: false,
                desc_table: 0,
                avail_ring: 0,
                used_ring: 0,
            }],
        }],
        memory_regions: vmm::layout::ram_ranges(cfg.mem_bytes()),
        vsock_had_connections: false,
        diff_base: None,
        diff_pages: vec![],
        pmem: vec![],
    };
    let mut out = Vec::new();
    snapshot::write_to(&mut out, &st).unwrap();
    out[24..].to_vec()
}

fn vcpu() -> VcpuState {
    VcpuState {
        cpuid: vec![Default::default(); 2],
        msrs: vec![(0x10, 1)],
        regs: Default::default(),
        sregs: Default::default(),
        fpu: vec![0; 416],
        xsave: None,
        xcrs: None,
        debugregs: Default::default(),
        lapic: Default::default(),
        mp_state: Default::default(),
        events: Default::default(),
        tsc_khz: None,
    }
}

fn seal(body: &[u8], reseal: bool) -> Vec<u8> {
    let mut f = Vec::with_capacity(24 + body.len());
    f.extend_from_slice(&snapshot::MAGIC);
    f.extend_from_slice(&snapshot::FORMAT_VERSION.to_le_bytes());
    f.extend_from_slice(&(body.len() as u64).to_le_bytes());
    let crc = if reseal { crc(body) } else { 0 };
    f.extend_from_slice(&crc.to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// CRC-32 (IEEE), as the container uses.
fn crc(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[test]
fn snapshot_state() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .for_each(run);
}

fn run(input: &Input) {
    let file = match input {
        Input::Raw(b) => b.clone(),
        Input::Edited {
            disk_rw,
            edits,
            reseal,
        } => {
            let mut b = good_body(*disk_rw);
            for e in edits.iter().take(8) {
                let at = |x: u32| x as usize % (b.len() + 1);
                match e {
                    Edit::Set { at: i, byte } => {
                        let i = at(*i);
                        if i < b.len() {
                            b[i] = *byte;
                        }
                    }
                    Edit::SetU64 { at: i, value } => {
                        let i = at(*i);
                        let end = (i + 8).min(b.len());
                        b[i..end].copy_from_slice(&value.to_le_bytes()[..end - i]);
                    }
                    Edit::Insert { at: i, bytes } => {
                        let i = at(*i);
                        b.splice(i..i, bytes.iter().copied());
                    }
                    Edit::Cut { at: i, len } => {
                        let i = at(*i);
                        let end = (i + usize::from(*len)).min(b.len());
                        b.drain(i..end);
                    }
                }
            }
            seal(&b, *reseal)
        }
    };
    let (r, peak) = shoal_fuzz::peak_alloc(|| vmm::vm::fuzzing::check_state_file(&file));
    let limit = 16 * file.len() + (4 << 20);
    assert!(
        peak <= limit,
        "a {}-byte state file made the loader allocate {peak} bytes",
        file.len()
    );
    if let Ok(cfg) = r {
        cfg.validate().expect("an accepted configuration is valid");
        assert!(
            cfg.disks.iter().all(|d| d.read_only),
            "a saved writable disk would be opened without the caller giving it"
        );
    }
}

#[test]
fn the_unedited_states_are_judged_as_restore_would() {
    // Read-only disk: accepted; writable disk without a file: refused.
    vmm::vm::fuzzing::check_state_file(&seal(&good_body(false), true)).unwrap();
    let e = vmm::vm::fuzzing::check_state_file(&seal(&good_body(true), true))
        .unwrap_err()
        .to_string();
    assert!(e.contains("is writable"), "{e}");
}

/// A state file that declares the largest body allowed (64 MiB) but holds
/// a few bytes: reported truncated, after allocating about what is there.
#[test]
fn a_huge_length_prefix_allocates_nothing() {
    let mut f = seal(&good_body(false), true);
    f[12..20].copy_from_slice(&snapshot::MAX_STATE_BYTES.to_le_bytes());
    let (r, peak) = shoal_fuzz::peak_alloc(|| vmm::vm::fuzzing::check_state_file(&f));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    assert!(
        peak < 4 << 20,
        "a {}-byte file made the loader allocate {peak} bytes",
        f.len()
    );
}
