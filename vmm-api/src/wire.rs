//! The messages: requests, the reply body of each, and how a reply line is
//! encoded and decoded.

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt;
use std::path::PathBuf;

pub use crate::balloon::{BalloonInfo, EvictInfo};

/// Longest line either side accepts, newline included.
pub const MAX_LINE: usize = 64 * 1024;

/// A control request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Stop all vCPUs (devices stay up).
    Pause,
    /// Continue after a pause or snapshot.
    Resume,
    /// Write a snapshot into `dir` (created if missing). The vCPUs are
    /// paused first and stay paused.
    Snapshot {
        /// Target directory.
        dir: PathBuf,
        /// Only the memory pages that differ from the snapshot this VM was
        /// restored from (`memory.diff`; the base must stay in place).
        #[serde(default)]
        diff: bool,
    },
    /// Replace the guest with the snapshot in `dir`, reusing this VM
    /// (its KVM objects, memory slots and vCPUs): the fast path for pools.
    Restore {
        /// Snapshot directory.
        dir: PathBuf,
        /// Files for the saved disks, in order (`/dev/vda`, ...): each
        /// replaces the saved disk's path; none: as saved.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        disks: Vec<PathBuf>,
    },
    /// End the VM and the VMM process.
    Shutdown,
    /// Counters.
    Stats,
    /// Where each vCPU is right now (instruction pointers; the vCPUs are
    /// stopped for a moment): a sampling profiler for the guest.
    Sample,
    /// The balloon device: sets the host's target (guest memory the
    /// balloon should take, in MiB) if given, asks the guest for new
    /// memory statistics, and answers with the balloon's state.
    Balloon {
        /// New target in MiB (at most guest memory); none: unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target_mib: Option<u64>,
    },
    /// Cold-memory eviction: pushes the guest pages private to this VM
    /// out of host RAM (to swap where the host has it, else to an unnamed
    /// sparse file in `dir`, re-mapped over guest RAM). The guest reads
    /// the same bytes afterwards.
    Evict {
        /// Directory for the eviction file (the first eviction only; not
        /// on tmpfs).
        dir: PathBuf,
    },
}

impl Request {
    /// The request's `op`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Snapshot { .. } => "snapshot",
            Self::Restore { .. } => "restore",
            Self::Shutdown => "shutdown",
            Self::Stats => "stats",
            Self::Sample => "sample",
            Self::Balloon { .. } => "balloon",
            Self::Evict { .. } => "evict",
        }
    }

    /// Decodes the success fields of this request's reply.
    pub(crate) fn decode_reply(&self, fields: Map<String, Value>) -> serde_json::Result<Reply> {
        Ok(match self {
            Self::Pause | Self::Resume | Self::Shutdown => {
                <()>::from_fields(fields)?;
                Reply::Done
            }
            Self::Stats => Reply::Stats(Stats::from_fields(fields)?),
            Self::Sample => Reply::Sample(Sample::from_fields(fields)?),
            Self::Snapshot { .. } => Reply::Snapshot(SnapshotInfo::from_fields(fields)?),
            Self::Restore { .. } => Reply::Restore(RestoreInfo::from_fields(fields)?),
            Self::Balloon { .. } => Reply::Balloon(BalloonInfo::from_fields(fields)?),
            Self::Evict { .. } => Reply::Evict(EvictInfo::from_fields(fields)?),
        })
    }
}

/// What the VM is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// The vCPUs run.
    Running,
    /// The vCPUs are paused (after `pause` or `snapshot`).
    Paused,
    /// No guest is loaded (a pre-warmed VM, or one whose guest stopped,
    /// waiting for a `restore`).
    Empty,
}

impl VmState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Empty => "empty",
        }
    }
}

impl fmt::Display for VmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Reply to `stats`: VM counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Running, paused or empty.
    pub state: VmState,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Milliseconds since the VM started (or was restored).
    pub uptime_ms: u64,
    /// Console bytes the guest wrote.
    pub serial_bytes: u64,
    /// Console bytes dropped by the output limit.
    pub serial_dropped: u64,
    /// VMM process id.
    pub pid: u32,
    /// Guest writes to read-only pmem devices, dropped.
    #[serde(default)]
    pub pmem_guest_writes: u64,
    /// The net device's counters (absent: no net device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetStats>,
}

