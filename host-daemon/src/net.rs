//! Sandbox networks in the daemon (issue 18): the host side
//! ([`shoal_hostnet::HostNet`]), slots made ahead ([`SlotPool`]), the slot
//! each networked sandbox holds (by sandbox id), and the DNS forwarder
//! that answers them by their policies.
//!
//! Nothing is done to the host until it is needed: the first networked
//! create (or `shoald --net`, or a networked sandbox that outlived a
//! daemon restart) sets up the host side, removes the slots a crashed
//! daemon left (those of sandboxes that still run are taken over, their
//! policies applied again) and starts the pool. A host that lacks what
//! this needs ([`shoal_hostnet::probe`]) makes every networked create
//! fail with what is missing (503 `network_unavailable`).

use super::db::{SandboxRow, State};
use super::net_dns::DnsListen;
use super::{blocking, ApiError, ApiResult, Daemon};
use shoal_api::NetworkSpec;
use shoal_hostnet::dns::{AllowSink, DnsForwarder, DnsPolicy, ForwarderConfig, SlotView};
use shoal_hostnet::{AddrPool, EgressPolicy, HostNet, NetConfig, Slot, SlotCounters, SlotPool};
use shoal_runtime::backend::{NetAttach, NetLimits};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a create waits for a slot when the pool is empty.
const SLOT_WAIT: Duration = Duration::from_secs(10);

/// How the daemon gives sandboxes networks (`shoald --net-*`).
#[derive(Debug, Clone)]
pub struct NetOptions {
    /// Set the host side up and fill the pool at start (else at the first
    /// networked create).
    pub eager: bool,
    /// Where slot addresses come from.
    pub pool: AddrPool,
    /// Slots kept ready.
    pub slots: usize,
    /// Slot netns names start with this.
    pub netns_prefix: String,
    /// Host-side veth names start with this (`shv...`).
    pub link_prefix: String,
    /// Where the DNS forwarder listens ([`DnsListen::Off`]: `allow_dns`
    /// is refused).
    pub dns: DnsListen,
    /// The resolvers it asks (empty: the host's `/etc/resolv.conf`).
    pub dns_upstreams: Vec<SocketAddr>,
    /// Every sandbox's net device limits.
    pub limits: NetLimits,
    /// E2B creates without network rules get the public internet unless
    /// they say `allow_internet_access: false` (E2B's default; off: they
    /// get no network, as shoald's own creates).
    pub e2b_internet: bool,
}

impl Default for NetOptions {
    fn default() -> Self {
        let c = NetConfig::default();
        NetOptions {
            eager: false,
            pool: c.pool,
            slots: 4,
            netns_prefix: c.netns_prefix,
            link_prefix: c.link_prefix,
            dns: DnsListen::Auto,
            dns_upstreams: vec![],
            limits: NetLimits::default(),
            e2b_internet: false,
        }
    }
}

type Slots = Arc<Mutex<HashMap<String, Arc<Slot>>>>;

fn lock(s: &Slots) -> MutexGuard<'_, HashMap<String, Arc<Slot>>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// The host side, once set up.
struct Active {
    pool: SlotPool,
    slots: Slots,
    dns: Option<DnsForwarder>,
    /// Why there is no forwarder, when there is none.
    no_dns: String,
    /// The auto forwarder's dummy link.
    dns_link: Option<String>,
}

/// The daemon's networks.
pub struct Networks {
    opts: NetOptions,
    active: tokio::sync::OnceCell<Arc<Active>>,
}

impl std::fmt::Debug for Networks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Networks")
            .field("active", &self.active.initialized())
            .finish()
    }
}

/// The sandbox's policy as the forwarder asks it.
struct Policies(Slots);

struct View {
    id: String,
    policy: EgressPolicy,
}

impl SlotView for View {
    fn slot(&self) -> &str {
        &self.id
    }
    fn name_allowed(&self, name: &str) -> bool {
        self.policy.allow_dns() && self.policy.domain_allowed(name)
    }
}

impl DnsPolicy for Policies {
    fn lookup(&self, client: IpAddr) -> Option<Box<dyn SlotView + '_>> {
        let g = lock(&self.0);
        let (id, s) = g.iter().find(|(_, s)| IpAddr::V4(s.guest_ip()) == client)?;
        Some(Box::new(View {
            id: id.clone(),
            policy: s.policy(),
        }))
    }
}

