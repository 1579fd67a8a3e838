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

fn net_request() -> NetConfigure {
    NetConfigure {
        mac: [0x02, 0x5a, 0x0a, 0xd5, 0x00, 0x02],
        addr: std::net::Ipv4Addr::new(10, 213, 0, 2),
        prefix_len: 30,
        gateway: std::net::Ipv4Addr::new(10, 213, 0, 1),
        mtu: 1500,
        nameservers: vec![std::net::Ipv4Addr::new(10, 213, 0, 1)],
    }
}

fn encoded<M: Wire>(m: &M) -> Vec<u8> {
    let mut p = Vec::new();
    m.put(&mut p);
    p
}

#[test]
fn net_messages_roundtrip() {
    roundtrip(net_request());
    roundtrip(NetConfigure {
        prefix_len: 0,
        mtu: 65535,
        nameservers: vec![std::net::Ipv4Addr::LOCALHOST; NET_MAX_NAMESERVERS],
        ..net_request()
    });
    roundtrip(NetConfigure {
        prefix_len: 32,
        mtu: NET_MIN_MTU,
        nameservers: vec![],
        ..net_request()
    });
    roundtrip(NetConfigured {
        ifname: "eth0".into(),
    });
    roundtrip(NetConfigured {
        ifname: "a".repeat(NET_MAX_IFNAME),
    });
    let mut frame = Vec::new();
    put_message(&mut frame, 1, &net_request());
    assert_eq!(frame[4], 0x06, "NetConfigure is kind 0x06");
    frame.clear();
    put_message(&mut frame, 1, &NetConfigured { ifname: "x".into() });
    assert_eq!(frame[4], 0x87, "NetConfigured is kind 0x87");
}

#[test]
fn net_configure_layout_is_as_documented() {
    // PROTOCOL.md: mac, addr, prefix_len, gateway, mtu, list of addresses.
    let p = encoded(&net_request());
    assert_eq!(
        p,
        [
            0x02, 0x5a, 0x0a, 0xd5, 0x00, 0x02, 10, 213, 0, 2, 30, 10, 213, 0, 1, 0xdc, 0x05, 1, 0,
            0, 0, 10, 213, 0, 1
        ]
    );
}

#[test]
fn net_configure_refuses_values_out_of_bounds() {
    let bad = |m: NetConfigure, why: &str| {
        let p = encoded(&m);
        assert!(
            matches!(decode::<NetConfigure>(&p), Err(DecodeError::Invalid(_))),
            "{why} must be refused"
        );
        assert!(m.validate().is_err(), "{why}: validate agrees");
    };
    let ok = net_request();
    bad(
        NetConfigure {
            mac: [0; 6],
            ..ok.clone()
        },
        "an all-zero MAC",
    );
    bad(
        NetConfigure {
            mac: [0x03, 0, 0, 0, 0, 1],
            ..ok.clone()
        },
        "a multicast MAC",
    );
    bad(
        NetConfigure {
            mac: [0xff; 6],
            ..ok.clone()
        },
        "the broadcast MAC",
    );
    bad(
        NetConfigure {
            prefix_len: 33,
            ..ok.clone()
        },
        "prefix 33",
    );
    bad(
        NetConfigure {
            mtu: NET_MIN_MTU - 1,
            ..ok.clone()
        },
        "MTU 67",
    );
    bad(
        NetConfigure {
            mtu: 0,
            ..ok.clone()
        },
        "MTU 0",
    );
    bad(
        NetConfigure {
            nameservers: vec![std::net::Ipv4Addr::LOCALHOST; 4],
            ..ok.clone()
        },
        "four name servers",
    );
    // A huge name-server count is refused before its items are read.
    let mut p = encoded(&ok);
    let at = p.len() - 8;
    p.truncate(at);
    u32::MAX.put(&mut p);
    assert_eq!(
        decode::<NetConfigure>(&p),
        Err(DecodeError::Invalid("more than 3 name servers"))
    );
    assert_eq!(ok.netmask(), std::net::Ipv4Addr::new(255, 255, 255, 252));
    let any = NetConfigure {
        prefix_len: 0,
        ..ok.clone()
    };
    assert_eq!(any.netmask(), std::net::Ipv4Addr::UNSPECIFIED);
    let host = NetConfigure {
        prefix_len: 32,
        ..ok
    };
    assert_eq!(host.netmask(), std::net::Ipv4Addr::BROADCAST);
}

#[test]
fn net_configured_refuses_bad_interface_names() {
    for name in [
        "",
        ".",
        "..",
        "a/b",
        "a b",
        "eth0:1",
        "a\0",
        "sixteen-bytes-xx",
    ] {
        let p = encoded(&NetConfigured {
            ifname: name.into(),
        });
        assert!(
            decode::<NetConfigured>(&p).is_err(),
            "{name:?} must be refused"
        );
    }
    // A long name's length is refused before its bytes are looked at.
    let mut p = Vec::new();
    u32::MAX.put(&mut p);
    assert_eq!(
        decode::<NetConfigured>(&p),
        Err(DecodeError::Invalid("interface name length"))
    );
    assert_eq!(
        decode::<NetConfigured>(&[2, 0, 0, 0, 0xff, 0xfe]),
        Err(DecodeError::InvalidUtf8)
    );
    assert!(valid_ifname("eth0") && valid_ifname("veth-a.1"));
}
