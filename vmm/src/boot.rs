//! Loading a Linux kernel (uncompressed ELF `vmlinux`), its command line and
//! initrd, and writing the boot parameters ("zero page").

use crate::layout::{
    ram_ranges, CMDLINE_ADDR, CMDLINE_MAX, HIGH_RAM_START, LOW_RAM_END, SETUP_DATA_ADDR, ZERO_PAGE,
};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::Elf;
use linux_loader::loader::KernelLoader;
use std::fs::File;
use std::path::{Path, PathBuf};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Errors loading the kernel, initrd or command line.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// A file could not be opened.
    #[error("cannot open {what} {path}: {source}")]
    Open {
        /// "kernel" or "initrd".
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The kernel is not a loadable x86-64 ELF.
    #[error("cannot load kernel {path}: {source} (expected an uncompressed ELF vmlinux)")]
    Kernel {
        /// The path.
        path: PathBuf,
        /// The loader's error.
        source: linux_loader::loader::Error,
    },
    /// The initrd does not fit between the kernel and the end of low RAM.
    #[error("initrd {path} ({size} bytes) does not fit in guest memory; give the VM more memory")]
    InitrdTooLarge {
        /// The path.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// Reading the initrd failed.
    #[error("cannot read initrd {path}: {source}")]
    InitrdRead {
        /// The path.
        path: PathBuf,
        /// The error.
        source: vm_memory::GuestMemoryError,
    },
    /// The command line is too long or malformed.
    #[error("kernel command line is {0} bytes; the limit is {max}", max = CMDLINE_MAX - 1)]
    CmdlineTooLong(usize),
    /// The command line contains a NUL byte.
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    /// Writing boot data to guest memory failed.
    #[error("cannot write {0} to guest memory")]
    Write(&'static str),
    /// The initrd landed where the boot protocol's 32-bit fields cannot
    /// say (it is placed below the end of low RAM, so never).
    #[error("initrd at {addr:#x} (+{size:#x}) is not below 4 GiB")]
    InitrdHigh {
        /// Its guest address.
        addr: u64,
        /// Its size.
        size: u64,
    },
    /// The host could not supply random bytes for the guest's RNG seed.
    #[error("cannot get random bytes for the guest RNG seed: {0}")]
    Random(std::io::Error),
}

/// `setup_data` type of an RNG seed (Linux `SETUP_RNG_SEED`).
const SETUP_RNG_SEED: u32 = 9;
/// Seed length: 256 bits, what the guest's CRNG needs to be ready.
pub const RNG_SEED_LEN: usize = 32;
#[allow(clippy::cast_possible_truncation)] // 32
const RNG_SEED_LEN_U32: u32 = RNG_SEED_LEN as u32;

/// Fresh random bytes from the host kernel.
fn host_random(buf: &mut [u8]) -> Result<(), BootError> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: getrandom writes at most rest.len() bytes into rest, which
        // is valid, writable memory of that length.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(BootError::Random(e));
        }
        done += n.unsigned_abs();
    }
    Ok(())
}

/// Writes a `setup_data` entry holding a fresh 256-bit seed from the host's
/// RNG. With `CONFIG_RANDOM_TRUST_BOOTLOADER` (our kernel config) the guest
/// credits it in `setup_arch()`, so its CRNG is ready from the start of boot:
/// without it the guest (whose CPUID hides RDRAND on PVM hosts) has no
/// credited entropy during boot, and every random number the kernel asks for
/// until then re-extracts the input pool (BLAKE2s, ~1 s of a PVM boot). The
/// guest zeroes the seed after use. Returns the entry's address.
fn write_rng_seed(mem: &GuestMemoryMmap) -> Result<u64, BootError> {
    let mut entry = [0u8; 16 + RNG_SEED_LEN];
    // struct setup_data { u64 next; u32 type; u32 len; u8 data[]; }
    entry[8..12].copy_from_slice(&SETUP_RNG_SEED.to_le_bytes());
    entry[12..16].copy_from_slice(&RNG_SEED_LEN_U32.to_le_bytes());
    host_random(&mut entry[16..])?;
    mem.write_slice(&entry, GuestAddress(SETUP_DATA_ADDR))
        .map_err(|_| BootError::Write("RNG seed"))?;
    Ok(SETUP_DATA_ADDR)
}

/// Where the kernel landed.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// 64-bit entry point.
    pub entry: u64,
    /// First byte past the loaded image.
    pub end: u64,
}

/// Loads an ELF vmlinux into guest memory.
pub fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<LoadedKernel, BootError> {
    let mut f = File::open(path).map_err(|source| BootError::Open {
        what: "kernel",
        path: path.into(),
        source,
    })?;
    if let Some((entry, end)) = crate::kernel_map::map_kernel(mem, &f, HIGH_RAM_START) {
        return Ok(LoadedKernel { entry, end });
    }
    let r = Elf::load(mem, None, &mut f, Some(GuestAddress(HIGH_RAM_START))).map_err(|source| {
        BootError::Kernel {
            path: path.into(),
            source,
        }
    })?;
    Ok(LoadedKernel {
        entry: r.kernel_load.0,
        end: r.kernel_end,
    })
}