/// A net device's counters since the VM started (or was restored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetStats {
    /// Frames delivered to the guest.
    pub rx_packets: u64,
    /// Bytes delivered to the guest.
    pub rx_bytes: u64,
    /// Host frames dropped (guest buffer too small or malformed, TAP errors).
    pub rx_dropped: u64,
    /// Guest frames written to the TAP.
    pub tx_packets: u64,
    /// Bytes written to the TAP.
    pub tx_bytes: u64,
    /// Guest frames dropped (spoofed source MAC, malformed, oversize, TAP
    /// errors).
    pub tx_dropped: u64,
}

/// Reply to `snapshot`: what it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// Directory.
    pub dir: PathBuf,
    /// Bytes of `state`.
    pub state_bytes: u64,
    /// Bytes of guest memory written (`memory`, or the pages in `memory.diff`).
    pub memory_bytes: u64,
    /// Time to pause the vCPUs (ms).
    pub pause_ms: f64,
    /// Time to write everything (ms).
    pub save_ms: f64,
}

/// Reply to `restore`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreInfo {
    /// From the request to the vCPUs started (ms).
    pub restore_ms: f64,
}

/// Reply to `sample`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Each vCPU's instruction pointer, in vCPU order.
    pub rips: Vec<u64>,
}

/// The success reply of one kind of request, and how it travels: as the
/// fields beside `"ok":true` in the reply object.
pub trait ReplyBody: Sized {
    /// Writes the body's fields into the reply object.
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error>;
    /// Reads the body from the reply object's fields (`ok` included).
    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self>;
}

/// Pause, resume and shutdown: nothing beside `"ok":true`.
impl ReplyBody for () {
    fn serialize_fields<M: SerializeMap>(&self, _: &mut M) -> Result<(), M::Error> {
        Ok(())
    }

    fn from_fields(_: Map<String, Value>) -> serde_json::Result<Self> {
        Ok(())
    }
}

/// `{"ok":true,"stats":{..}}`.
impl ReplyBody for Stats {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("stats", self)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct W {
            stats: Stats,
        }
        serde_json::from_value::<W>(Value::Object(fields)).map(|w| w.stats)
    }
}

/// `{"ok":true,"balloon":{..}}`.
impl ReplyBody for BalloonInfo {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("balloon", self)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct W {
            balloon: BalloonInfo,
        }
        serde_json::from_value::<W>(Value::Object(fields)).map(|w| w.balloon)
    }
}

/// `{"ok":true,"evict":{..}}`.
impl ReplyBody for EvictInfo {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("evict", self)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct W {
            evict: EvictInfo,
        }
        serde_json::from_value::<W>(Value::Object(fields)).map(|w| w.evict)
    }
}

/// `{"ok":true,"snapshot":{..}}`.
impl ReplyBody for SnapshotInfo {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("snapshot", self)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        #[derive(Deserialize)]
        struct W {
            snapshot: SnapshotInfo,
        }
        serde_json::from_value::<W>(Value::Object(fields)).map(|w| w.snapshot)
    }
}

/// `{"ok":true,"restore_ms":1.5}`.
impl ReplyBody for RestoreInfo {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("restore_ms", &self.restore_ms)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        serde_json::from_value(Value::Object(fields))
    }
}

/// `{"ok":true,"rips":[..]}`.
impl ReplyBody for Sample {
    fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("rips", &self.rips)
    }

    fn from_fields(fields: Map<String, Value>) -> serde_json::Result<Self> {
        serde_json::from_value(Value::Object(fields))
    }
}

/// Any request's success reply (what [`crate::Client::call`] returns);
/// serializes as the reply object, `"ok":true` included.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// To `pause`, `resume` and `shutdown`.
    Done,
    /// To `stats`.
    Stats(Stats),
    /// To `snapshot`.
    Snapshot(SnapshotInfo),
    /// To `restore`.
    Restore(RestoreInfo),
    /// To `sample`.
    Sample(Sample),
    /// To `balloon`.
    Balloon(BalloonInfo),
    /// To `evict`.
    Evict(EvictInfo),
}

impl Serialize for Reply {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Done => Success(&()).serialize(s),
            Self::Stats(b) => Success(b).serialize(s),
            Self::Snapshot(b) => Success(b).serialize(s),
            Self::Restore(b) => Success(b).serialize(s),
            Self::Sample(b) => Success(b).serialize(s),
            Self::Balloon(b) => Success(b).serialize(s),
            Self::Evict(b) => Success(b).serialize(s),
        }
    }
}

/// A success reply object: `"ok":true` and the body's fields.
struct Success<'a, T>(&'a T);

impl<T: ReplyBody> Serialize for Success<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("ok", &true)?;
        self.0.serialize_fields(&mut map)?;
        map.end()
    }
}

