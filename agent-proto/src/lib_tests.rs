use super::*;

fn roundtrip<M: Message + PartialEq + std::fmt::Debug>(m: M) {
    let mut out = Vec::new();
    put_message(&mut out, 7, &m);
    let h = Header::parse_prefix(&out).unwrap();
    assert_eq!(h.kind, M::KIND as u8);
    assert_eq!(h.id, 7);
    assert_eq!(h.len as usize, out.len() - HEADER_LEN);
    let back: M = decode(&out[HEADER_LEN..]).unwrap();
    assert_eq!(back, m);
    // Every strict prefix fails to decode, and never panics.
    for cut in 0..out.len() - HEADER_LEN {
        assert!(decode::<M>(&out[HEADER_LEN..HEADER_LEN + cut]).is_err());
    }
    // Trailing bytes are refused.
    let mut long = out[HEADER_LEN..].to_vec();
    long.push(0);
    assert_eq!(decode::<M>(&long), Err(DecodeError::TrailingBytes(1)));
}

#[test]
fn messages_roundtrip() {
    roundtrip(PtyExec {
        exec: ExecRequest::shell("bash -i"),
        cols: 80,
        rows: 24,
    });
    roundtrip(PtyResize {
        exec_id: 9,
        cols: 100,
        rows: 30,
    });
    roundtrip(Hello {
        magic: HELLO_MAGIC,
        version: PROTOCOL_VERSION,
        client: "test".into(),
    });
    roundtrip(TcpConnect {
        port: 49999,
        timeout_ms: 1000,
    });
    roundtrip(ExecRequest {
        command: Command::Argv(vec![b"echo".to_vec(), b"hi".to_vec()]),
        env: vec![(b"A".to_vec(), b"1".to_vec())],
        clear_env: false,
        cwd: Some(b"/tmp".to_vec()),
        user: Some(User { uid: 1, gid: 2 }),
        stdin: true,
        timeout_ms: 5,
    });
    roundtrip(ExecRequest {
        command: Command::Shell(b"exit 3".to_vec()),
        env: vec![],
        clear_env: true,
        cwd: None,
        user: None,
        stdin: false,
        timeout_ms: 0,
    });
    roundtrip(ExecResult {
        status: ExitStatus::Signaled(9),
        timed_out: true,
        dropped_bytes: 12,
    });
    roundtrip(ErrorReply {
        code: ErrorCode::Other(999),
        errno: 2,
        message: "x".into(),
    });
    roundtrip(DirEntries {
        entries: vec![DirEntry {
            name: b"a\xff".to_vec(),
            file_type: FileType::Symlink,
            ino: 3,
        }],
        last: true,
    });
    roundtrip(PostRestore {
        entropy: [7; 64],
        unix_time_ns: 1,
    });
}

