//! The guest's network: the loopback interface at boot, and
//! [`configure`] for `NetConfigure` (MAC, MTU, IPv4 address, default route,
//! resolv.conf), with ioctls on one AF_INET socket: no `ip` binary, no
//! netlink, a few dozen syscalls per request.

use std::ffi::{c_int, CStr, CString};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use agent_proto::{valid_ifname, AgentMode, NetConfigure, NetConfigured};

use super::os::{self, Errno};

/// Where the guest's interfaces are listed.
pub const SYS_CLASS_NET: &CStr = c"/sys/class/net";
/// The guest's resolver configuration.
pub const RESOLV_CONF: &CStr = c"/etc/resolv.conf";

/// The type of ioctl(2)'s request argument (`c_int` in musl).
#[cfg(target_env = "musl")]
type IoctlRequest = libc::c_int;
#[cfg(not(target_env = "musl"))]
type IoctlRequest = libc::c_ulong;

/// The socket ioctls used here, as ioctl(2) takes them (all below 0x9000:
/// they fit musl's `c_int`).
#[allow(clippy::cast_possible_truncation, clippy::unnecessary_cast)]
mod req {
    use super::IoctlRequest;
    pub const SIOCGIFFLAGS: IoctlRequest = libc::SIOCGIFFLAGS as IoctlRequest;
    pub const SIOCSIFFLAGS: IoctlRequest = libc::SIOCSIFFLAGS as IoctlRequest;
    pub const SIOCSIFHWADDR: IoctlRequest = libc::SIOCSIFHWADDR as IoctlRequest;
    pub const SIOCSIFMTU: IoctlRequest = libc::SIOCSIFMTU as IoctlRequest;
    pub const SIOCSIFADDR: IoctlRequest = libc::SIOCSIFADDR as IoctlRequest;
    pub const SIOCSIFNETMASK: IoctlRequest = libc::SIOCSIFNETMASK as IoctlRequest;
    pub const SIOCDELRT: IoctlRequest = libc::SIOCDELRT as IoctlRequest;
    pub const SIOCADDRT: IoctlRequest = libc::SIOCADDRT as IoctlRequest;
}

/// AF_INET as a `sockaddr_in` family (2: fits).
#[allow(clippy::cast_possible_truncation)]
const AF_INET_FAMILY: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
/// IFF_UP | IFF_RUNNING as `ifr_flags` (0x41: fits).
#[allow(clippy::cast_possible_truncation)]
const UP_BITS: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;

/// A request failed: which step, and the errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetError {
    /// The step (e.g. `SIOCSIFHWADDR`).
    pub what: &'static str,
    /// Why.
    pub errno: Errno,
}

fn step(what: &'static str) -> impl Fn(Errno) -> NetError {
    move |errno| NetError { what, errno }
}

/// An AF_INET datagram socket for interface ioctls.
fn inet_socket() -> Result<OwnedFd, Errno> {
    // SAFETY: plain syscall with integer arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fd was just returned by socket and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An `ifreq` naming `ifname` (at most 15 bytes, checked by the caller).
fn ifreq(ifname: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all zero is valid.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(ifname.bytes().take(15)) {
        *d = libc::c_char::from_ne_bytes([s]);
    }
    r
}

fn ioctl(fd: &OwnedFd, req: IoctlRequest, arg: *mut libc::c_void) -> Result<(), Errno> {
    // SAFETY: `arg` points to the ifreq or rtentry the request reads or
    // writes, valid for the duration of the call (the callers' locals).
    if unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) } != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: AF_INET_FAMILY,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes); the
    // kernel reads it as the sockaddr_in its family says it is.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn set_flags(fd: &OwnedFd, ifname: &str, up: bool) -> Result<(), Errno> {
    let mut r = ifreq(ifname);
    ioctl(fd, req::SIOCGIFFLAGS, (&raw mut r).cast())?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { r.ifr_ifru.ifru_flags };
    let up_bits = UP_BITS;
    let new = if up {
        flags | up_bits
    } else {
        flags & !up_bits
    };
    r.ifr_ifru.ifru_flags = new;
    ioctl(fd, req::SIOCSIFFLAGS, (&raw mut r).cast())
}

