//! The calling thread's netns's IPv4 addresses, read with `getifaddrs`
//! (netlink inside libc) instead of running `ip`: each address and, on
//! broadcast interfaces, its subnet broadcast.

use std::io;
use std::net::Ipv4Addr;

/// The IPv4 addresses of every interface (and the broadcast addresses of
/// broadcast interfaces), sorted, without duplicates.
pub fn ipv4_addrs() -> io::Result<Vec<Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into the pointer we pass; the
    // list is freed below with freeifaddrs, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs made, not yet
        // freed; its fields are read only.
        let ifa = unsafe { &*cur };
        if let Some(a) = v4(ifa.ifa_addr) {
            out.push(a);
            let broadcast = ifa.ifa_flags & (libc::IFF_BROADCAST as libc::c_uint) != 0;
            // ifa_ifu is the broadcast address on broadcast interfaces
            // (the peer's on point-to-point ones, which is not ours).
            if let Some(b) = v4(ifa.ifa_ifu).filter(|_| broadcast) {
                out.push(b);
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list head getifaddrs returned, freed once; no reference
    // into it outlives this call (addresses were copied out).
    unsafe { libc::freeifaddrs(head) };
    out.sort();
    out.dedup();
    Ok(out)
}

/// The IPv4 address in `sa`, if it is one.
fn v4(sa: *const libc::sockaddr) -> Option<Ipv4Addr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: a non-null sockaddr from getifaddrs: its family field is
    // readable whatever the family.
    let family = unsafe { (*sa).sa_family };
    if i32::from(family) != libc::AF_INET {
        return None;
    }
    // SAFETY: an AF_INET sockaddr from getifaddrs is a sockaddr_in.
    let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
    Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The same addresses `ip -j -4 addr show` prints (local and
    /// broadcast), and loopback among them.
    #[test]
    fn the_addresses_are_the_ones_ip_lists() {
        let ours = ipv4_addrs().unwrap();
        assert!(ours.contains(&Ipv4Addr::LOCALHOST), "{ours:?}");
        let out = Command::new("ip")
            .args(["-j", "-4", "addr", "show"])
            .output()
            .expect("running `ip` (iproute2)");
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut theirs: Vec<Ipv4Addr> = Vec::new();
        for link in v.as_array().into_iter().flatten() {
            for a in link["addr_info"].as_array().into_iter().flatten() {
                for key in ["local", "broadcast"] {
                    if let Some(ip) = a[key].as_str().and_then(|s| s.parse().ok()) {
                        theirs.push(ip);
                    }
                }
            }
        }
        theirs.sort();
        theirs.dedup();
        assert_eq!(ours, theirs);
    }
}