/// Places the initrd at the top of low RAM. Returns (address, size).
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    mem_bytes: u64,
    kernel_end: u64,
    path: &Path,
) -> Result<(u64, u64), BootError> {
    let mut f = File::open(path).map_err(|source| BootError::Open {
        what: "initrd",
        path: path.into(),
        source,
    })?;
    let size = f
        .metadata()
        .map_err(|source| BootError::Open {
            what: "initrd",
            path: path.into(),
            source,
        })?
        .len();
    let low_end = ram_ranges(mem_bytes)[0].1;
    let addr = low_end.checked_sub(size).map(|a| a & !0xfff);
    let addr = match addr {
        Some(a) if a >= kernel_end && size > 0 => a,
        _ => {
            return Err(BootError::InitrdTooLarge {
                path: path.into(),
                size,
            })
        }
    };
    let len = usize::try_from(size).map_err(|_| BootError::InitrdTooLarge {
        path: path.into(),
        size,
    })?;
    mem.read_exact_volatile_from(GuestAddress(addr), &mut f, len)
        .map_err(|source| BootError::InitrdRead {
            path: path.into(),
            source,
        })?;
    Ok((addr, size))
}

/// [`CMDLINE_ADDR`] as the boot protocol's 32-bit field.
#[allow(clippy::cast_possible_truncation)] // a constant below 1 MiB
const CMDLINE_ADDR_U32: u32 = CMDLINE_ADDR as u32;

/// Writes the command line and boot parameters.
pub fn write_boot_params(
    mem: &GuestMemoryMmap,
    mem_bytes: u64,
    cmdline: &str,
    initrd: Option<(u64, u64)>,
) -> Result<(), BootError> {
    if cmdline.len() >= CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong(cmdline.len()));
    }
    if cmdline.contains('\0') {
        return Err(BootError::CmdlineNul);
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_ADDR))
        .map_err(|_| BootError::Write("command line"))?;

    let mut p = boot_params::default();
    p.hdr.type_of_loader = 0xff;
    p.hdr.boot_flag = 0xaa55;
    p.hdr.header = 0x5372_6448; // "HdrS"
    p.hdr.kernel_alignment = 0x0100_0000;
    p.hdr.cmd_line_ptr = CMDLINE_ADDR_U32;
    // Shorter than CMDLINE_MAX, checked above.
    p.hdr.cmdline_size =
        u32::try_from(cmdline.len()).map_err(|_| BootError::CmdlineTooLong(cmdline.len()))?;
    p.hdr.setup_data = write_rng_seed(mem)?;
    if let Some((addr, size)) = initrd {
        let high = || BootError::InitrdHigh { addr, size };
        p.hdr.ramdisk_image = u32::try_from(addr).map_err(|_| high())?;
        p.hdr.ramdisk_size = u32::try_from(size).map_err(|_| high())?;
    }
    let mut e820 = vec![(0, LOW_RAM_END)];
    for (start, len) in ram_ranges(mem_bytes) {
        let start = start.max(HIGH_RAM_START);
        e820.push((start, len - start.min(len)));
    }
    for (i, (addr, size)) in e820.into_iter().filter(|e| e.1 > 0).enumerate() {
        p.e820_table[i] = boot_e820_entry {
            addr,
            size,
            r#type: 1, // usable RAM
        };
        // At most three entries (low RAM, RAM below and above the gap).
        p.e820_entries = u8::try_from(i + 1).map_err(|_| BootError::Write("e820 table"))?;
    }
    mem.write_obj(p, GuestAddress(ZERO_PAGE))
        .map_err(|_| BootError::Write("boot parameters"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_limits() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 24)]).unwrap();
        let long = "x".repeat(CMDLINE_MAX);
        assert!(matches!(
            write_boot_params(&mem, 1 << 24, &long, None),
            Err(BootError::CmdlineTooLong(_))
        ));
        assert!(matches!(
            write_boot_params(&mem, 1 << 24, "a\0b", None),
            Err(BootError::CmdlineNul)
        ));
        write_boot_params(&mem, 1 << 24, "console=ttyS0", None).unwrap();
        let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE)).unwrap();
        assert_eq!(p.e820_entries, 2);
        assert_eq!({ p.e820_table[1].size }, (1 << 24) - HIGH_RAM_START);
    }

    #[test]
    fn rng_seed_is_fresh_setup_data() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 24)]).unwrap();
        let mut seeds = Vec::new();
        for _ in 0..2 {
            write_boot_params(&mem, 1 << 24, "console=ttyS0", None).unwrap();
            let p: boot_params = mem.read_obj(GuestAddress(ZERO_PAGE)).unwrap();
            assert_eq!({ p.hdr.setup_data }, SETUP_DATA_ADDR);
            let mut e = [0u8; 16 + RNG_SEED_LEN];
            mem.read_slice(&mut e, GuestAddress(SETUP_DATA_ADDR))
                .unwrap();
            assert_eq!(
                u64::from_le_bytes(e[0..8].try_into().unwrap()),
                0,
                "one entry"
            );
            assert_eq!(u32::from_le_bytes(e[8..12].try_into().unwrap()), 9);
            assert_eq!(u32::from_le_bytes(e[12..16].try_into().unwrap()), 32);
            seeds.push(e[16..].to_vec());
        }
        assert_ne!(seeds[0], seeds[1], "each boot gets its own seed");
        assert!(seeds.iter().all(|s| s.iter().any(|&b| b != 0)));
    }
}
