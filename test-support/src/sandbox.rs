//! Sandboxes restored from a template (daemon-less), driven through the
//! guest agent.

use agent_client::{Client, ExecRequest, ExitStatus};
use shoal_runtime::sandbox::Sandbox;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

/// How long a restored sandbox's agent has to answer.
const UP: Duration = Duration::from_secs(180);
/// The deadline of every agent call: due within minutes even on a PVM
/// host, so no call can hang a test.
const CALL: Duration = Duration::from_secs(300);

/// A sandbox restored from a template or snapshot; stopped (and its VMM
/// reaped) when dropped.
pub struct RunningSandbox {
    /// The sandbox (its sockets, its directory).
    pub sb: Sandbox,
    /// Its VMM process.
    pub child: Option<Child>,
}

impl RunningSandbox {
    /// Restores `from` (a template or snapshot directory) and connects to
    /// its agent (post-restore: fresh entropy and clock).
    pub fn start(from: &Path) -> (RunningSandbox, Client) {
        let (sb, child) = Sandbox::start(from, false)
            .unwrap_or_else(|e| panic!("start a sandbox from {}: {e}", from.display()));
        let r = RunningSandbox { sb, child };
        let c = r.sb.connect(UP, true).expect("agent reachable");
        c.set_timeout(Some(CALL));
        (r, c)
    }

    /// The pid of its VMM.
    pub fn vmm_pid(&self) -> u32 {
        self.child.as_ref().expect("a VMM child").id()
    }
}

impl Drop for RunningSandbox {
    fn drop(&mut self) {
        self.sb.stop(self.child.as_mut());
    }
}

/// Runs `/bin/sh -c script` in the guest: its stdout, stderr (lossily
/// decoded) and how it ended.
pub fn sh(c: &Client, script: &str) -> (String, String, ExitStatus) {
    let out = c
        .exec_simple(&ExecRequest::argv(["/bin/sh", "-c", script]))
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.result.status,
    )
}

/// `len` bytes of test data for file round trips: no short period, so a
/// misplaced or repeated block shows.
pub fn file_data(len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = i.wrapping_mul(2_654_435_761) >> 13;
            // The low byte: the truncation is the point.
            x.to_le_bytes()[0]
        })
        .collect()
}
