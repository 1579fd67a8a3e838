//! CPUID set-up and named CPU profiles.
//!
//! `host` passes through what KVM supports. `pvm` additionally hides the
//! features whose instructions the PVM host's in-kernel emulator cannot run
//! (measured; see `shared/KVM-ON-THIS-MACHINE.md`): a guest kernel that sees
//! them takes code paths that stop the VM with an internal error.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A named set of CPU features exposed to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuProfile {
    /// Everything KVM supports.
    Host,
    /// Host minus what PVM's instruction emulator lacks.
    Pvm,
}

impl CpuProfile {
    /// The profile that fits the detected host.
    pub fn auto(host_is_pvm: bool) -> Self {
        if host_is_pvm {
            Self::Pvm
        } else {
            Self::Host
        }
    }
}

impl fmt::Display for CpuProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Host => "host",
            Self::Pvm => "pvm",
        })
    }
}

impl FromStr for CpuProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Self::Host),
            "pvm" => Ok(Self::Pvm),
            o => Err(format!("unknown CPU profile '{o}' (expected host or pvm)")),
        }
    }
}

// (leaf, subleaf or None for all, register, bit) hidden by the PVM profile.
#[derive(Clone, Copy)]
enum Reg {
    Ebx,
    Ecx,
    Edx,
}

/// (leaf, subleaf, register, bit, name, Linux `X86_FEATURE_*` number).
type Hidden = (u32, Option<u32>, Reg, u32, &'static str, u16);

const PVM_HIDDEN: &[Hidden] = &[
    (1, None, Reg::Ecx, 13, "cx16", 141),
    (1, None, Reg::Ecx, 26, "xsave", 154),
    (1, None, Reg::Ecx, 27, "osxsave", 155),
    (1, None, Reg::Ecx, 28, "avx", 156),
    (1, None, Reg::Ecx, 12, "fma", 140),
    (1, None, Reg::Ecx, 29, "f16c", 157),
    (1, None, Reg::Ecx, 23, "popcnt", 151),
    (1, None, Reg::Ecx, 30, "rdrand", 158),
    (1, None, Reg::Ecx, 22, "movbe", 150),
    (7, Some(0), Reg::Ebx, 0, "fsgsbase", 288),
    (7, Some(0), Reg::Ebx, 5, "avx2", 293),
    (7, Some(0), Reg::Ebx, 9, "erms", 297),
    (7, Some(0), Reg::Ebx, 10, "invpcid", 298),
    (7, Some(0), Reg::Ebx, 11, "rtm", 299),
    (7, Some(0), Reg::Ebx, 16, "avx512f", 304),
    (7, Some(0), Reg::Ebx, 18, "rdseed", 306),
    (7, Some(0), Reg::Ebx, 20, "smap", 308),
    (7, Some(0), Reg::Ebx, 23, "clflushopt", 311),
    (7, Some(0), Reg::Ebx, 24, "clwb", 312),
    (7, Some(0), Reg::Ecx, 3, "pku", 515),
    (7, Some(0), Reg::Ecx, 4, "ospke", 516),
    (7, Some(0), Reg::Ecx, 16, "la57", 528),
    (7, Some(0), Reg::Ecx, 22, "rdpid", 534),
    (7, Some(0), Reg::Edx, 4, "fsrm", 580),
    (7, Some(0), Reg::Edx, 14, "serialize", 590),
    (0x8000_0001, None, Reg::Edx, 27, "rdtscp", 59),
];

/// Names of the features the PVM profile hides (for `--check-host`).
pub fn pvm_hidden_names() -> Vec<&'static str> {
    PVM_HIDDEN.iter().map(|h| h.4).collect()
}

fn reg_mut(e: &mut kvm_cpuid_entry2, r: Reg) -> &mut u32 {
    match r {
        Reg::Ebx => &mut e.ebx,
        Reg::Ecx => &mut e.ecx,
        Reg::Edx => &mut e.edx,
    }
}