impl AllowSink for Policies {
    fn allow(&self, slot: &str, addr: IpAddr, ttl: Duration) -> Result<(), String> {
        let s = lock(&self.0).get(slot).cloned();
        let s = s.ok_or_else(|| format!("sandbox {slot} has no slot any more"))?;
        if covered(&s.policy(), addr) {
            return Ok(());
        }
        s.allow_addr(addr, ttl).map_err(|e| e.to_string())
    }
}

/// Whether `policy` already lets every port of `addr` through as far as
/// the forwarder's set could (an `allow_out` network without ports holds
/// it; the set comes after `deny_out` and the always-denied ranges, so it
/// adds nothing there either): the answers of a sandbox allowed the whole
/// internet (`0.0.0.0/0` and `*`) then cost no `nft` run and no place in
/// the set.
fn covered(policy: &EgressPolicy, addr: IpAddr) -> bool {
    let IpAddr::V4(a) = addr else {
        return false;
    };
    policy
        .allow_out()
        .iter()
        .filter_map(shoal_hostnet::policy::Target::as_v4)
        .any(|(n, ports)| ports.is_none() && n.contains(a))
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::NetworkUnavailable(format!("sandbox networks: {e}"))
}

impl Networks {
    /// Networks with these options (nothing is set up yet).
    pub fn new(opts: NetOptions) -> Networks {
        Networks {
            opts,
            active: tokio::sync::OnceCell::new(),
        }
    }

    /// Whether the host side is set up.
    pub fn is_active(&self) -> bool {
        self.active.initialized()
    }

    async fn active(&self, d: &Arc<Daemon>) -> ApiResult<Arc<Active>> {
        self.active
            .get_or_try_init(|| setup(d.clone()))
            .await
            .cloned()
    }

    /// Sets the host side up now (`--net`, or networked sandboxes in the
    /// database at start).
    pub async fn start(&self, d: &Arc<Daemon>) -> ApiResult<()> {
        self.active(d).await.map(drop)
    }

    /// Checks `spec` against what this daemon can do (DNS needs the
    /// forwarder: known to be off before the set-up only with
    /// `--net-dns off`).
    pub fn check(&self, policy: &EgressPolicy) -> ApiResult<()> {
        let why = match self.active.get() {
            Some(a) if a.dns.is_none() => a.no_dns.clone(),
            None if self.opts.dns == DnsListen::Off => "shoald runs with --net-dns off".into(),
            _ => return Ok(()),
        };
        if policy.allow_dns() {
            return Err(ApiError::BadRequest(format!(
                "network: allow_dns needs the daemon's DNS forwarder, which does not run \
                 ({why}; see shoald --net-dns); give allow_dns false and addresses in allow_out"
            )));
        }
        Ok(())
    }

    /// A slot for a sandbox that will have `policy` (from the pool,
    /// waiting a while if it is empty), and whether it has that policy
    /// already (made ahead with it: [`SlotPool::prepare`]). If not,
    /// [`Networks::set_policy`] applies it while the VM restores: until
    /// then the slot has the policy it was made with (none, or an earlier
    /// create's), but the clone sends nothing that passes before the
    /// agent gives it the slot's MAC and address (the slot drops frames
    /// from any other). Held by the sandbox once its row is recorded
    /// ([`Networks::hold`]).
    pub async fn take(
        &self,
        d: &Arc<Daemon>,
        policy: &EgressPolicy,
    ) -> ApiResult<(Arc<Slot>, bool)> {
        self.check(policy)?;
        let a = self.active(d).await?;
        self.check(policy)?;
        let (a2, want) = (a.clone(), policy.clone());
        blocking("taking a network slot", SLOT_WAIT * 2, move || {
            // Slots made from now on get this policy: the next create
            // with it (a job's sandboxes share one) runs no nft.
            a2.pool.prepare(&want);
            let slot = a2.pool.take_wait_for(&want, SLOT_WAIT).ok_or_else(|| {
                match a2.pool.last_error() {
                    Some(e) => unavailable(format!("no slot is ready ({e})")),
                    None => unavailable(format!("no slot was ready within {SLOT_WAIT:?}")),
                }
            })?;
            // A failure to tell: apply it.
            let ready = slot.has_policy(&want).unwrap_or(false);
            Ok((Arc::new(slot), ready))
        })
        .await
    }

