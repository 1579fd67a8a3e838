//! The VMM stock: per template, a few VM processes started ahead of the
//! sandboxes they will run ([`StockedVm`]: for microVMs a jailed
//! `shoal-vmm --prewarm` with its jail, cgroup, KVM VM and vCPUs made),
//! so that a create the warm pool does not serve pays only the restore.
//!
//! Unlike a warm pool (restored sandboxes, asked for per template), the
//! stock is automatic: a template joins it at its first create (or pool
//! refill) and it keeps [`Stock::target`] VMMs for it (`shoald
//! --vmm-stock N`, 0: none), refilled in the background, at most
//! [`PARALLEL`] starts at a time per template. Each entry's sandbox id and
//! directory are chosen when it is started (a jailed VMM's root holds that
//! directory at that path); a create takes the id with the entry. An entry
//! is handed out once (taken out under the lock); one whose process died
//! is discarded, never handed out. A template deleted, rebuilt under its
//! name (another directory) or no longer ready loses its entries, and the
//! daemon ends them all when it stops.
//!
//! A networked template's entries each hold a network slot of their own
//! (taken from the slot pool, with the policy it prepares), the VMM
//! started in that slot's netns with its net device on the slot's TAP, so
//! that a networked create, too, pays only the restore (and the policy,
//! when the slot was made with another).
//!
//! Stocked VMMs are not sandboxes: they reserve no guest memory (their
//! guest RAM is a mapping nothing has touched until a restore maps the
//! snapshot over it; a 128 MiB one: 3.5 MiB RSS, 2.0 MiB PSS), but each is
//! a VMM process, so one is started only while admission would admit one
//! more sandbox with the stock counted among the sandboxes holding a VMM
//! (the cap and the host's available memory); metrics show how many there
//! are (`shoal_vmm_stock`) and how creates were served.

use super::db::TemplateRow;
use super::{admission, Daemon};
use shoal_hostnet::Slot;
use shoal_runtime::backend::StockedVm;
use shoal_runtime::fresh::random_id;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// VMM starts in flight per template at most.
pub const PARALLEL: usize = 2;

/// How long after a take the refill waits before starting VMMs, so that
/// starting one (a jail, a KVM VM) does not compete for the CPUs with the
/// restore of the create that took one.
pub const REFILL_DELAY: Duration = Duration::from_millis(30);

/// One stocked VMM, with the sandbox id and directory it was started for.
#[derive(Debug)]
pub struct Entry {
    /// The sandbox id it is for.
    pub id: String,
    /// That sandbox's directory.
    pub dir: PathBuf,
    /// The VM process.
    pub vm: Box<dyn StockedVm>,
    /// Its network slot (a networked template's entry); removed with the
    /// entry unless a create takes it.
    pub slot: Option<Arc<Slot>>,
}

/// The stock of one template (by its directory: a template rebuilt under
/// the same name is another).
#[derive(Debug)]
struct Shelf {
    name: String,
    /// A networked template: entries get slots.
    net: bool,
    vcpus: u8,
    memory_mib: u32,
    ready: Vec<Entry>,
    starting: usize,
}

/// Every template's stock.
#[derive(Debug, Default)]
pub struct Stock {
    /// VMMs kept per template (0: no stock).
    pub target: usize,
    shelves: Mutex<HashMap<PathBuf, Shelf>>,
    /// Wakes the refiller.
    pub wake: tokio::sync::Notify,
    /// Creates (and pool refills) served from the stock.
    pub hits: AtomicU64,
    /// Creates that found the stock of their template empty.
    pub misses: AtomicU64,
    /// Entries found dead and discarded.
    pub dead: AtomicU64,
    last_take: Mutex<Option<std::time::Instant>>,
}

