//! What a networked sandbox's guest is told about its link after a
//! restore: the fields of the agent's `NetConfigure` request (issue 18),
//! from the sandbox's slot in the daemon's address pool.

use crate::db::SandboxRow;
use agent_proto::NetConfigure;
use shoal_hostnet::addr::LINK_PREFIX;
use shoal_hostnet::AddrPool;

/// The guest link's MTU.
pub const GUEST_MTU: u16 = 1500;

/// The agent's `NetConfigure` for `row`'s guest (its slot's link); None
/// for a sandbox without a network, or whose recorded slot is not that
/// address in `pool` (the daemon was restarted with another `--net-pool`:
/// the guest must not be given another slot's address).
pub fn guest_net(pool: &AddrPool, row: &SandboxRow) -> Option<NetConfigure> {
    let net = row.net.as_ref()?;
    let a = pool.slot(net.slot).ok()?;
    if a.guest != net.guest_addr {
        tracing::warn!(
            sandbox = %row.id,
            "slot {} is {} in the pool, the sandbox has {}: not configuring its network",
            net.slot,
            a.guest,
            net.guest_addr
        );
        return None;
    }
    // The resolver is the gateway: the slot's DNAT sends its port 53 to
    // the daemon's DNS forwarder.
    Some(NetConfigure {
        mac: a.guest_mac.0,
        addr: a.guest,
        prefix_len: LINK_PREFIX,
        gateway: a.gateway,
        mtu: GUEST_MTU,
        nameservers: vec![a.gateway],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{SandboxNet, State};
    use shoal_api::NetworkSpec;
    use shoal_runtime::backend::Kind;
    use std::net::Ipv4Addr;

    fn row(net: Option<SandboxNet>) -> SandboxRow {
        SandboxRow {
            id: "abc".into(),
            template: "tiny-1c-128m-net".into(),
            kind: Kind::MicroVm,
            state: State::Running,
            vcpus: 1,
            memory_mib: 128,
            pid: None,
            backend_state: None,
            dir: "/nonexistent".into(),
            created_at: 0.0,
            last_active: 0.0,
            ttl_s: 0,
            idle_timeout_s: 0,
            metadata: Default::default(),
            env: Default::default(),
            needs_post_restore: true,
            keep_running: false,
            pause_at_ttl: false,
            error: None,
            net,
            priority: shoal_api::Priority::Latency,
        }
    }

    #[test]
    fn a_slot_gives_its_guest_side() {
        let pool = AddrPool::new("10.213.0.0/16".parse().unwrap()).unwrap();
        assert_eq!(guest_net(&pool, &row(None)), None);
        let a = pool.slot(3).unwrap();
        let net = SandboxNet {
            slot: 3,
            guest_addr: a.guest,
            policy: NetworkSpec::allowing(["pypi.org"]),
        };
        let g = guest_net(&pool, &row(Some(net.clone()))).unwrap();
        assert_eq!(g.addr, Ipv4Addr::new(10, 213, 0, 30));
        assert_eq!(g.gateway, Ipv4Addr::new(10, 213, 0, 29));
        assert_eq!(g.prefix_len, 30);
        assert_eq!(g.mac, [0x02, 0x5a, 10, 213, 0, 30]);
        assert_eq!((g.mtu, g.nameservers), (1500, vec![g.gateway]));
        // Another pool, or a slot past it: nothing rather than a wrong address.
        let other = AddrPool::new("10.99.0.0/16".parse().unwrap()).unwrap();
        assert_eq!(guest_net(&other, &row(Some(net.clone()))), None);
        let small = AddrPool::new("10.213.0.0/29".parse().unwrap()).unwrap();
        assert_eq!(guest_net(&small, &row(Some(net))), None);
    }
}
