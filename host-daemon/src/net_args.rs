//! `shoald`'s network flags (issue 18).

use anyhow::{bail, Result};
use shoal_runtime::backend::NetLimits;
use shoald::net::NetOptions;
use shoald::net_dns::DnsListen;
use std::net::SocketAddr;

#[derive(clap::Args, Debug)]
pub struct NetArgs {
    /// Set sandbox networks up at start (host table, forwarding, the slot
    /// pool); without it, at the first create that asks for a network.
    #[arg(long)]
    net: bool,
    /// Where sandbox addresses come from (a /30 per sandbox).
    #[arg(long, value_name = "CIDR", default_value = shoal_hostnet::AddrPool::DEFAULT)]
    net_pool: String,
    /// Network slots (netns, veth, TAP, rules) kept ready, so a create
    /// with a network only takes one.
    #[arg(long, default_value_t = 4)]
    net_slots: usize,
    /// Slot netns names: this and the slot's index. Two daemons on one
    /// host need different prefixes and pools.
    #[arg(long, default_value = "shoal-")]
    net_netns_prefix: String,
    /// Host-side veth names: this (starting with `shv`) and the index.
    #[arg(long, default_value = "shv")]
    net_link_prefix: String,
    /// Where the DNS forwarder sandboxes with `allow_dns` resolve through
    /// listens (it answers only the names their policies allow): `auto`
    /// (a dummy link of the daemon's, `<link prefix>dns`, holding an
    /// address kept out of the pool), `off` (allow_dns is refused), or
    /// ADDR:PORT, an address of this host other than loopback.
    #[arg(long, value_name = "auto|off|ADDR:PORT", default_value = "auto")]
    net_dns: DnsListen,
    /// The resolvers the forwarder asks (repeatable; default: the
    /// nameservers of /etc/resolv.conf).
    #[arg(long, value_name = "ADDR:PORT")]
    net_dns_upstream: Vec<SocketAddr>,
    /// Each sandbox's receive and send limit (bytes/s; 0: none).
    #[arg(long, default_value_t = 0)]
    net_rate_bps: u64,
    /// Each sandbox's receive and send limit (packets/s; 0: none).
    #[arg(long, default_value_t = 0)]
    net_rate_pps: u64,
    /// E2B creates without `network` rules get the public internet (every
    /// address but the always-denied ones, every name through the DNS
    /// forwarder), as on E2B, unless they send `allow_internet_access:
    /// false`. Off: they get no network (SDKs before 2.51 send
    /// `allow_internet_access: true` on every create).
    #[arg(long)]
    e2b_internet: bool,
}

impl NetArgs {
    pub fn options(&self) -> Result<NetOptions> {
        let pool = self
            .net_pool
            .parse()
            .map_err(|e| anyhow::anyhow!("--net-pool {}: {e}", self.net_pool))
            .and_then(|n| {
                shoal_hostnet::AddrPool::new(n)
                    .map_err(|e| anyhow::anyhow!("--net-pool {}: {e}", self.net_pool))
            })?;
        if self.net_dns == DnsListen::Off && !self.net_dns_upstream.is_empty() {
            bail!("--net-dns-upstream with --net-dns off");
        }
        let rate = |v: u64| (v > 0).then_some(v);
        Ok(NetOptions {
            eager: self.net,
            pool,
            slots: self.net_slots,
            netns_prefix: self.net_netns_prefix.clone(),
            link_prefix: self.net_link_prefix.clone(),
            dns: self.net_dns,
            dns_upstreams: self.net_dns_upstream.clone(),
            limits: NetLimits {
                rx_bps: rate(self.net_rate_bps),
                rx_pps: rate(self.net_rate_pps),
                tx_bps: rate(self.net_rate_bps),
                tx_pps: rate(self.net_rate_pps),
            },
            e2b_internet: self.e2b_internet,
        })
    }
}