/// Brings `lo` up (the guest kernel has IPv4: without it 127.0.0.1 does not
/// answer). A kernel without IPv4 (EAFNOSUPPORT) is left alone.
pub fn loopback_up() -> Result<(), Errno> {
    let fd = match inet_socket() {
        Ok(fd) => fd,
        Err(Errno(libc::EAFNOSUPPORT)) => return Ok(()),
        Err(e) => return Err(e),
    };
    set_flags(&fd, "lo", true)
}

/// The guest's one network interface: the first (by name) entry of `dir`
/// (`/sys/class/net`) other than `lo`.
pub fn find_netdev(dir: &CStr) -> Result<String, NetError> {
    let fd = os::open(dir, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(step("open"))?;
    let mut buf = vec![0u8; 4096];
    let mut best: Option<String> = None;
    loop {
        let n = os::getdents(os::fd_ref(&fd), &mut buf).map_err(step("getdents"))?;
        if n == 0 {
            break;
        }
        let mut at = 0usize;
        while let Some(head) = buf.get(at..n) {
            // linux_dirent64: ino u64, off i64, reclen u16, type u8, name.
            let Some(reclen) = head.get(16..18) else {
                break;
            };
            let reclen = usize::from(u16::from_ne_bytes([reclen[0], reclen[1]]));
            let Some(name) = head.get(19..reclen) else {
                break;
            };
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            if let Ok(name) = std::str::from_utf8(name) {
                let keep = name != "lo" && valid_ifname(name);
                if keep && best.as_deref().is_none_or(|b| name < b) {
                    best = Some(name.to_owned());
                }
            }
            if reclen == 0 {
                break;
            }
            at += reclen;
        }
    }
    best.ok_or(NetError {
        what: "no network interface in /sys/class/net",
        errno: Errno(libc::ENODEV),
    })
}

/// Gives `ifname` the identity of `req` (down, MAC, MTU, address and
/// netmask, up, the default route via `req.gateway` replacing any other)
/// and writes `resolv_conf` with its name servers. A second call with
/// another identity replaces the first.
pub fn configure(
    req: &NetConfigure,
    ifname: &str,
    resolv_conf: &CStr,
) -> Result<NetConfigured, NetError> {
    if !valid_ifname(ifname) {
        return Err(step("interface name")(Errno(libc::EINVAL)));
    }
    let fd = inet_socket().map_err(step("socket"))?;
    set_flags(&fd, ifname, false).map_err(step("SIOCSIFFLAGS down"))?;

    let mut r = ifreq(ifname);
    // SAFETY: sockaddr is plain data; all zero is valid.
    let mut hw: libc::sockaddr = unsafe { std::mem::zeroed() };
    hw.sa_family = libc::ARPHRD_ETHER;
    for (d, s) in hw.sa_data.iter_mut().zip(req.mac) {
        *d = libc::c_char::from_ne_bytes([s]);
    }
    r.ifr_ifru.ifru_hwaddr = hw;
    ioctl(&fd, req::SIOCSIFHWADDR, (&raw mut r).cast()).map_err(step("SIOCSIFHWADDR"))?;

    let mut r = ifreq(ifname);
    r.ifr_ifru.ifru_mtu = c_int::from(req.mtu);
    ioctl(&fd, req::SIOCSIFMTU, (&raw mut r).cast()).map_err(step("SIOCSIFMTU"))?;

    let mut r = ifreq(ifname);
    r.ifr_ifru.ifru_addr = sockaddr_in(req.addr);
    ioctl(&fd, req::SIOCSIFADDR, (&raw mut r).cast()).map_err(step("SIOCSIFADDR"))?;
    let mut r = ifreq(ifname);
    r.ifr_ifru.ifru_netmask = sockaddr_in(req.netmask());
    ioctl(&fd, req::SIOCSIFNETMASK, (&raw mut r).cast()).map_err(step("SIOCSIFNETMASK"))?;

    set_flags(&fd, ifname, true).map_err(step("SIOCSIFFLAGS up"))?;
    replace_default_route(&fd, req.gateway)?;
    write_resolv_conf(resolv_conf, &req.nameservers)?;
    Ok(NetConfigured {
        ifname: ifname.to_owned(),
    })
}

/// Deletes every IPv4 default route (bounded), then adds one via `gateway`.
fn replace_default_route(fd: &OwnedFd, gateway: Ipv4Addr) -> Result<(), NetError> {
    let route = |gw: Option<Ipv4Addr>| {
        // SAFETY: rtentry is plain data; all zero is valid.
        let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
        rt.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
        rt.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
        rt.rt_flags = libc::RTF_UP;
        if let Some(gw) = gw {
            rt.rt_gateway = sockaddr_in(gw);
            rt.rt_flags |= libc::RTF_GATEWAY;
        }
        rt
    };
    // A guest has at most a few: 8 deletions bound the loop.
    for _ in 0..8 {
        let mut rt = route(None);
        match ioctl(fd, req::SIOCDELRT, (&raw mut rt).cast()) {
            Ok(()) => {}
            Err(Errno(libc::ESRCH)) => break,
            Err(e) => return Err(step("SIOCDELRT")(e)),
        }
    }
    let mut rt = route(Some(gateway));
    ioctl(fd, req::SIOCADDRT, (&raw mut rt).cast()).map_err(step("SIOCADDRT"))
}

/// Writes `path` as `nameserver` lines: a temporary file beside it, then
/// rename(2) over it (a symlink there is replaced, not followed).
fn write_resolv_conf(path: &CStr, nameservers: &[Ipv4Addr]) -> Result<(), NetError> {
    let mut text = String::from("# written by shoal-agent\n");
    for ns in nameservers.iter().take(agent_proto::NET_MAX_NAMESERVERS) {
        text.push_str(&format!("nameserver {ns}\n"));
    }
    let mut tmp = path.to_bytes().to_vec();
    tmp.extend_from_slice(b".shoal-tmp");
    let tmp = CString::new(tmp).map_err(|_| step("resolv.conf path")(Errno(libc::EINVAL)))?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW;
    let fd = os::open(&tmp, flags, 0o644).map_err(step("open resolv.conf"))?;
    let written = os::write_all(os::fd_ref(&fd), text.as_bytes())
        .and_then(|()| os::fchmod(os::fd_ref(&fd), 0o644));
    drop(fd);
    if let Err(e) = written.and_then(|()| os::rename(&tmp, path)) {
        // SAFETY: tmp is a valid C string.
        unsafe { libc::unlink(tmp.as_ptr()) };
        return Err(step("write resolv.conf")(e));
    }
    Ok(())
}

/// The environment variable that lets a host-mode agent (tests) configure
/// one named interface; without it a host-mode agent refuses.
pub const HOST_NETDEV_ENV: &[u8] = b"SHOAL_AGENT_NETDEV";

/// `NetConfigure` as the server runs it: in the guest the one interface of
/// /sys/class/net and /etc/resolv.conf; in host mode only the interface
/// named by [`HOST_NETDEV_ENV`], and `etc/resolv.conf` relative to the
/// agent's working directory.
pub fn handle(
    mode: AgentMode,
    host_netdev: Option<&str>,
    req: &NetConfigure,
) -> Result<NetConfigured, NetError> {
    match mode {
        AgentMode::Guest => configure(req, &find_netdev(SYS_CLASS_NET)?, RESOLV_CONF),
        AgentMode::Host => match host_netdev {
            Some(ifname) => configure(req, ifname, c"etc/resolv.conf"),
            None => Err(NetError {
                what: "a host-mode agent configures no network interface \
                       (SHOAL_AGENT_NETDEV names one for tests)",
                errno: Errno(libc::EPERM),
            }),
        },
    }
}

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
