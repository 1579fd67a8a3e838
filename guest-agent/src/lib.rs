//! Temporary re-exports for the host crates that still import
//! `guest_agent::{client, proto, syscount}`: the protocol now lives in the
//! `agent-proto` crate and the clients in `agent-client`. Removed once the
//! host crates import those directly (the agent binary uses neither this
//! library nor `agent-client`).

#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_lossless
)]

pub use agent_client::syscount;
pub use agent_proto as proto;

/// The host clients (now `agent_client`).
pub mod client {
    pub use agent_client::*;
}