    /// Makes the pool's next slots with `policy` (a create that found a
    /// stocked VMM with its slot took none from the pool).
    pub fn prepare(&self, policy: &EgressPolicy) {
        if let Some(a) = self.active.get() {
            a.pool.prepare(policy);
        }
    }

    /// A slot for a networked template's stocked VMM (with the policy the
    /// pool prepares now) and its TAP, opened for the VMM.
    pub async fn stock_slot(&self, d: &Arc<Daemon>) -> ApiResult<(Arc<Slot>, NetAttach)> {
        let a = self.active(d).await?;
        let limits = self.opts.limits;
        blocking("taking a network slot", SLOT_WAIT * 2, move || {
            let slot = a
                .pool
                .take_wait_for(&a.pool.prepared(), SLOT_WAIT)
                .ok_or_else(|| unavailable("no slot is ready for the VMM stock"))?;
            let attach = attach_to(&slot, limits)?;
            Ok((Arc::new(slot), attach))
        })
        .await
    }

    /// Records `slot` as sandbox `id`'s (its row is in the database, so
    /// the sweep keeps it).
    pub fn hold(&self, id: &str, slot: Arc<Slot>) {
        if let Some(a) = self.active.get() {
            lock(&a.slots).insert(id.to_string(), slot);
        }
    }

    /// A slot lent for a networked template's boot (denies everything;
    /// removed when dropped).
    pub async fn boot_slot(&self, d: &Arc<Daemon>) -> ApiResult<Slot> {
        let a = self.active(d).await?;
        blocking("taking a network slot", SLOT_WAIT * 2, move || {
            let none = EgressPolicy::default();
            let slot = a
                .pool
                .take_wait_for(&none, SLOT_WAIT)
                .ok_or_else(|| unavailable("no slot is ready for the template's boot"))?;
            // One made with a sandbox's policy is closed first.
            if slot.policy() != none {
                slot.set_policy(none)
                    .map_err(|e| ApiError::Internal(format!("closing a boot slot: {e}")))?;
            }
            Ok(slot)
        })
        .await
    }

    /// The slot of sandbox `id`.
    pub fn slot(&self, id: &str) -> Option<Arc<Slot>> {
        let a = self.active.get()?;
        lock(&a.slots).get(id).cloned()
    }

    /// What a backend needs to restore sandbox `id` onto its slot (a TAP
    /// opened inside it). Blocking (enters the slot's netns).
    pub fn attach(&self, id: &str) -> ApiResult<NetAttach> {
        let s = self
            .slot(id)
            .ok_or_else(|| unavailable(format!("sandbox '{id}' has no slot on this daemon")))?;
        attach_to(&s, self.opts.limits)
    }

    /// Applies `spec` to the slot of the running sandbox `id` at once.
    pub async fn set_policy(&self, id: &str, policy: EgressPolicy) -> ApiResult<()> {
        self.check(&policy)?;
        let s = self
            .slot(id)
            .ok_or_else(|| ApiError::Conflict(format!("sandbox '{id}' has no network")))?;
        blocking("changing the network policy", SLOT_WAIT, move || {
            s.set_policy(policy)
                .map_err(|e| ApiError::Internal(format!("applying the policy: {e}")))
        })
        .await
    }

    /// Removes the slot of sandbox `id` (if it has one).
    pub async fn release(&self, id: &str) {
        let Some(a) = self.active.get() else {
            return;
        };
        let Some(s) = lock(&a.slots).remove(id) else {
            return;
        };
        remove_slot(s).await;
    }

    /// Removes the slots whose sandbox is gone or failed (whatever path it
    /// left by).
    pub async fn sweep(&self, d: &Daemon) {
        let Some(a) = self.active.get() else {
            return;
        };
        let ids: Vec<String> = lock(&a.slots).keys().cloned().collect();
        for id in ids {
            let gone = match d.db(|db| db.sandbox(&id)) {
                Ok(r) => r.is_none_or(|r| r.state == State::Failed),
                Err(_) => false,
            };
            if gone {
                self.release(&id).await;
            }
        }
    }

