//! Shoal guest agent: the wire protocol ([`proto`]) shared by the agent
//! (`shoal-agent`, the guest's PID 1) and the host, and the host's blocking
//! client ([`client`]).

pub mod client;
pub mod proto;
pub mod syscount;