/// A refusal: `{"ok":false,"error":"..."}`, with `"busy":true` when the
/// request was never read (every control connection was in use), so the
/// caller may send it again.
#[derive(Serialize)]
struct Refusal<'a> {
    ok: bool,
    error: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    busy: bool,
}

/// One reply line (newline included) for a success.
pub(crate) fn success_line<T: ReplyBody>(body: &T) -> Vec<u8> {
    line(&Success(body))
}

/// One reply line for a refusal.
pub(crate) fn refusal_line(error: &str) -> Vec<u8> {
    line(&Refusal {
        ok: false,
        error,
        busy: false,
    })
}

/// The refusal sent before reading a request, when every connection is in
/// use: nothing was done, and the caller may retry.
pub(crate) fn busy_line(error: &str) -> Vec<u8> {
    line(&Refusal {
        ok: false,
        error,
        busy: true,
    })
}

fn line(v: &impl Serialize) -> Vec<u8> {
    // Our reply types always encode (string keys, no non-UTF-8 paths from
    // the VMM's own strings); if one did not, the client still gets a line
    // it can read.
    let mut b = serde_json::to_vec(v)
        .unwrap_or_else(|_| br#"{"ok":false,"error":"reply could not be encoded"}"#.to_vec());
    if b.len() >= MAX_LINE {
        b = serde_json::to_vec(&Refusal {
            busy: false,
            ok: false,
            error: "reply too long for the control socket",
        })
        .unwrap_or_default();
    }
    b.push(b'\n');
    b
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn every_request() -> Vec<Request> {
        vec![
            Request::Pause,
            Request::Resume,
            Request::Shutdown,
            Request::Stats,
            Request::Sample,
            Request::Balloon {
                target_mib: Some(1),
            },
            Request::Balloon { target_mib: None },
            Request::Snapshot {
                dir: "/s".into(),
                diff: true,
            },
            Request::Restore {
                dir: "/s".into(),
                disks: vec!["/a".into(), "/b".into()],
            },
            Request::Restore {
                dir: "/s".into(),
                disks: vec![],
            },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for r in every_request() {
            let s = serde_json::to_string(&r).unwrap();
            assert!(s.contains(&format!(r#""op":"{}""#, r.name())), "{s}");
            assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r, "{s}");
        }
    }

    #[test]
    fn request_wire_format() {
        let j = |r: &Request| serde_json::to_string(r).unwrap();
        assert_eq!(j(&Request::Pause), r#"{"op":"pause"}"#);
        assert_eq!(
            j(&Request::Snapshot {
                dir: "/x".into(),
                diff: false
            }),
            r#"{"op":"snapshot","dir":"/x","diff":false}"#
        );
        assert_eq!(
            j(&Request::Restore {
                dir: "/x".into(),
                disks: vec![]
            }),
            r#"{"op":"restore","dir":"/x"}"#
        );
        let p = |s: &str| serde_json::from_str::<Request>(s);
        assert_eq!(
            p(r#"{"op":"snapshot","dir":"/x"}"#).unwrap(),
            Request::Snapshot {
                dir: "/x".into(),
                diff: false
            }
        );
        assert!(p(r#"{"op":"explode"}"#).is_err());
        assert!(p(r#"{"op":"snapshot","dir":"/x","y":1}"#).is_err());
        assert!(p(r#"{"op":"snapshot"}"#).is_err());
        assert!(p(r#"{"op":"restore","dir":5}"#).is_err());
        assert!(p(r#""pause""#).is_err());
    }

    pub(crate) fn stats() -> Stats {
        Stats {
            state: VmState::Paused,
            vcpus: 2,
            memory_mib: 256,
            uptime_ms: 1234,
            serial_bytes: 10,
            serial_dropped: 1,
            pid: 42,
            pmem_guest_writes: 3,
            net: Some(NetStats {
                rx_packets: 1,
                rx_bytes: 60,
                rx_dropped: 0,
                tx_packets: 2,
                tx_bytes: 120,
                tx_dropped: 1,
            }),
        }
    }

    #[test]
    fn reply_wire_format() {
        let s = |l: Vec<u8>| String::from_utf8(l).unwrap();
        assert_eq!(s(success_line(&())), "{\"ok\":true}\n");
        assert_eq!(
            s(success_line(&RestoreInfo { restore_ms: 1.5 })),
            "{\"ok\":true,\"restore_ms\":1.5}\n"
        );
        assert_eq!(
            s(success_line(&Sample { rips: vec![1, 2] })),
            "{\"ok\":true,\"rips\":[1,2]}\n"
        );
        assert_eq!(
            s(success_line(&stats())),
            "{\"ok\":true,\"stats\":{\"state\":\"paused\",\"vcpus\":2,\"memory_mib\":256,\
             \"uptime_ms\":1234,\"serial_bytes\":10,\"serial_dropped\":1,\"pid\":42,\
             \"pmem_guest_writes\":3,\"net\":{\"rx_packets\":1,\"rx_bytes\":60,\"rx_dropped\":0,\
             \"tx_packets\":2,\"tx_bytes\":120,\"tx_dropped\":1}}}\n"
        );
        assert_eq!(
            s(refusal_line("no \"guest\"")),
            "{\"ok\":false,\"error\":\"no \\\"guest\\\"\"}\n"
        );
        // The generic reply serializes as the same object.
        let r = Reply::Stats(stats());
        assert_eq!(
            format!("{}\n", serde_json::to_string(&r).unwrap()),
            s(success_line(&stats()))
        );
    }

    #[test]
    fn every_reply_decodes_as_what_its_request_gets() {
        let snap = SnapshotInfo {
            dir: "/s".into(),
            state_bytes: 1,
            memory_bytes: 2,
            pause_ms: 0.5,
            save_ms: 3.25,
        };
        let cases = [
            (Request::Pause, Reply::Done),
            (Request::Stats, Reply::Stats(stats())),
            (Request::Sample, Reply::Sample(Sample { rips: vec![7] })),
            (
                Request::Snapshot {
                    dir: "/s".into(),
                    diff: false,
                },
                Reply::Snapshot(snap),
            ),
            (
                Request::Restore {
                    dir: "/s".into(),
                    disks: vec![],
                },
                Reply::Restore(RestoreInfo { restore_ms: 9.0 }),
            ),
        ];
        for (req, reply) in cases {
            let Value::Object(m) = serde_json::to_value(&reply).unwrap() else {
                panic!("not an object")
            };
            assert_eq!(req.decode_reply(m).unwrap(), reply);
        }
    }

    #[test]
    fn state_names() {
        for (s, n) in [
            (VmState::Running, "running"),
            (VmState::Paused, "paused"),
            (VmState::Empty, "empty"),
        ] {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{n}\""));
            assert_eq!(s.to_string(), n);
        }
        assert_eq!(format!("{:<8}|", VmState::Paused), "paused  |");
    }

    #[test]
    fn evict_request_and_reply_wire_format() {
        let r = Request::Evict {
            dir: "/sb/1".into(),
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"evict","dir":"/sb/1"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"evict"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"evict","dir":"/a","x":1}"#).is_err());
        let info = EvictInfo {
            mode: "file".into(),
            pages: 3,
            ..Default::default()
        };
        let Value::Object(m) = serde_json::to_value(Reply::Evict(info.clone())).unwrap() else {
            panic!("not an object");
        };
        assert_eq!(m["ok"], Value::Bool(true));
        assert_eq!(m["evict"]["mode"], "file");
        assert_eq!(r.decode_reply(m).unwrap(), Reply::Evict(info));
    }

    #[test]
    fn balloon_request_and_reply_wire_format() {
        use crate::balloon::GuestMemoryStats;
        let r = Request::Balloon {
            target_mib: Some(64),
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"balloon","target_mib":64}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        let read = serde_json::from_str::<Request>(r#"{"op":"balloon"}"#).unwrap();
        assert_eq!(read, Request::Balloon { target_mib: None });
        assert_eq!(serde_json::to_string(&read).unwrap(), r#"{"op":"balloon"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"balloon","target_mib":-1}"#).is_err());

        let info = BalloonInfo {
            target_mib: 64,
            actual_mib: 32,
            stats: GuestMemoryStats {
                free_memory: Some(1 << 20),
                ..Default::default()
            },
            inflated_pages: 8192,
            ..Default::default()
        };
        let line = String::from_utf8(success_line(&info)).unwrap();
        assert!(
            line.starts_with(
                r#"{"ok":true,"balloon":{"target_mib":64,"actual_mib":32,"stats":{"free_memory":1048576},"#
            ),
            "{line}"
        );
        let Value::Object(m) = serde_json::to_value(Reply::Balloon(info)).unwrap() else {
            panic!("not an object")
        };
        assert_eq!(read.decode_reply(m).unwrap(), Reply::Balloon(info));
    }
}
