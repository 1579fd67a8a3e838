//! The `balloon` request's reply: the balloon device's target, the guest's
//! balloon size, its latest memory statistics and what it gave back.

use crate::wire::ReplyBody;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Reply to `balloon`: `{"ok":true,"balloon":{..}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BalloonInfo {
    /// The host's target: guest memory the balloon should hold, in MiB
    /// (4 KiB pages rounded down).
    pub target_mib: u64,
    /// What the guest says its balloon holds, in MiB.
    pub actual_mib: u64,
    /// The guest's latest memory statistics (from before this request: it
    /// also asks the guest for new ones).
    pub stats: GuestMemoryStats,
    /// Pages the guest inflated (given back to the host) since the VMM
    /// started, 4 KiB each.
    pub inflated_pages: u64,
    /// Pages the guest deflated since the VMM started.
    pub deflated_pages: u64,
    /// Bytes the guest reported free (given back) since the VMM started.
    pub reported_bytes: u64,
    /// Guest input refused (PFNs, ranges, chains, `actual` values).
    pub refused: u64,
    /// Ranges the host failed to give back.
    pub give_back_errors: u64,
}

/// A guest's memory statistics (virtio-balloon stats tags); absent: the
/// guest has not sent that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GuestMemoryStats {
    /// Bytes swapped in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Bytes swapped out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Free memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Total memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Available memory (estimate), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Disk caches, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// OOM kills.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Reply, Request};

    #[test]
    fn request_and_reply_wire_format() {
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
        let line = String::from_utf8(crate::wire::success_line(&info)).unwrap();
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