/// Features the PVM profile hides that are still visible in `table` (the
/// CPUID KVM actually holds for a vCPU): some PVM hosts keep bits set
/// whatever the VMM asks. Returns (name, Linux feature number).
pub fn still_visible(table: &CpuId) -> Vec<(&'static str, u16)> {
    PVM_HIDDEN
        .iter()
        .filter(|&&(leaf, sub, reg, bit, _, _)| {
            table.as_slice().iter().any(|e| {
                let v = match reg {
                    Reg::Ebx => e.ebx,
                    Reg::Ecx => e.ecx,
                    Reg::Edx => e.edx,
                };
                e.function == leaf && sub.is_none_or(|s| s == e.index) && v & (1 << bit) != 0
            })
        })
        .map(|h| (h.4, h.5))
        .collect()
}

/// On PVM hosts guest user code runs on the host CPU with AVX enabled, but
/// the guest kernel (XSAVE hidden) only switches x87/SSE state between
/// processes, so the upper halves of YMM/ZMM registers leak between guest
/// processes (measured: glibc string functions crashed one pipeline in
/// three). The kernel passes this word to init as an environment variable,
/// and the guest agent hands it to every command: glibc then uses its
/// SSE2 code paths. (Programs that use AVX directly remain at risk on PVM
/// hosts; hardware KVM is unaffected.)
pub const PVM_GLIBC_TUNABLES: &str =
    "GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX_Fast_Unaligned_Load";

/// The guest's busy tick runs every this many jiffies on PVM hosts
/// (`shoal.tick_mult=`, our kernel patch 0007): there a tick costs the
/// guest ~4,000 emulated instructions (~5 ms), and while the guest was busy
/// its 100 Hz tick took ~40% of its instructions (measured with the
/// `kvm:kvm_emulate_insn` tracepoint over a restore and agent hand-shake).
/// Idle guests have no tick either way (NO_HZ_IDLE).
pub const PVM_TICK_MULT: u32 = 4;

/// Kernel command-line words for `profile`, given the CPUID KVM holds:
/// on PVM, `shoal.pvm` (the guest kernel's gated work-arounds),
/// `shoal.tick_mult=` ([`PVM_TICK_MULT`]), `no-kvmapf` (KVM answers the
/// restore of an enabled async-page-fault MSR with a "wake all" event that
/// costs a PVM guest ~4,000 emulated instructions per restore; this host
/// has no swap for async page faults to hide),
/// `clocksource=kvm-clock` (the host ignores guest TSC writes),
/// `percpu_alloc=page` (no 2 MiB per-CPU unit to zero at boot), a
/// `clearcpuid=` list for features the host would not hide, and
/// [`PVM_GLIBC_TUNABLES`].
pub fn kernel_args(profile: CpuProfile, table: &CpuId) -> String {
    match profile {
        CpuProfile::Host => String::new(),
        CpuProfile::Pvm => {
            // The PVM host ignores writes to the guest TSC (no TSC offset):
            // a restored guest reads the host's TSC, ahead of its snapshot
            // by however long the snapshot waited, and a TSC clocksource
            // would then make its timekeeping catch up second by second
            // (measured: ~0.4 s of guest CPU after restoring a 30-minute-old
            // snapshot). kvm-clock is restored by KVM_SET_CLOCK and continues
            // from the snapshot's time.
            let mut words = vec![
                "shoal.pvm".to_string(),
                format!("shoal.tick_mult={PVM_TICK_MULT}"),
                "no-kvmapf".to_string(),
                "clocksource=kvm-clock".to_string(),
                // Per-CPU areas from 4 KiB pages: the default 2 MiB embedded
                // unit is zeroed whole by an emulated memset (~0.6 s of boot).
                "percpu_alloc=page".to_string(),
            ];
            let left = still_visible(table);
            if !left.is_empty() {
                let nums: Vec<String> = left.iter().map(|(_, n)| n.to_string()).collect();
                words.push(format!("clearcpuid={}", nums.join(",")));
            }
            words.push(PVM_GLIBC_TUNABLES.into());
            words.join(" ")
        }
    }
}