    /// Every slot's counters, by sandbox id (unreadable ones left out).
    pub async fn counters(&self) -> Vec<(String, SlotCounters)> {
        let Some(a) = self.active.get() else {
            return vec![];
        };
        let slots: Vec<_> = lock(&a.slots)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        blocking(
            "reading network counters",
            Duration::from_secs(20),
            move || {
                Ok(slots
                    .into_iter()
                    .filter_map(|(id, s)| s.counters().ok().map(|c| (id, c)))
                    .collect())
            },
        )
        .await
        .unwrap_or_default()
    }

    /// Slots ready in the pool, and held by sandboxes.
    pub fn slot_counts(&self) -> (usize, usize) {
        self.active
            .get()
            .map_or((0, 0), |a| (a.pool.ready(), lock(&a.slots).len()))
    }

    /// At daemon stop: the pool's ready slots go (held ones stay with their
    /// sandboxes, which outlive the daemon).
    pub async fn shutdown(&self) {
        let Some(a) = self.active.get().cloned() else {
            return;
        };
        let r = tokio::task::spawn_blocking(move || {
            let r = a.pool.stop();
            // The forwarder's link stays while slots may DNAT to it.
            if let Some(l) = a.dns_link.as_ref().filter(|_| lock(&a.slots).is_empty()) {
                super::net_dns::remove_link(l);
            }
            r
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::warn!("removing the ready network slots: {e}");
        }
    }
}

/// `PUT /v1/sandboxes/{id}/network`: sandbox `id`'s policy becomes
/// `spec`, in force at once, and recorded.
pub async fn set_network(
    d: &Arc<Daemon>,
    id: &str,
    spec: NetworkSpec,
) -> ApiResult<super::ops::SandboxView> {
    let r = super::ops::row(d, id)?;
    if r.net.is_none() {
        return Err(ApiError::Conflict(format!(
            "sandbox '{id}' has no network device (it was created without 'network')"
        )));
    }
    let policy = network_policy(&spec)?;
    let live = d.live(id);
    let _g = match &live {
        Some(l) => Some(l.op.lock().await),
        None => None,
    };
    d.net.set_policy(id, policy).await?;
    let row = d.db(|db| {
        let Some(mut r) = db.sandbox(id)? else {
            return Ok(None);
        };
        if let Some(n) = r.net.as_mut() {
            n.policy = spec.clone();
        }
        db.put_sandbox(&r)?;
        Ok(Some(r))
    })?;
    let row = row.ok_or_else(|| ApiError::NotFound(format!("no sandbox '{id}'")))?;
    d.event(
        id,
        "network",
        &format!(
            "policy: allow_out {:?}, deny_out {:?}, allow_dns {}",
            spec.allow_out, spec.deny_out, spec.allow_dns
        ),
    );
    Ok(row.into())
}

/// The network part of `/metrics`: slots ready and held, and each
/// networked sandbox's counters (read from its slot's nftables table).
pub async fn render_metrics(d: &Daemon) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if !d.net.is_active() {
        return s;
    }
    let (ready, held) = d.net.slot_counts();
    let _ = writeln!(
        s,
        "# HELP shoal_net_slots Network slots, ready in the pool and held by sandboxes."
    );
    let _ = writeln!(s, "# TYPE shoal_net_slots gauge");
    let _ = writeln!(s, "shoal_net_slots{{state=\"ready\"}} {ready}");
    let _ = writeln!(s, "shoal_net_slots{{state=\"held\"}} {held}");
    let mut counters = d.net.counters().await;
    counters.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, help, pick) in [
        ("shoal_net_packets_total", "Packets per networked sandbox: sent by the guest, received by it, and dropped by its policy.", true),
        ("shoal_net_bytes_total", "Bytes per networked sandbox: sent by the guest, received by it, and dropped by its policy.", false),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} counter");
        for (id, c) in &counters {
            for (dir, n) in [("sent", c.from_guest), ("received", c.to_guest), ("dropped", c.dropped)] {
                let v = if pick { n.packets } else { n.bytes };
                let _ = writeln!(s, "{name}{{sandbox=\"{id}\",dir=\"{dir}\"}} {v}");
            }
        }
    }
    s
}

