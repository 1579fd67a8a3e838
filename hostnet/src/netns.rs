//! Running code inside a named network namespace (`/run/netns/NAME`, as
//! `ip netns add` makes them) on a thread of its own, and the TAP calls
//! that need it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::thread;

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// `TUNSETIFF`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `TUNSETOWNER`: `_IOW('T', 204, int)`.
const TUNSETOWNER: libc::c_ulong = 0x4004_54cc;
/// `TUNSETGROUP`: `_IOW('T', 206, int)`.
const TUNSETGROUP: libc::c_ulong = 0x4004_54ce;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// The path of a named netns.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// Moves the calling thread into the netns `name`. Only for threads that
/// stay there (the process's other threads are unaffected).
pub fn enter(name: &str) -> io::Result<()> {
    let f = File::open(path(name))?;
    // SAFETY: setns on a namespace file we opened and hold; it changes
    // only this thread's network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread inside the netns `name` and returns its result
/// (the thread ends with it, so no thread of the process is left there).
pub fn run_in<T, F>(name: &str, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> io::Result<T> + Send + 'static,
{
    let name = name.to_string();
    thread::Builder::new()
        .name("shoal-netns".into())
        .spawn(move || {
            enter(&name)?;
            f()
        })?
        .join()
        .map_err(|_| io::Error::other("the netns thread panicked"))?
}

/// Attaches to the TAP `ifname` of the calling thread's netns with
/// `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` (what the VMM's virtio-net wants).
pub fn attach_tap(ifname: &str) -> io::Result<OwnedFd> {
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        _pad: [0; 22],
    };
    let b = ifname.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    req.name[..b.len()].copy_from_slice(b);
    // SAFETY: TUNSETIFF reads a struct ifreq, which IfReq lays out (name,
    // flags, padding to its 40 bytes); the fd is ours.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(tun))
}

/// Sets the owner and group of the persistent TAP an attached fd holds.
pub(crate) fn set_tap_owner(fd: &OwnedFd, uid: u32, gid: u32) -> io::Result<()> {
    for (req, id) in [(TUNSETOWNER, uid), (TUNSETGROUP, gid)] {
        // SAFETY: both ioctls take their id as the argument value.
        if unsafe { libc::ioctl(fd.as_raw_fd(), req, libc::c_ulong::from(id)) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ifreq_is_the_kernels_size() {
        assert_eq!(std::mem::size_of::<super::IfReq>(), 40);
    }
}