/// Adjusts KVM's supported CPUID for vCPU `id` of `count` under `profile`.
pub fn setup(cpuid: &mut CpuId, profile: CpuProfile, id: u8, count: u8) {
    let xsave_hidden = profile == CpuProfile::Pvm;
    let core_bits = 8 - count.saturating_sub(1).leading_zeros();
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                // Initial APIC ID, logical processor count, CLFLUSH size 64.
                e.ebx = (u32::from(id) << 24) | (u32::from(count) << 16) | (8 << 8);
                e.ecx |= 1 << 31; // running under a hypervisor
                if count > 1 {
                    e.edx |= 1 << 28;
                } else {
                    e.edx &= !(1 << 28);
                }
            }
            4 => {
                // Cores per package minus one, no sharing beyond one core.
                e.eax = (e.eax & 0x3ff) | (u32::from(count.saturating_sub(1)) << 26);
            }
            0xb => {
                e.edx = u32::from(id);
                match e.index {
                    0 => {
                        e.eax = 0;
                        e.ebx = 1;
                        e.ecx = 1 << 8;
                    }
                    1 => {
                        e.eax = core_bits;
                        e.ebx = u32::from(count);
                        e.ecx = (2 << 8) | 1;
                    }
                    _ => {
                        e.eax = 0;
                        e.ebx = 0;
                        e.ecx = e.index;
                    }
                }
            }
            0xd if xsave_hidden => {
                e.eax = 0;
                e.ebx = 0;
                e.ecx = 0;
                e.edx = 0;
            }
            _ => {}
        }
        if profile == CpuProfile::Pvm {
            for &(leaf, sub, reg, bit, _, _) in PVM_HIDDEN {
                if e.function == leaf && sub.is_none_or(|s| s == e.index) {
                    *reg_mut(e, reg) &= !(1 << bit);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: !0,
            ebx: !0,
            ecx: !0,
            edx: !0,
            ..Default::default()
        }
    }

    #[test]
    fn pvm_hides_gaps_host_keeps_them() {
        let entries = [
            entry(1, 0),
            entry(7, 0),
            entry(0xd, 0),
            entry(0x8000_0001, 0),
        ];
        let mut pvm = CpuId::from_entries(&entries).unwrap();
        setup(&mut pvm, CpuProfile::Pvm, 1, 2);
        let mut host = CpuId::from_entries(&entries).unwrap();
        setup(&mut host, CpuProfile::Host, 1, 2);
        let p = pvm.as_slice();
        let h = host.as_slice();
        assert_eq!(p[0].ecx & (1 << 13), 0, "cx16 hidden");
        assert_eq!(p[0].ecx & (1 << 26), 0, "xsave hidden");
        assert_ne!(p[0].ecx & (1 << 31), 0, "hypervisor bit");
        assert_eq!(p[0].ebx >> 24, 1, "apic id");
        assert_eq!(p[1].ebx & (1 << 9), 0, "erms hidden");
        assert_eq!(p[2].eax, 0, "xsave leaf cleared");
        assert_eq!(p[3].edx & (1 << 27), 0, "rdtscp hidden");
        assert_ne!(h[0].ecx & (1 << 13), 0);
        assert_ne!(h[1].ebx & (1 << 9), 0);
        assert_ne!(h[2].eax, 0);
    }

    #[test]
    fn kernel_args_name_what_kvm_kept() {
        let mut t = CpuId::from_entries(&[entry(1, 0), entry(7, 0)]).unwrap();
        assert_eq!(kernel_args(CpuProfile::Host, &t), "");
        setup(&mut t, CpuProfile::Pvm, 0, 1);
        assert_eq!(
            kernel_args(CpuProfile::Pvm, &t),
            format!(
                "shoal.pvm shoal.tick_mult=4 no-kvmapf clocksource=kvm-clock percpu_alloc=page {PVM_GLIBC_TUNABLES}"
            )
        );
        // A host that forces POPCNT back on.
        t.as_mut_slice()[0].ecx |= 1 << 23;
        assert_eq!(still_visible(&t), vec![("popcnt", 151)]);
        assert_eq!(
            kernel_args(CpuProfile::Pvm, &t),
            format!(
                "shoal.pvm shoal.tick_mult=4 no-kvmapf clocksource=kvm-clock percpu_alloc=page clearcpuid=151 {PVM_GLIBC_TUNABLES}"
            )
        );
    }

    #[test]
    fn profile_names_round_trip() {
        for p in [CpuProfile::Host, CpuProfile::Pvm] {
            assert_eq!(p.to_string().parse::<CpuProfile>().unwrap(), p);
        }
        assert!("vmx".parse::<CpuProfile>().is_err());
        assert_eq!(CpuProfile::auto(true), CpuProfile::Pvm);
    }
}
