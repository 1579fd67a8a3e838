//! Prerequisites of tests: each check panics with what is missing and why
//! the test needs it, so a test that cannot run fails instead of passing
//! quietly.

use std::sync::{Mutex, MutexGuard};

/// Panics with a clear message when /dev/kvm is unusable: tests that run
/// guests must fail, not skip, on a host without KVM.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("this test runs guests and needs /dev/kvm (read-write): {e}");
    }
}

/// One VM at a time in this test binary: [`require_kvm`], then a lock
/// held while the returned guard lives. For tests whose VMs must not run
/// in parallel in one process (production runs one VM per VMM process; on
/// a PVM host, small guests run in parallel in one process failed
/// intermittently: a running real-mode guest's pause not confirmed within
/// 10 s, a pre-warmed reload's output check; 2 of 5 parallel runs, 0 of 4
/// serial runs; not root-caused). A test that panicked while holding it
/// does not poison it for the others.
pub fn kvm_serial() -> MutexGuard<'static, ()> {
    let guard = one_vm_at_a_time();
    require_kvm();
    guard
}

/// The lock behind [`kvm_serial`]; a holder's panic does not poison it.
fn one_vm_at_a_time() -> MutexGuard<'static, ()> {
    static ONE_VM_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_VM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A KVM handle, for tests that drive KVM directly (no VMM).
pub fn kvm() -> kvm_ioctls::Kvm {
    kvm_ioctls::Kvm::new()
        .unwrap_or_else(|e| panic!("this test drives KVM and needs /dev/kvm (read-write): {e}"))
}

/// Panics unless the test runs as root; `why` says what needs it.
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test needs root ({why}); running as uid {euid}: run the tests as root"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serial_lock_survives_a_panicking_holder() {
        let holder = std::thread::spawn(|| {
            let _g = one_vm_at_a_time();
            panic!("holder panics");
        });
        assert!(holder.join().is_err());
        // Taken again at once, not poisoned.
        drop(one_vm_at_a_time());
    }
}
