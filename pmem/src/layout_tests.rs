use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The VMM's RAM layout: RAM below the gap, the rest above 4 GiB.
fn ram(mem: u64) -> Vec<(u64, u64)> {
    if mem <= MMIO_GAP_START {
        vec![(0, mem)]
    } else {
        vec![(0, MMIO_GAP_START), (MMIO_GAP_END, mem - MMIO_GAP_START)]
    }
}

#[test]
fn small_guest_places_at_4g_on_sections() {
    let r = place(&ram(128 * MIB), &[2 * MIB, 130 * MIB, 4 * MIB]).unwrap();
    assert_eq!(
        r[0],
        GuestRange {
            start: 4 * GIB,
            len: 2 * MIB
        }
    );
    // The next device starts on the next 128 MiB section.
    assert_eq!(r[1].start, 4 * GIB + 128 * MIB);
    // 130 MiB spans two sections; the third device starts after them.
    assert_eq!(r[2].start, 4 * GIB + 384 * MIB);
    for g in &r {
        assert_eq!(g.start % PLACEMENT_ALIGN, 0);
        assert_eq!(g.len % IMAGE_ALIGN, 0);
    }
    check_placement(&ram(128 * MIB), &r).unwrap();
}

#[test]
fn large_guest_places_above_ram() {
    // 5 GiB of RAM: 3 GiB below the gap, 2 GiB from 4 GiB to 6 GiB.
    let mem = ram(5 * GIB);
    let r = place(&mem, &[64 * MIB]).unwrap();
    assert_eq!(r[0].start, 6 * GIB);
    // RAM ending off a section boundary rounds up.
    let mem = ram(5 * GIB + 2 * MIB);
    let r = place(&mem, &[64 * MIB, 64 * MIB]).unwrap();
    assert_eq!(r[0].start, 6 * GIB + 128 * MIB);
    assert_eq!(r[1].start, 6 * GIB + 256 * MIB);
    for g in &r {
        for &(s, l) in &mem {
            assert!(g.start >= s + l || g.start + g.len <= s, "overlaps RAM");
        }
        assert!(g.start >= MMIO_GAP_END);
    }
}

#[test]
fn placement_is_deterministic_and_empty_is_fine() {
    let a = place(&ram(512 * MIB), &[2 * MIB, 6 * MIB]).unwrap();
    let b = place(&ram(512 * MIB), &[2 * MIB, 6 * MIB]).unwrap();
    assert_eq!(a, b);
    assert!(place(&ram(512 * MIB), &[]).unwrap().is_empty());
}

#[test]
fn bad_sizes_refused() {
    assert_eq!(
        place(&ram(128 * MIB), &[2 * MIB, 0]).unwrap_err(),
        LayoutError::BadSize { index: 1, len: 0 }
    );
    assert_eq!(
        place(&ram(128 * MIB), &[3 * MIB]).unwrap_err(),
        LayoutError::BadSize {
            index: 0,
            len: 3 * MIB
        }
    );
}

#[test]
fn out_of_space_refused_without_overflow() {
    let err = place_within(&ram(128 * MIB), &[2 * MIB], 4 * GIB + MIB).unwrap_err();
    assert!(matches!(err, LayoutError::OutOfSpace { index: 0, .. }));
    let huge = !(IMAGE_ALIGN - 1);
    let err = place(&ram(128 * MIB), &[huge]).unwrap_err();
    assert!(matches!(err, LayoutError::OutOfSpace { .. }));
    // RAM reaching the top of the address space.
    let err = place(&[(0, u64::MAX)], &[2 * MIB]).unwrap_err();
    assert!(matches!(err, LayoutError::OutOfSpace { .. }));
}

#[test]
fn check_placement_catches_every_conflict() {
    let mem = ram(5 * GIB);
    let ok = GuestRange {
        start: 8 * GIB,
        len: 2 * MIB,
    };
    check_placement(&mem, &[ok]).unwrap();
    // In RAM (below and above the gap).
    for start in [0, 64 * MIB, 4 * GIB, 6 * GIB - 2 * MIB] {
        let r = GuestRange {
            start,
            len: 4 * MIB,
        };
        assert!(
            matches!(
                check_placement(&mem, &[r]),
                Err(LayoutError::OverlapsRam { .. })
            ),
            "{start:#x}"
        );
    }
    // In the MMIO gap (with little RAM, so only the gap conflicts).
    let r = GuestRange {
        start: 0xd000_0000,
        len: 2 * MIB,
    };
    assert!(matches!(
        check_placement(&ram(128 * MIB), &[r]),
        Err(LayoutError::OverlapsGap { .. })
    ));
    // Straddling the end of the gap.
    let r = GuestRange {
        start: MMIO_GAP_END - 2 * MIB,
        len: 4 * MIB,
    };
    assert!(matches!(
        check_placement(&ram(128 * MIB), &[r]),
        Err(LayoutError::OverlapsGap { .. })
    ));
    // Two devices overlapping.
    let b = GuestRange {
        start: 8 * GIB,
        len: 4 * MIB,
    };
    assert_eq!(
        check_placement(&mem, &[ok, b]),
        Err(LayoutError::OverlapsDevice { a: 0, b: 1 })
    );
    // Misaligned start, bad size, past the limit, wrapping.
    let r = GuestRange {
        start: 8 * GIB + 4096,
        len: 2 * MIB,
    };
    assert!(matches!(
        check_placement(&mem, &[r]),
        Err(LayoutError::Misaligned { .. })
    ));
    let r = GuestRange {
        start: 8 * GIB,
        len: MIB,
    };
    assert!(matches!(
        check_placement(&mem, &[r]),
        Err(LayoutError::BadSize { .. })
    ));
    let r = GuestRange {
        start: PHYS_LIMIT,
        len: 2 * MIB,
    };
    assert!(matches!(
        check_placement(&mem, &[r]),
        Err(LayoutError::OutOfSpace { .. })
    ));
    let r = GuestRange {
        start: !(IMAGE_ALIGN - 1),
        len: 4 * MIB,
    };
    assert!(matches!(
        check_placement(&mem, &[r]),
        Err(LayoutError::OutOfSpace { .. })
    ));
}

#[test]
fn memmap_overhead() {
    assert_eq!(guest_memmap_overhead(GIB), 16 * MIB);
}
