//! A TAP interface (`/dev/net/tun` with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR),
//! non-blocking, with a 12-byte `virtio_net_hdr_v1` before every frame.
//!
//! Offloads toward the device start off (TUNSETOFFLOAD 0: whole,
//! checksummed frames no larger than the interface's MTU); the device
//! turns on what its driver took ([`super::offload`]). Frames written to
//! the TAP may carry a partial checksum or be a TCP segment of up to 64
//! KiB, as their header says; the kernel finishes and segments them.
//!
//! A TAP opened here without IFF_PERSIST disappears when its last fd is
//! closed; a persistent one made beforehand (`ip tuntap add ... mode tap`,
//! in the sandbox's network namespace) is attached to by name, or the
//! runtime opens it there and hands the fd over ([`Tap::from_fd`]).

use super::VNET_HDR_LEN;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Longest interface name, without the NUL (IFNAMSIZ - 1).
pub const MAX_NAME_LEN: usize = 15;

const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const TAP_FLAGS: i16 = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
/// The type bits of the flags (IFF_TUN | IFF_TAP).
const IFF_TYPE_MASK: i16 = 0x0003;

// _IOW('T', 202, int), _IOR('T', 210, unsigned int), _IOW('T', 216, int).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
pub const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
pub const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;

/// `struct ifreq` as TUNSETIFF/TUNGETIFF use it: the name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    _pad: [u8; 22],
}

/// Why a TAP could not be opened or set up.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The interface name is empty, too long or has bytes a name cannot.
    #[error("invalid TAP name {0:?}: 1 to 15 bytes of [A-Za-z0-9_.-]")]
    Name(String),
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun: {0}")]
    Open(#[source] std::io::Error),
    /// TUNSETIFF refused (an existing non-TAP interface, no permission, ...).
    #[error("cannot create or attach TAP {name}: {source}")]
    Attach {
        /// The requested name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// TUNGETIFF failed on a passed fd (it is no TUN/TAP fd).
    #[error("the fd is not an attached TUN/TAP device: {0}")]
    NotTap(#[source] std::io::Error),
    /// A passed fd is attached with other flags than IFF_TAP | IFF_NO_PI |
    /// IFF_VNET_HDR.
    #[error("TAP {name} has flags {flags:#x}; it must be opened with IFF_TAP | IFF_NO_PI | IFF_VNET_HDR")]
    Flags {
        /// The interface.
        name: String,
        /// Its flags.
        flags: i16,
    },
    /// TUNSETVNETHDRSZ or O_NONBLOCK could not be set.
    #[error("cannot configure TAP {name}: {source}")]
    Configure {
        /// The interface.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// An open TAP interface.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

/// Checks an interface name: 1..=15 bytes of letters, digits, `_`, `.`, `-`.
pub fn validate_name(name: &str) -> Result<(), TapError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TapError::Name(name.to_owned()))
    }
}

impl Tap {
    /// Creates TAP `name` in the caller's network namespace, or attaches
    /// to the existing (persistent) TAP of that name.
    pub fn open(name: &str) -> Result<Tap, TapError> {
        validate_name(name)?;
        // SAFETY: a NUL-terminated literal path; the return value is checked.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(TapError::Open(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut req = IfReq {
            name: [0; 16],
            flags: TAP_FLAGS,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req`
        // is laid out as (40 bytes); the return value is checked.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req) };
        if r < 0 {
            return Err(TapError::Attach {
                name: name.to_owned(),
                source: std::io::Error::last_os_error(),
            });
        }
        let tap = Tap {
            file,
            name: name.to_owned(),
        };
        tap.configure()?;
        Ok(tap)
    }

    /// Takes an fd already attached to a TAP (opened by the runtime in the
    /// sandbox's network namespace), checks its flags and makes it
    /// non-blocking with the 12-byte header.
    pub fn from_fd(fd: OwnedFd) -> Result<Tap, TapError> {
        let file = File::from(fd);
        let mut req = IfReq {
            name: [0; 16],
            flags: 0,
            _pad: [0; 22],
        };
        // SAFETY: TUNGETIFF writes a `struct ifreq` into `req`; the return
        // value is checked.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNGETIFF, &mut req) };
        if r < 0 {
            return Err(TapError::NotTap(std::io::Error::last_os_error()));
        }
        let len = req.name.iter().position(|&b| b == 0).unwrap_or(16);
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        // TUNGETIFF also reports IFF_PERSIST and the like: check only ours.
        if req.flags & (IFF_TYPE_MASK | IFF_NO_PI | IFF_VNET_HDR) != TAP_FLAGS {
            return Err(TapError::Flags {
                name,
                flags: req.flags,
            });
        }
        let tap = Tap { file, name };
        tap.set_nonblocking()?;
        tap.configure()?;
        Ok(tap)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn configure_error(&self, source: std::io::Error) -> TapError {
        TapError::Configure {
            name: self.name.clone(),
            source,
        }
    }

    fn configure(&self) -> Result<(), TapError> {
        let size = libc::c_int::try_from(VNET_HDR_LEN).unwrap_or(12);
        // SAFETY: TUNSETVNETHDRSZ reads an int through the pointer; the
        // return value is checked.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), TUNSETVNETHDRSZ, &size) };
        if r < 0 {
            return Err(self.configure_error(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn set_nonblocking(&self) -> Result<(), TapError> {
        let fd = self.file.as_raw_fd();
        // SAFETY: F_GETFL on an fd we own; the result is checked.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: F_SETFL with the flags just read plus O_NONBLOCK.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(self.configure_error(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Sets which offloads the kernel may use in frames it hands over
    /// (`TUN_F_*` flags; 0: whole, checksummed frames of at most the MTU).
    pub fn set_offload(&self, flags: u32) -> std::io::Result<()> {
        let arg = libc::c_ulong::from(flags);
        // SAFETY: TUNSETOFFLOAD takes its flags by value; the return value
        // is checked.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), super::offload::TUNSETOFFLOAD, arg) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads one frame (header first) into `buf`; `WouldBlock` when none
    /// is queued. A frame longer than `buf` is truncated by the kernel.
    pub fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }

    /// Writes one frame (header first).
    pub fn write(&mut self, frame: &[u8]) -> std::io::Result<usize> {
        self.file.write(frame)
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for bad in [
            "",
            "a234567890123456",
            "a b",
            "a/b",
            ".",
            "..",
            "tap\0",
            "täp",
        ] {
            assert!(
                matches!(validate_name(bad), Err(TapError::Name(_))),
                "{bad:?}"
            );
        }
        for good in ["tap0", "a23456789012345", "sh-tst_1.2"] {
            validate_name(good).unwrap();
        }
        assert!(matches!(
            Tap::open("this-name-is-too-long"),
            Err(TapError::Name(_))
        ));
    }

    #[test]
    fn a_non_tap_fd_is_refused() {
        let f = File::open("/dev/null").unwrap();
        assert!(matches!(
            Tap::from_fd(OwnedFd::from(f)),
            Err(TapError::NotTap(_))
        ));
    }
}
