//! Malformed input against `shoal-agent --listen unix:...` running as a
//! host process: raw frames written by hand, garbage, a wrong version. The
//! agent never panics, answers what it can and closes what it cannot
//! resynchronise.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use agent_client::{AgentMode, ClientError, ExecRequest};
use agent_proto::{
    self as proto, put_data, ErrorCode, ErrorReply, Header, Hello, Kind, HELLO_MAGIC, MAX_PAYLOAD,
    PROTOCOL_VERSION,
};
use common::{expect_closed, expect_error, expect_usable, raw_connect, read, Agent, PseudoRandom};

#[test]
fn malformed_frames() {
    let agent = Agent::start();
    let good = agent.client();

    // Garbage instead of a Hello: refused, closed.
    let mut s = UnixStream::connect(&agent.sock).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    expect_error(&mut s, ErrorCode::TooLarge);
    expect_closed(&mut s);
    // A small garbage frame instead of a Hello.
    let mut s = UnixStream::connect(&agent.sock).unwrap();
    s.write_all(&[3, 0, 0, 0, 0x10, 0, 0, 0, 0, 1, 2, 3])
        .unwrap();
    expect_error(&mut s, ErrorCode::HandshakeRequired);
    expect_closed(&mut s);
    // Hello with a bad magic.
    let mut s = UnixStream::connect(&agent.sock).unwrap();
    let mut b = Vec::new();
    put_data(&mut b, Kind::Hello, 0, b"XXXX\x01\x00");
    s.write_all(&b).unwrap();
    expect_error(&mut s, ErrorCode::HandshakeRequired);
    expect_closed(&mut s);

    let mut s = raw_connect(&agent);
    // Unknown kind: error, connection stays usable.
    let mut b = Vec::new();
    put_data(&mut b, Kind::Hello, 5, b"");
    b[4] = 0x7e;
    s.write_all(&b).unwrap();
    let e = expect_error(&mut s, ErrorCode::UnknownKind);
    assert!(e.message.contains("0x7e"));
    expect_usable(&mut s);
    // A kind only the agent sends.
    let mut b = Vec::new();
    put_data(&mut b, Kind::HelloOk, 6, b"");
    s.write_all(&b).unwrap();
    expect_error(&mut s, ErrorCode::UnknownKind);
    // Truncated payload: a path claiming 5 bytes with 1 present.
    let mut b = Vec::new();
    put_data(&mut b, Kind::Stat, 7, &[5, 0, 0, 0, b'a']);
    s.write_all(&b).unwrap();
    let (h, p) = read(&mut s).unwrap();
    assert_eq!((h.kind, h.id), (Kind::Error as u8, 7));
    let e: ErrorReply = proto::decode(&p).unwrap();
    assert_eq!(e.code, ErrorCode::BadPayload);
    expect_usable(&mut s);
    // Invalid bool and trailing bytes.
    let mut b = Vec::new();
    put_data(
        &mut b,
        Kind::Mkdir,
        8,
        &[1, 0, 0, 0, b'/', 0xed, 1, 0, 0, 7],
    );
    put_data(&mut b, Kind::Health, 9, b"x");
    put_data(&mut b, Kind::Exec, 10, &[0xff; 40]);
    s.write_all(&b).unwrap();
    expect_error(&mut s, ErrorCode::BadPayload);
    expect_error(&mut s, ErrorCode::BadPayload);
    expect_error(&mut s, ErrorCode::BadPayload);
    expect_usable(&mut s);
    // A huge list count does not make the agent allocate or die.
    let mut b = Vec::new();
    put_data(
        &mut b,
        Kind::Exec,
        11,
        &[0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
    );
    s.write_all(&b).unwrap();
    expect_error(&mut s, ErrorCode::BadPayload);
    expect_usable(&mut s);
    // Oversized length: error, then closed (cannot resynchronise).
    let mut b = Header {
        len: u32::try_from(MAX_PAYLOAD + 1).unwrap(),
        kind: Kind::FileData as u8,
        id: 12,
    }
    .encode()
    .to_vec();
    b.extend_from_slice(&[0; 100]);
    s.write_all(&b).unwrap();
    let e = expect_error(&mut s, ErrorCode::TooLarge);
    assert!(e.message.contains("exceeds"));
    expect_closed(&mut s);

    // Truncated frame then hang-up: the agent just drops the connection.
    let mut s = raw_connect(&agent);
    let h = Header {
        len: 100,
        kind: Kind::Stat as u8,
        id: 13,
    };
    s.write_all(&h.encode()).unwrap();
    s.write_all(&[0; 10]).unwrap();
    drop(s);

    // Other connections never noticed.
    assert_eq!(
        good.exec_simple(&ExecRequest::argv(["echo", "ok"]))
            .unwrap()
            .stdout,
        b"ok\n"
    );
    let mut s = raw_connect(&agent);
    expect_usable(&mut s);
    assert_eq!(good.health().unwrap().mode, AgentMode::Host);
}

#[test]
fn version_mismatch_is_refused_clearly() {
    let agent = Agent::start();
    let s = UnixStream::connect(&agent.sock).unwrap();
    let hello = Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION + 998,
        client: "future".into(),
    };
    let err = agent_client::Client::from_stream_with_hello(s, hello).unwrap_err();
    let ClientError::VersionMismatch(msg) = &err else {
        panic!("unexpected {err:?}");
    };
    assert!(
        msg.contains(&format!("client speaks {}", PROTOCOL_VERSION + 998)),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("agent speaks {PROTOCOL_VERSION}")),
        "{msg}"
    );
    // The agent is fine.
    let v = agent.client().version().unwrap();
    assert_eq!(v.protocol, PROTOCOL_VERSION);
    assert_eq!(v.agent, env!("CARGO_PKG_VERSION"));
}

