//! virtio-pmem descriptor handling: hostile descriptor tables and rings
//! over real guest memory (the checks of `shoal_fuzz::queue`), with
//! request words a driver would send (flush, unknown). Also: every used
//! length is 0 or 4 (the response), the image file never changes, and
//! after a driver reset a well-formed flush succeeds.

use bolero::{check, TypeGenerator};
use pmem::{Pmem, PmemMapping};
use shoal_fuzz::queue::{pick_sizes, Kick, Rig, F_NEXT, F_WRITE};
use std::io::Write;
use std::sync::OnceLock;
use vm_memory::{Bytes, GuestAddress};

const F_VERSION_1: u64 = 1 << 32;
const IMAGE_LEN: u64 = 2 << 20;
/// Where the image is placed in guest-physical space (above the rig's RAM).
const GPA: u64 = 1 << 32;

#[derive(Debug, Clone, TypeGenerator)]
struct Request {
    flush: bool,
    word: u32,
    kick: Kick,
}

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    size: u8,
    requests: Vec<Request>,
}

fn image() -> &'static (tempfile::NamedTempFile, Vec<u8>) {
    static IMAGE: OnceLock<(tempfile::NamedTempFile, Vec<u8>)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let bytes: Vec<u8> = (0..IMAGE_LEN).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        (f, bytes)
    })
}

#[test]
fn pmem_queue() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .with_max_len(1024)
        .for_each(run);
}

thread_local! {
    /// One mapping per test thread (mapping the image is the costly part).
    static MAPPING: PmemMapping = PmemMapping::open(image().0.path(), GPA).unwrap();
}

fn run(input: &Input) {
    MAPPING.with(|m| run_on(m, input));
}

fn run_on(m: &PmemMapping, input: &Input) {
    let (file, bytes) = image();
    let sizes = pick_sizes(&[pmem::QUEUE_SIZE], &[input.size]);
    let mut rig = Rig::new(Box::new(Pmem::from_mapping(m)), F_VERSION_1, &sizes);
    for r in input.requests.iter().take(32) {
        let (q, written) = rig.load(&r.kick);
        if let Some(first) = written.first() {
            let word = if r.flush { 0 } else { r.word };
            let _ = rig.mem().write_obj(word, GuestAddress(first.addr));
        }
        rig.notify(q, &r.kick);
        for &(_, id, len) in &rig.last_used {
            assert!(len == 0 || len == 4, "chain {id}: used length {len}");
        }
    }
    rig.reset_and_reuse();
    if rig.active && rig.sizes[0] >= 2 {
        let (req, resp) = (0x20000u64, 0x21000u64);
        rig.mem().write_obj(0u32, GuestAddress(req)).unwrap();
        rig.mem()
            .write_obj(0xffff_ffffu32, GuestAddress(resp))
            .unwrap();
        rig.d.write_desc(0, req, 4, F_NEXT, 1);
        rig.d.write_desc(1, resp, 4, F_WRITE, 0);
        rig.d.publish(0);
        rig.d.notify();
        let ret: u32 = rig.mem().read_obj(GuestAddress(resp)).unwrap();
        assert_eq!(ret, 0, "a well-formed flush after reset failed");
    }
    assert_eq!(
        &std::fs::read(file.path()).unwrap(),
        bytes,
        "the image changed"
    );
}
