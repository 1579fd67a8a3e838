//! One module per fuzz target; each one's corpus (inputs kept as
//! regression cases) is in `__fuzz__/targets__<module>__<test>/corpus`
//! beside this file.

mod agent_frames;
mod agent_messages;
mod api;
mod balloon;
mod blk;
mod e2b_envd;
mod mmio;
mod pmem;
mod snapshot_state;
mod vsock;
