//! The VMM stock (`shoald --vmm-stock N`): VM processes started ahead per
//! template, each handed to one create only; dead ones discarded; a
//! deleted template's ended; all ended when the daemon stops; 0: none.

use crate::harness::*;
use shoal_client::api::{self, CreateSandbox, SnapshotRequest};
use std::collections::BTreeMap;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn stocked(d: &TestDaemon) -> f64 {
    d.metric("shoal_vmm_stock").unwrap_or(-1.0)
}

/// The agent processes under the sandboxes' directory that no sandbox
/// has: the stock's, by the directory (sandbox id) they were started for.
fn stock_procs(d: &TestDaemon) -> BTreeMap<String, i32> {
    let ids: Vec<String> =
        d.c.list(&api::ListFilter::default())
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
    d.agent_pids()
        .into_iter()
        .filter_map(|pid| {
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
            let id = cwd.file_name()?.to_string_lossy().into_owned();
            (!ids.contains(&id)).then_some((id, pid))
        })
        .collect()
}

fn with_stock(n: usize) -> TestDaemon {
    TestDaemon::with(Opts {
        vmm_stock: n,
        pools: false,
        ..Default::default()
    })
}

#[test]
fn a_stocked_vmm_serves_one_create_and_the_stock_refills() {
    let d = with_stock(2);
    // The first create of a template restores it cold; the template then
    // joins the stock.
    let first = d.create();
    assert_eq!(d.metric("shoal_vmm_stock_misses_total"), Some(1.0));
    d.wait_for("the stock filled", T, || stocked(&d) == 2.0);
    let ready = stock_procs(&d);
    assert_eq!(ready.len(), 2, "{ready:?}");

    let mut handed = vec![];
    for _ in 0..4 {
        let ready = stock_procs(&d);
        let sb = d.create();
        assert_eq!(sb.from_pool, Some(false));
        // It took a stocked process, with the id it was started for.
        assert_eq!(ready.get(&sb.id).copied(), sb.pid, "{ready:?} {sb:?}");
        assert!(!handed.contains(&sb.id), "{} handed out twice", sb.id);
        let (code, out) = d.sh(&sb.id, "pwd").unwrap();
        assert_eq!(code, Some(0));
        assert_eq!(out.trim(), d.sandboxes_dir().join(&sb.id).to_string_lossy());
        handed.push(sb.id);
        d.wait_for("the stock refilled", T, || stocked(&d) == 2.0);
        // What is stocked now is none of the sandboxes.
        assert!(stock_procs(&d).keys().all(|k| !handed.contains(k)));
    }
    assert_eq!(d.metric("shoal_vmm_stock_hits_total"), Some(4.0));
    assert!(!handed.contains(&first.id));
    // Removed sandboxes do not go back to the stock.
    for id in &handed {
        d.c.kill(id).unwrap();
    }
    d.wait_for("the stock stays at its target", T, || {
        stocked(&d) == 2.0 && stock_procs(&d).len() == 2
    });
}

#[test]
fn a_dead_stocked_vmm_is_discarded_never_handed_out() {
    let d = with_stock(1);
    d.create();
    // Ready, not only started: a stocked VMM killed while it starts is a
    // failed fill, not a dead entry.
    d.wait_for("the stock filled", T, || {
        stocked(&d) == 1.0 && stock_procs(&d).len() == 1
    });
    let (dead_id, pid) = stock_procs(&d).into_iter().next().unwrap();
    crash(pid);
    d.wait_for("the process died", T, || gone(pid));
    let sb = d.create();
    assert_ne!(sb.id, dead_id, "a dead stocked VMM was handed out");
    assert_eq!(d.sh(&sb.id, "true").unwrap().0, Some(0));
    d.wait_for("the dead entry was discarded", T, || {
        d.metric("shoal_vmm_stock_dead_total") == Some(1.0)
            && !d.sandboxes_dir().join(&dead_id).exists()
    });
    d.wait_for("the stock refilled", T, || stock_procs(&d).len() == 1);
}

#[test]
fn deleting_a_template_or_stopping_the_daemon_ends_its_stock() {
    let mut d = with_stock(2);
    let sb = d.create();
    let req = SnapshotRequest {
        template: Some("mine".into()),
    };
    d.c.snapshot(&sb.id, &req).unwrap();
    d.wait_for("tiny's stock filled", T, || {
        stocked(&d) == 2.0 && stock_procs(&d).len() == 2
    });
    let tiny: Vec<i32> = stock_procs(&d).into_values().collect();
    let from_mine =
        d.c.create(&CreateSandbox {
            template: Some("mine".into()),
            ..Default::default()
        })
        .unwrap();
    // Ready, none starting.
    d.wait_for("both stocks filled", T, || {
        stocked(&d) == 4.0 && stock_procs(&d).len() == 4
    });
    let mine: BTreeMap<String, i32> = stock_procs(&d)
        .into_iter()
        .filter(|(_, p)| !tiny.contains(p))
        .collect();
    assert_eq!(mine.len(), 2);
    d.c.kill(&from_mine.id).unwrap();
    d.c.delete_template("mine").unwrap();
    // Gone by the time the delete returns.
    assert_eq!(stocked(&d), 2.0);
    for (id, pid) in &mine {
        assert!(gone(*pid), "stocked VMM {pid} of a deleted template");
        assert!(!d.sandboxes_dir().join(id).exists());
    }
    // Not refilled afterwards.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(stock_procs(&d).len(), 2);
    d.down();
    for pid in tiny {
        assert!(gone(pid), "stocked VMM {pid} outlived the daemon");
    }
}

#[test]
fn a_stock_of_zero_starts_nothing_ahead() {
    let d = with_stock(0);
    let a = d.create();
    let b = d.create();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(stock_procs(&d).is_empty());
    assert_eq!(stocked(&d), 0.0);
    assert_eq!(d.metric("shoal_vmm_stock_misses_total"), Some(0.0));
    assert_eq!(d.agent_pids().len(), 2, "{a:?} {b:?}");
}