#[test]
fn huge_counts_do_not_allocate() {
    // A list claiming 2^32-1 entries with 4 bytes present.
    let mut p = Vec::new();
    0u8.put(&mut p);
    u32::MAX.put(&mut p);
    p.extend_from_slice(&[0; 4]);
    assert!(matches!(
        decode::<ExecRequest>(&p),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn header_limits() {
    let h = Header {
        len: u32::try_from(MAX_PAYLOAD).unwrap() + 1,
        kind: 1,
        id: 0,
    };
    assert_eq!(Header::parse(&h.encode()), h);
    assert!(h.checked_len().is_err());
    assert_eq!(Kind::from_u8(0x10), Some(Kind::Exec));
    assert_eq!(Kind::from_u8(0x7f), None);
    for k in Kind::ALL {
        assert_eq!(Kind::from_u8(k as u8), Some(k));
    }
}

#[test]
fn bad_bools_and_tags() {
    assert_eq!(decode::<bool>(&[2]), Err(DecodeError::InvalidBool(2)));
    assert!(decode::<Option<u8>>(&[5]).is_err());
    assert_eq!(
        decode::<String>(&[1, 0, 0, 0, 0xff]),
        Err(DecodeError::InvalidUtf8)
    );
}

fn frames_of(d: &mut FrameDecoder) -> Vec<RawFrame> {
    let mut v = Vec::new();
    while let Some(f) = d.next_frame().unwrap() {
        v.push(f);
    }
    v
}

#[test]
fn decoder_cuts_a_stream_fed_byte_by_byte_and_in_bulk() {
    let mut stream = Vec::new();
    put_message(&mut stream, 3, &FileDone { bytes: 9 });
    put_data(&mut stream, Kind::Stdout, 4, &[1, 2, 3]);
    put_empty(&mut stream, Kind::Ok, 5);
    let big = vec![7u8; MAX_PAYLOAD];
    put_data(&mut stream, Kind::FileChunk, 6, &big);

    let mut one = FrameDecoder::new();
    let mut got = Vec::new();
    for b in &stream {
        one.push(std::slice::from_ref(b));
        got.extend(frames_of(&mut one));
    }
    assert!(one.at_boundary());
    let mut bulk = FrameDecoder::new();
    let dst = bulk.spare(stream.len());
    dst[..stream.len()].copy_from_slice(&stream);
    bulk.commit(stream.len());
    assert_eq!(frames_of(&mut bulk), got);
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].header.id, 3);
    assert_eq!(decode::<FileDone>(&got[0].payload).unwrap().bytes, 9);
    assert_eq!(got[1].payload, [1, 2, 3]);
    assert_eq!(got[2].header.kind, Kind::Ok as u8);
    assert!(got[2].payload.is_empty());
    assert_eq!(got[3].payload.len(), MAX_PAYLOAD);
}

#[test]
fn decoder_refuses_an_oversized_header_before_its_payload() {
    let mut d = FrameDecoder::new();
    let h = Header {
        len: u32::try_from(MAX_PAYLOAD).unwrap() + 1,
        kind: Kind::Stdout as u8,
        id: 1,
    };
    d.push(&h.encode());
    assert_eq!(
        d.next_frame(),
        Err(FrameError::TooLarge(h.len)),
        "the header alone must be refused"
    );
    assert!(d.buffered() <= HEADER_LEN);
}

#[test]
fn decoder_reports_a_partial_frame() {
    let mut stream = Vec::new();
    put_data(&mut stream, Kind::Stdout, 1, b"abcdef");
    let mut d = FrameDecoder::new();
    d.push(&stream[..stream.len() - 1]);
    assert_eq!(d.next_frame(), Ok(None));
    assert!(!d.at_boundary(), "a cut frame is not a clean end");
    d.push(&stream[stream.len() - 1..]);
    assert_eq!(d.next_frame().unwrap().unwrap().payload, b"abcdef");
    assert!(d.at_boundary());
}

#[test]
fn exec_request_builder() {
    let r = ExecRequest::argv(["a", "b"])
        .with_stdin()
        .with_timeout(std::time::Duration::from_micros(10))
        .with_env("K", "V")
        .with_cwd("/w")
        .with_user(1, 2);
    assert_eq!(r.command, Command::Argv(vec![b"a".to_vec(), b"b".to_vec()]));
    assert!(r.stdin);
    assert_eq!(
        r.timeout_ms, 1,
        "a sub-millisecond timeout rounds up to 1 ms"
    );
    assert_eq!(r.timeout(), Some(std::time::Duration::from_millis(1)));
    assert_eq!(r.env, vec![(b"K".to_vec(), b"V".to_vec())]);
    assert_eq!(r.cwd.as_deref(), Some(&b"/w"[..]));
    assert_eq!(r.user, Some(User { uid: 1, gid: 2 }));
    assert_eq!(ExecRequest::shell("x").timeout(), None);
    assert_eq!(Hello::new("c").magic, HELLO_MAGIC);
}