impl Stock {
    /// A stock of `target` VMMs per template.
    pub fn new(target: usize) -> Stock {
        Stock {
            target,
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Shelf>> {
        self.shelves.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A live stocked VMM for a sandbox of `t`, if one is ready (dead ones
    /// met on the way are discarded); `t` joins the stock if it was not in
    /// it.
    pub fn take(&self, t: &TemplateRow) -> Option<Entry> {
        if self.target == 0 {
            return None;
        }
        let mut dead = vec![];
        let got = {
            let mut g = self.lock();
            let shelf = g.entry(t.dir.clone()).or_insert_with(|| Shelf {
                name: t.name.clone(),
                net: t.net,
                vcpus: u8::try_from(t.vcpus).unwrap_or(u8::MAX),
                memory_mib: t.memory_mib,
                ready: vec![],
                starting: 0,
            });
            let mut got = None;
            while let Some(e) = shelf.ready.pop() {
                if e.vm.alive() {
                    got = Some(e);
                    break;
                }
                dead.push(e);
            }
            got
        };
        self.dead.fetch_add(dead.len() as u64, Ordering::Relaxed);
        discard(dead);
        *self.last_take.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        match &got {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        self.wake.notify_one();
        got
    }

    /// Stocked VMMs ready now.
    pub fn len(&self) -> usize {
        self.lock().values().map(|s| s.ready.len()).sum()
    }

    /// Whether none is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stocked VMMs ready or starting (what admission counts).
    fn held(&self) -> usize {
        self.lock()
            .values()
            .map(|s| s.ready.len() + s.starting)
            .sum()
    }

    /// Takes every entry of template `name` out of the stock (it leaves
    /// the stock until its next create).
    pub fn remove_template(&self, name: &str) -> Vec<Entry> {
        let mut g = self.lock();
        let dirs: Vec<PathBuf> = g
            .iter()
            .filter(|(_, s)| s.name == name)
            .map(|(d, _)| d.clone())
            .collect();
        dirs.into_iter()
            .filter_map(|d| g.remove(&d))
            .flat_map(|s| s.ready)
            .collect()
    }

    /// Takes every entry out, and stops stocking.
    pub fn remove_all(&self) -> Vec<Entry> {
        self.lock().drain().flat_map(|(_, s)| s.ready).collect()
    }
}

/// Ends stocked VMMs and removes their directories, in the background (on
/// a blocking thread: ending a process waits for it).
pub fn discard(entries: Vec<Entry>) {
    if entries.is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => drop(h.spawn_blocking(move || discard_now(entries))),
        Err(_) => discard_now(entries),
    }
}

/// Ends stocked VMMs and removes their directories and slots, now
/// (blocking).
pub fn discard_now(entries: Vec<Entry>) {
    for e in entries {
        e.vm.discard();
        let _ = std::fs::remove_dir_all(&e.dir);
        if let Some(s) = e.slot.and_then(|s| Arc::try_unwrap(s).ok()) {
            if let Err(err) = s.remove() {
                tracing::warn!("removing a stocked VMM's network slot: {err}");
            }
        }
    }
}

/// Ends the stock of template `name` (deleted) and waits until its VMMs
/// are gone.
pub async fn drain_template(d: &Arc<Daemon>, name: &str) {
    let entries = d.stock.remove_template(name);
    if !entries.is_empty() {
        let _ = tokio::task::spawn_blocking(move || discard_now(entries)).await;
    }
}

/// Whether one more VMM may be started for the stock.
fn admitted(d: &Daemon) -> bool {
    let Ok(mut u) = d.db(|db| db.usage()) else {
        return false;
    };
    u.vms += d.stock.held() as u64;
    admission::admit(&d.cfg.limits, &u, 0, 0, admission::available_mib()).is_ok()
}

/// Refills the stock, forever (until the daemon stops).
pub async fn run(d: Arc<Daemon>) {
    if d.stock.target == 0 {
        return;
    }
    loop {
        tokio::select! {
            _ = d.stock.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        // Creates first: wait until none has taken one for a while.
        loop {
            let since = d
                .stock
                .last_take
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .map(|t| t.elapsed());
            match since {
                Some(s) if s < REFILL_DELAY => tokio::time::sleep(REFILL_DELAY - s).await,
                _ => break,
            }
        }
        refill(&d).await;
    }
}

async fn refill(d: &Arc<Daemon>) {
    // Templates that are gone, rebuilt or not ready lose their stock;
    // dead entries go.
    let keys: Vec<(PathBuf, String)> = d
        .stock
        .lock()
        .iter()
        .map(|(k, s)| (k.clone(), s.name.clone()))
        .collect();
    let mut gone = vec![];
    for (dir, name) in keys {
        let ok = super::ops::ready_template(d, &name).is_ok_and(|t| t.dir == dir);
        let mut g = d.stock.lock();
        if !ok {
            if let Some(s) = g.remove(&dir) {
                gone.extend(s.ready);
            }
            continue;
        }
        if let Some(s) = g.get_mut(&dir) {
            let (live, dead): (Vec<Entry>, Vec<Entry>) = std::mem::take(&mut s.ready)
                .into_iter()
                .partition(|e| e.vm.alive());
            s.ready = live;
            d.stock.dead.fetch_add(dead.len() as u64, Ordering::Relaxed);
            gone.extend(dead);
        }
    }
    discard(gone);
    let want: Vec<(PathBuf, Shape, usize)> = d
        .stock
        .lock()
        .iter()
        .map(|(k, s)| {
            let n = d
                .stock
                .target
                .saturating_sub(s.ready.len() + s.starting)
                .min(PARALLEL.saturating_sub(s.starting));
            let shape = Shape {
                vcpus: s.vcpus,
                memory_mib: s.memory_mib,
                net: s.net,
            };
            (k.clone(), shape, n)
        })
        .filter(|w| w.2 > 0)
        .collect();
    for (tpl, shape, n) in want {
        for _ in 0..n {
            if !admitted(d) {
                return;
            }
            match d.stock.lock().get_mut(&tpl) {
                Some(s) => s.starting += 1,
                None => break,
            }
            let d = d.clone();
            let tpl = tpl.clone();
            tokio::spawn(async move { fill_one(&d, tpl, shape).await });
        }
    }
}

/// What a shelf's VMMs are made as.
#[derive(Debug, Clone, Copy)]
struct Shape {
    vcpus: u8,
    memory_mib: u32,
    net: bool,
}

/// Starts one VMM of `tpl` for the sandbox directory `dir` (a networked
/// template's on a slot of its own, returned with it); None, logged, if
/// it could not.
async fn start_one(
    d: &Arc<Daemon>,
    tpl: &Path,
    shape: Shape,
    dir: &Path,
) -> (Option<Box<dyn StockedVm>>, Option<Arc<Slot>>) {
    let net = match shape.net {
        true => match d.net.stock_slot(d).await {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(template = %tpl.display(), "VMM stock: {e}");
                return (None, None);
            }
        },
        false => None,
    };
    let (slot, attach) = net.unzip();
    let (backend, t, sd) = (d.backend.clone(), tpl.to_path_buf(), dir.to_path_buf());
    let res = tokio::task::spawn_blocking(move || {
        backend.stock(&sd, &t, shape.vcpus, shape.memory_mib, attach.as_ref())
    })
    .await;
    let vm = match res {
        Ok(Ok(vm)) => vm,
        Ok(Err(e)) => {
            tracing::warn!(template = %tpl.display(), "VMM stock: {e}");
            None
        }
        Err(e) => {
            tracing::warn!(template = %tpl.display(), "VMM stock: {e}");
            None
        }
    };
    (vm, slot)
}

async fn fill_one(d: &Arc<Daemon>, tpl: PathBuf, shape: Shape) {
    let id = random_id();
    let dir = d.cfg.sandboxes_dir().join(&id);
    let (vm, slot) = start_one(d, &tpl, shape, &dir).await;
    let failed = vm.is_none().then(|| dir.clone());
    let (left, unused_slot) = {
        let mut g = d.stock.lock();
        match (g.get_mut(&tpl), vm) {
            (Some(s), Some(vm)) => {
                s.starting = s.starting.saturating_sub(1);
                s.ready.push(Entry { id, dir, vm, slot });
                (None, None)
            }
            // Still counted as starting while it backs off (below).
            (Some(_), None) => (None, slot),
            // The template left the stock meanwhile.
            (None, Some(vm)) => (Some(Entry { id, dir, vm, slot }), None),
            (None, None) => (None, slot),
        }
    };
    if let Some(e) = left {
        discard(vec![e]);
    }
    if let Some(s) = unused_slot {
        crate::net::remove_slot(s).await;
    }
    if let Some(dir) = failed {
        crate::remove_vm_dir(dir).await;
        // Back off before the next try.
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(s) = d.stock.lock().get_mut(&tpl) {
            s.starting = s.starting.saturating_sub(1);
        }
    }
}