/// What a VMM needs to run on `slot`: its TAP, opened inside the slot
/// (blocking: enters the slot's netns), its netns and MAC, and `limits`.
fn attach_to(slot: &Slot, limits: NetLimits) -> ApiResult<NetAttach> {
    let tap = slot
        .open_tap_fd()
        .map_err(|e| ApiError::Internal(format!("opening the slot's TAP: {e}")))?;
    Ok(NetAttach {
        netns: slot.netns_path(),
        tap: Arc::new(std::fs::File::from(tap)),
        mac: slot.guest_mac().0,
        limits,
    })
}

/// Removes a slot (on a blocking thread).
pub async fn remove_slot(s: Arc<Slot>) {
    let _ = tokio::task::spawn_blocking(move || match Arc::try_unwrap(s) {
        Ok(s) => {
            if let Err(e) = s.remove() {
                tracing::warn!("removing a slot: {e}");
            }
        }
        // Still used (a counter read, a forwarder call): the last holder's
        // drop removes it.
        Err(s) => drop(s),
    })
    .await;
}

/// At start, after the sandboxes are reattached: with `--net`, or when
/// networked sandboxes outlived the last daemon, the host side is set up
/// now (their slots taken over, what a crash left removed).
pub async fn recover(d: &Arc<Daemon>) {
    let needed = d.net.opts.eager || networked(d).is_ok_and(|r| !r.is_empty());
    if needed {
        if let Err(e) = d.net.start(d).await {
            tracing::error!("{e}");
        }
    }
}

/// The networked sandboxes of the database (their slots to keep).
fn networked(d: &Daemon) -> ApiResult<Vec<SandboxRow>> {
    let rows = d.db(|db| db.list_sandboxes(&super::db::Filter::default()))?;
    Ok(rows
        .into_iter()
        .filter(|r| r.net.is_some() && r.state != State::Failed)
        .collect())
}

async fn setup(d: Arc<Daemon>) -> ApiResult<Arc<Active>> {
    let o = d.net.opts.clone();
    let rows = networked(&d)?;
    let slots: Slots = Arc::default();
    // Where the forwarder goes (the auto one's link made first).
    let o2 = o.clone();
    let (listen, upstreams, mut no_dns, dns_link) = blocking(
        "setting up sandbox networks",
        Duration::from_secs(60),
        move || {
            let missing = shoal_hostnet::probe();
            if !missing.is_empty() {
                return Err(unavailable(format!(
                    "this host cannot give sandboxes networks: {}",
                    missing.join("; ")
                )));
            }
            Ok(forwarder_place(&o2))
        },
    )
    .await?;
    let dns = match listen {
        Some(l) => {
            let p = Arc::new(Policies(slots.clone()));
            let cfg = ForwarderConfig::new(SocketAddr::V4(l), upstreams.clone());
            match DnsForwarder::bind(cfg, p.clone(), p).await {
                Ok(f) => Some(f),
                Err(e) => {
                    no_dns = e.to_string();
                    None
                }
            }
        }
        None => None,
    };
    match &dns {
        Some(f) => tracing::info!(at = %f.local_addr(), ?upstreams, "DNS forwarder for sandboxes"),
        None => tracing::warn!("no DNS forwarder for sandboxes ({no_dns}): allow_dns is refused"),
    }
    let forwarder = dns.as_ref().and_then(|f| match f.local_addr() {
        SocketAddr::V4(a) => Some(a),
        SocketAddr::V6(_) => None,
    });
    let cfg = NetConfig {
        pool: o.pool,
        forwarder,
        netns_prefix: o.netns_prefix.clone(),
        link_prefix: o.link_prefix.clone(),
        ..NetConfig::default()
    };
    let s2 = slots.clone();
    let auto = dns_link.is_some();
    let pool = blocking(
        "setting up sandbox networks",
        Duration::from_secs(120),
        move || {
            let host = HostNet::setup(cfg).map_err(unavailable)?;
            if auto {
                // The forwarder's address is no slot's.
                host.reserve_index(super::net_dns::reserved_index(&o.pool));
            }
            adopt(&host, &rows, &s2)?;
            SlotPool::start(host, o.slots).map_err(unavailable)
        },
    )
    .await?;
    tracing::info!(pool = %o.pool.net(), slots = o.slots, "sandbox networks set up");
    Ok(Arc::new(Active {
        pool,
        slots,
        dns,
        no_dns,
        dns_link,
    }))
}

