//! The control protocol of `shoal-vmm --api-sock PATH`: one request enum,
//! one typed reply per request, a [`Client`] and the socket side of the
//! server ([`serve`], which hands each request to the VMM as a [`Command`]
//! carrying a typed [`Responder`]).
//!
//! On the wire every message is one JSON object on one line, at most
//! [`MAX_LINE`] bytes (newline included) each way:
//!
//! | request | success reply |
//! |---|---|
//! | `{"op":"pause"}` | `{"ok":true}` |
//! | `{"op":"resume"}` | `{"ok":true}` |
//! | `{"op":"shutdown"}` | `{"ok":true}` |
//! | `{"op":"stats"}` | `{"ok":true,"stats":{..}}` ([`Stats`]) |
//! | `{"op":"sample"}` | `{"ok":true,"rips":[..]}` ([`Sample`]) |
//! | `{"op":"snapshot","dir":"/d","diff":false}` | `{"ok":true,"snapshot":{..}}` ([`SnapshotInfo`]) |
//! | `{"op":"restore","dir":"/d","disks":["/f"]}` | `{"ok":true,"restore_ms":1.5}` ([`RestoreInfo`]) |
//! | `{"op":"balloon","target_mib":64}` | `{"ok":true,"balloon":{..}}` ([`BalloonInfo`]) |
//! | `{"op":"evict","dir":"/d"}` | `{"ok":true,"evict":{..}}` ([`EvictInfo`]) |
//!
//! A refused request is answered `{"ok":false,"error":"why"}`. The client
//! gives every call one deadline (connect, send and reply together).
//!
//! [`cmdline`] holds the convention for the kernel command line the VMM is
//! started with, which launchers share with the VMM.

mod balloon;
mod client;
pub mod cmdline;
mod server;
mod wire;

pub use balloon::{BalloonInfo, EvictInfo, GuestMemoryStats};
pub use client::{ApiError, Client, ReplyError};
pub use server::{
    serve, serve_with, Command, Responder, ServeOptions, ServerThread, ThreadInit, IDLE_TIMEOUT,
    MAX_CONNECTIONS,
};
pub use wire::{
    NetStats, Reply, ReplyBody, Request, RestoreInfo, Sample, SnapshotInfo, Stats, VmState,
    MAX_LINE,
};