#[test]
fn random_frames_never_kill_the_agent() {
    // Thousands of frames with random kinds and payloads (kinds that would
    // run commands or change files are left out: random bytes can decode
    // into a valid request). The agent answers or ignores each, and keeps
    // serving.
    let agent = Agent::start();
    let good = agent.client();
    let harmless = [
        Kind::Health as u8,
        Kind::Version as u8,
        Kind::Stdin as u8,
        Kind::StdinClose as u8,
        Kind::Signal as u8,
        Kind::Attach as u8,
        Kind::FileData as u8,
        Kind::FileEnd as u8,
        Kind::FileRead as u8,
        Kind::Stat as u8,
        Kind::ListDir as u8,
        0x00,
        0x7f,
        0x81,
        0x93,
        0xff,
    ];
    let mut rng = PseudoRandom::new(0x5eed, u64::MAX);
    let mut byte = move || {
        let mut b = [0u8; 1];
        rng.read_exact(&mut b).unwrap();
        b[0]
    };
    for round in 0..20 {
        let mut s = raw_connect(&agent);
        let mut b = Vec::new();
        for i in 0..200u32 {
            let kind = harmless[usize::from(byte()) % harmless.len()];
            let len = usize::from(byte()) % 64;
            let mut payload: Vec<u8> = (0..len).map(|_| byte()).collect();
            if byte() % 4 == 0 && payload.len() >= 4 {
                // A plausible small length prefix, to get past the first field.
                payload[0] = byte() % 8;
                payload[1..4].fill(0);
            }
            let at = b.len();
            put_data(&mut b, Kind::Health, round * 1000 + i + 1, &payload);
            b[at + 4] = kind;
        }
        s.write_all(&b).unwrap();
        expect_usable_after_noise(&mut s);
    }
    assert!(good.health().is_ok());
    assert_eq!(
        good.exec_simple(&ExecRequest::argv(["echo", "alive"]))
            .unwrap()
            .stdout,
        b"alive\n"
    );
}

/// Sends a Health with id 0xfffffff0 and skips every reply until its answer.
fn expect_usable_after_noise(s: &mut UnixStream) {
    let mut b = Vec::new();
    proto::put_empty(&mut b, Kind::Health, 0xffff_fff0);
    s.write_all(&b).unwrap();
    loop {
        let (h, _) = read(s).expect("connection closed by noise");
        if h.id == 0xffff_fff0 {
            assert_eq!(h.kind, Kind::HealthOk as u8);
            return;
        }
    }
}