/// Where the forwarder listens, the upstreams it asks, why there is none
/// (when there is none) and the auto forwarder's link.
fn forwarder_place(
    o: &NetOptions,
) -> (
    Option<SocketAddrV4>,
    Vec<SocketAddr>,
    String,
    Option<String>,
) {
    use super::net_dns;
    let upstreams = match o.dns_upstreams.is_empty() {
        true => net_dns::host_nameservers(),
        false => o.dns_upstreams.clone(),
    };
    if o.dns == DnsListen::Off {
        return (
            None,
            upstreams,
            "shoald runs with --net-dns off".into(),
            None,
        );
    }
    if upstreams.is_empty() {
        let why = "no nameserver in /etc/resolv.conf: give --net-dns-upstream".into();
        return (None, upstreams, why, None);
    }
    match o.dns {
        DnsListen::At(a) => (Some(a), upstreams, String::new(), None),
        _ => {
            let Some(link) = net_dns::link_name(&o.link_prefix) else {
                let why = "--net-link-prefix is too long for the forwarder's link".into();
                return (None, upstreams, why, None);
            };
            let addr = match o.pool.slot(net_dns::reserved_index(&o.pool)) {
                Ok(a) => a.host,
                Err(e) => return (None, upstreams, e.to_string(), None),
            };
            match net_dns::auto_link(&link, addr) {
                Ok(()) => (
                    Some(SocketAddrV4::new(addr, net_dns::PORT)),
                    upstreams,
                    String::new(),
                    Some(link),
                ),
                Err(e) => (None, upstreams, format!("making {link}: {e}"), None),
            }
        }
    }
}

/// Removes what a crashed daemon left and takes over the slots of the
/// sandboxes in `rows` (their policies applied again).
fn adopt(host: &Arc<HostNet>, rows: &[SandboxRow], slots: &Slots) -> ApiResult<()> {
    let keep: HashSet<u32> = rows
        .iter()
        .filter_map(|r| r.net.as_ref())
        .map(|n| n.slot)
        .collect();
    let r = host.reclaim_stale(&keep).map_err(unavailable)?;
    if !r.netns.is_empty() || !r.links.is_empty() {
        tracing::info!(netns = ?r.netns, links = ?r.links, "removed the slots a crashed daemon left");
    }
    for row in rows {
        let Some(n) = &row.net else { continue };
        let adopted = policy_of(&n.policy)
            .map_err(|e| e.to_string())
            .and_then(|p| Slot::adopt(host, n.slot, p).map_err(|e| e.to_string()));
        match adopted {
            Ok(s) => {
                lock(slots).insert(row.id.clone(), Arc::new(s));
            }
            Err(e) => tracing::warn!(sandbox = %row.id, "its network slot: {e}"),
        }
    }
    Ok(())
}

/// The egress policy of `net`, or a 400 with hostnet's message.
pub fn network_policy(net: &NetworkSpec) -> ApiResult<EgressPolicy> {
    policy_of(net).map_err(|e| ApiError::BadRequest(format!("network: {e}")))
}

/// The policy of a stored network spec.
pub fn policy_of(n: &NetworkSpec) -> Result<EgressPolicy, shoal_hostnet::PolicyError> {
    EgressPolicy::parse(&n.allow_out, &n.deny_out, n.allow_dns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_already_allowed_need_no_set_entry() {
        let p = |a: &[&str], d: &[&str]| EgressPolicy::parse(a, d, true).unwrap();
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let internet = p(&["0.0.0.0/0", "*"], &["1.1.1.1"]);
        assert!(covered(&internet, ip("93.184.216.34")));
        // Denied or always denied: the set would not let it through either.
        assert!(covered(&internet, ip("1.1.1.1")));
        let names = p(&["example.com", "10.0.0.0/8:443"], &[]);
        assert!(!covered(&names, ip("93.184.216.34")));
        assert!(!covered(&names, ip("10.1.2.3")), "only port 443 is allowed");
        assert!(!covered(&internet, ip("2001:db8::1")));
    }
}
