//! The agent protocol's message decoding, both sides: every control
//! message the host decodes from the agent (replies) and every request the
//! agent decodes from the host (`shoal-agent` decodes them with exactly
//! these `agent_proto::decode` calls, after the same Hello head check).
//! Checks: a payload decodes or is an error (no panic); what decodes
//! re-encodes to the same bytes (the codec is canonical: one encoding per
//! value, no trailing bytes, bools 0 or 1); decoding allocates at most a
//! small multiple of the payload (lengths are checked against the bytes
//! present before anything is allocated).

use agent_proto::*;
use bolero::check;

#[test]
fn agent_messages() {
    check!()
        .with_test_time(shoal_fuzz::budget())
        .for_each(|input: &[u8]| {
            let Some((&which, payload)) = input.split_first() else {
                return;
            };
            match which % 24 {
                // Host side: what the agent sends.
                0 => roundtrip::<HelloOk>(payload),
                1 => roundtrip::<ErrorReply>(payload),
                2 => roundtrip::<HealthReply>(payload),
                3 => roundtrip::<VersionReply>(payload),
                4 => roundtrip::<PostRestoreReply>(payload),
                5 => roundtrip::<ExecStarted>(payload),
                6 => roundtrip::<ExecResult>(payload),
                7 => roundtrip::<FileDone>(payload),
                8 => roundtrip::<FileStat>(payload),
                9 => roundtrip::<DirEntries>(payload),
                // Guest side: what the host sends the agent.
                10 => roundtrip::<Hello>(payload),
                11 => roundtrip::<PostRestore>(payload),
                12 => roundtrip::<PowerRequest>(payload),
                13 => roundtrip::<ExecRequest>(payload),
                14 => roundtrip::<SignalRequest>(payload),
                15 => roundtrip::<AttachRequest>(payload),
                16 => roundtrip::<FileWrite>(payload),
                17 => roundtrip::<FileRead>(payload),
                18 => roundtrip::<PathRequest>(payload),
                19 => roundtrip::<MkdirRequest>(payload),
                20 => roundtrip::<RemoveRequest>(payload),
                21 => roundtrip::<RenameRequest>(payload),
                22 => roundtrip::<ChmodRequest>(payload),
                _ => hello_head(payload),
            }
        });
}

fn roundtrip<M: Wire>(payload: &[u8]) {
    let (r, peak) = shoal_fuzz::peak_alloc(|| decode::<M>(payload));
    let limit = 8 * payload.len() + 4096;
    assert!(
        peak <= limit,
        "decoding {} bytes as {} allocated {peak} bytes",
        payload.len(),
        std::any::type_name::<M>()
    );
    if let Ok(m) = r {
        let mut out = Vec::new();
        m.put(&mut out);
        assert_eq!(
            out,
            payload,
            "{} does not re-encode to its bytes",
            std::any::type_name::<M>()
        );
    }
}

/// The agent's first look at a Hello: magic and version alone, then the
/// whole message.
fn hello_head(payload: &[u8]) {
    let mut r = Reader::new(payload);
    let head = r
        .array::<4>()
        .and_then(|m| Ok((m, <u16 as Wire>::get(&mut r)?)));
    if let Ok((magic, version)) = head {
        if magic == HELLO_MAGIC && version == PROTOCOL_VERSION {
            roundtrip::<Hello>(payload);
        }
    }
}
