//! `shoal-jailer [SPEC...] -- PROGRAM [ARGS...]`: runs PROGRAM confined as
//! the spec says (see the `shoal_jailer` crate), and ends as it ended: with
//! its exit status, or by the signal that killed it.

use anyhow::Context;
use shoal_jailer::run::{run, Ended};
use shoal_jailer::JailSpec;

fn main() {
    let spec = match JailSpec::parse(std::env::args_os().skip(1)).context("bad jail spec") {
        Ok(s) => s,
        Err(e) => {
            eprintln!("shoal-jailer: {e:#}");
            std::process::exit(2);
        }
    };
    match run(&spec) {
        Ok(Ended::Code(c)) => std::process::exit(c),
        Ok(Ended::Signal(s)) => {
            // SAFETY: restoring a signal's default action, unblocking it
            // and sending it to ourselves; plain integers and a local set.
            unsafe {
                libc::signal(s, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, s);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(s);
            }
            std::process::exit(128 + s);
        }
        Err(e) => {
            eprintln!("shoal-jailer: {e}");
            std::process::exit(shoal_jailer::run::SETUP_FAILED);
        }
    }
}
