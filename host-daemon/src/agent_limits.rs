//! Deadlines and bounds of everything the daemon asks of a sandbox's agent,
//! which is not trusted (a guest's user code is root and can replace or
//! drive the agent): how long a call, an exec beyond its own timeout, a
//! file operation may take; how much one reply may make the daemon hold;
//! how many calls one sandbox may have in flight.

use agent_client::{Config, Limits};
use std::time::Duration;

/// How the daemon bounds its calls into sandboxes' agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentLimits {
    /// Each request/response call, and each frame of a transfer.
    pub call_timeout: Duration,
    /// How long after a command's own timeout its result may come.
    pub exec_slack: Duration,
    /// A whole stat, listing or remove.
    pub file_op_timeout: Duration,
    /// A stream whose HTTP client does not take its frames for this long
    /// is dropped (a streamed exec's command is killed). The protocol has
    /// no per-stream flow control, so while one stream is not taken the
    /// sandbox's other requests wait: this bounds how long.
    pub stall_timeout: Duration,
    /// Agent calls (requests and open streams) one sandbox may have in
    /// flight; more are refused at once (429), never queued.
    pub max_in_flight: usize,
    /// Most bytes per stream (stdout, stderr) a one-shot exec returns; the
    /// rest is dropped and the result says `truncated`.
    pub exec_output_limit: usize,
    /// Most bytes per stream of a background command's output kept from
    /// its start (what a wait returns; bookkeeping counted, see
    /// [`crate::command_output`]).
    pub command_output_limit: usize,
    /// Most bytes of a background command's latest output kept past that
    /// (replayed to a re-attach).
    pub command_replay_limit: usize,
    /// Background commands one sandbox remembers (running or finished).
    pub max_commands: usize,
    /// Most entries of one directory listing.
    pub max_dir_entries: usize,
    /// Most bytes one directory listing may hold (names, and
    /// [`agent_client::DIR_ENTRY_OVERHEAD`] per entry).
    pub max_dir_bytes: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            call_timeout: Duration::from_secs(120),
            exec_slack: Duration::from_secs(30),
            file_op_timeout: Duration::from_secs(120),
            stall_timeout: Duration::from_secs(15),
            max_in_flight: 1024,
            exec_output_limit: 16 << 20,
            command_output_limit: 1 << 20,
            command_replay_limit: 1 << 20,
            max_commands: 32,
            max_dir_entries: 1 << 20,
            max_dir_bytes: 64 << 20,
        }
    }
}

impl AgentLimits {
    /// The agent client's configuration: connecting within `connect`, the
    /// rest as these limits say.
    pub fn client_config(&self, connect: Duration) -> Config {
        Config {
            connect_timeout: connect,
            call_timeout: self.call_timeout,
            exec_slack: self.exec_slack,
            stall_timeout: self.stall_timeout,
            limits: Limits {
                max_collected_output: self.exec_output_limit.saturating_mul(2),
                max_read_file: 64 << 20,
                max_dir_entries: self.max_dir_entries,
                max_dir_bytes: self.max_dir_bytes,
                max_in_flight: self.max_in_flight.max(1),
            },
            ..Config::default()
        }
    }
}
