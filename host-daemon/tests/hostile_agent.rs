//! The real daemon (its HTTP API over its Unix socket, its SQLite state)
//! against a hostile guest agent: a stand-in speaking the real protocol
//! that never ends a listing, goes silent after `ExecStarted`, floods,
//! sends oversized or undecodable frames, answers under wrong request ids,
//! or ignores a hybrid vsock `CONNECT`. In each case the call comes back
//! with a clear error within its deadline, the daemon's memory, threads
//! and descriptors stay bounded, a healthy neighbour sandbox and a new
//! create keep answering promptly, and nothing the call held is left once
//! it is over.
//!
//! The tests measure this process (/proc/self), so they run one at a time.

#[path = "fake_daemon/harness.rs"]
#[allow(dead_code)] // shared with the fake_daemon tests; this binary uses part
mod harness;
#[path = "hostile_agent/stand_in.rs"]
mod stand_in;
#[path = "hostile_agent/tests.rs"]
mod tests;
