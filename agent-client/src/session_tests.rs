use super::*;
use agent_proto::{put_message, ExitStatus, FileType, Header};

fn frame<M: Message>(m: &M) -> Frame {
    let mut b = Vec::new();
    put_message(&mut b, 1, m);
    Frame {
        kind: M::KIND as u8,
        payload: b[HEADER_LEN..].to_vec(),
    }
}

fn data(kind: Kind, d: &[u8]) -> Frame {
    Frame {
        kind: kind as u8,
        payload: d.to_vec(),
    }
}

#[test]
fn routes_never_hand_out_zero_or_an_id_in_use_and_refuse_after_close() {
    let mut r: Routes<()> = Routes::new(3);
    r.next = u32::MAX;
    let a = r.insert(()).unwrap();
    let b = r.insert(()).unwrap();
    assert_eq!((a, b), (u32::MAX, 1), "0 is skipped on wrap-around");
    r.next = 1;
    let c = r.insert(()).unwrap();
    assert_eq!(c, 2, "1 is in use");
    assert!(matches!(r.insert(()), Err(ClientError::Busy(3))));
    r.remove(c);
    assert_eq!(r.len(), 2);
    r.close();
    assert!(r.is_closed());
    assert_eq!(r.len(), 0);
    assert!(matches!(r.insert(()), Err(ClientError::Disconnected)));
}

#[test]
fn exec_stream_checks_kinds_and_ends_once() {
    let mut s = ExecStream::default();
    assert_eq!(
        s.on_frame(data(Kind::Stdout, b"a")).unwrap(),
        ExecEvent::Stdout(b"a".to_vec())
    );
    let exit = ExecResult {
        status: ExitStatus::Exited(3),
        timed_out: false,
        dropped_bytes: 0,
    };
    assert_eq!(
        s.on_frame(frame(&exit)).unwrap(),
        ExecEvent::Exit(exit.clone())
    );
    assert!(s.finished());
    assert!(matches!(
        s.on_frame(data(Kind::Stdout, b"late")),
        Err(ClientError::Protocol(_))
    ));
    // A kind that no exec receives ends the stream with an error.
    let mut s = ExecStream::default();
    assert!(matches!(
        s.on_frame(data(Kind::FileChunk, b"x")),
        Err(ClientError::Protocol(_))
    ));
    assert!(s.finished());
    // A truncated result is a protocol error, not a panic.
    let mut s = ExecStream::default();
    assert!(matches!(
        s.on_frame(data(Kind::ExecExit, &[0, 1])),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn exec_started_refuses_a_bad_pid() {
    let ok = ExecStarted { exec_id: 1, pid: 5 };
    assert_eq!(exec_started(frame(&ok)).unwrap(), ok);
    let bad = ExecStarted { exec_id: 1, pid: 0 };
    assert!(matches!(
        exec_started(frame(&bad)),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn collector_caps_what_it_holds() {
    let mut c = Collector::new(4);
    assert!(c.push(ExecEvent::Stdout(b"ab".to_vec())).unwrap().is_none());
    assert!(c.push(ExecEvent::Stderr(b"cd".to_vec())).unwrap().is_none());
    assert!(matches!(
        c.push(ExecEvent::Stdout(b"e".to_vec())),
        Err(ClientError::Limit(_))
    ));
    let mut c = Collector::new(4);
    c.push(ExecEvent::Stdout(b"ab".to_vec())).unwrap();
    let exit = ExecResult {
        status: ExitStatus::Signaled(9),
        timed_out: true,
        dropped_bytes: 0,
    };
    let out = c.push(ExecEvent::Exit(exit.clone())).unwrap().unwrap();
    assert_eq!(out.stdout, b"ab");
    assert_eq!(out.result, exit);
}

#[test]
fn download_checks_the_count_the_limit_and_the_cap() {
    let mut d = Download::new(None, None);
    assert!(matches!(
        d.on_frame(data(Kind::FileChunk, b"abc")).unwrap(),
        DownloadStep::Chunk(_)
    ));
    assert!(matches!(
        d.on_frame(frame(&FileDone { bytes: 3 })).unwrap(),
        DownloadStep::Done(3)
    ));
    let mut d = Download::new(None, None);
    d.on_frame(data(Kind::FileChunk, b"abc")).unwrap();
    assert!(matches!(
        d.on_frame(frame(&FileDone { bytes: 4 })),
        Err(ClientError::Protocol(_))
    ));
    let mut d = Download::new(Some(2), None);
    assert!(matches!(
        d.on_frame(data(Kind::FileChunk, b"abc")),
        Err(ClientError::Protocol(_))
    ));
    let mut d = Download::new(None, Some(2));
    assert!(matches!(
        d.on_frame(data(Kind::FileChunk, b"abc")),
        Err(ClientError::Limit(_))
    ));
}

#[test]
fn upload_done_must_match_what_was_sent() {
    assert_eq!(upload_done(frame(&FileDone { bytes: 5 }), 5).unwrap(), 5);
    assert!(matches!(
        upload_done(frame(&FileDone { bytes: 6 }), 5),
        Err(ClientError::Protocol(_))
    ));
}

#[test]
fn listing_accumulates_parts_within_the_cap() {
    let e = |n: &str| DirEntry {
        name: n.as_bytes().to_vec(),
        file_type: FileType::File,
        ino: 1,
    };
    let entries = |n| Limits {
        max_dir_entries: n,
        ..Limits::default()
    };
    let mut l = Listing::new(&entries(3));
    let part = DirEntries {
        entries: vec![e("a"), e("b")],
        last: false,
    };
    assert!(l.on_frame(frame(&part)).unwrap().is_none());
    let last = DirEntries {
        entries: vec![e("c")],
        last: true,
    };
    assert_eq!(l.on_frame(frame(&last)).unwrap().unwrap().len(), 3);
    let mut l = Listing::new(&entries(1));
    assert!(matches!(
        l.on_frame(frame(&part)),
        Err(ClientError::Limit(_))
    ));
}

#[test]
fn listing_parts_that_never_end_are_capped_in_bytes() {
    let limits = Limits {
        max_dir_bytes: 10 * (1000 + DIR_ENTRY_OVERHEAD),
        ..Limits::default()
    };
    let mut l = Listing::new(&limits);
    let part = DirEntries {
        entries: vec![DirEntry {
            name: vec![b'x'; 1000],
            file_type: FileType::File,
            ino: 1,
        }],
        last: false,
    };
    for _ in 0..10 {
        assert!(l.on_frame(frame(&part)).unwrap().is_none());
    }
    match l.on_frame(frame(&part)) {
        Err(ClientError::Limit(m)) => assert!(m.contains("listing"), "{m}"),
        other => panic!("expected a limit error, got {other:?}"),
    }
}

#[test]
fn errors_and_stray_frames() {
    let e = ErrorReply {
        code: ErrorCode::Io,
        errno: 2,
        message: "nope".into(),
    };
    let err = frame(&e).expect_ok().unwrap_err();
    assert_eq!(err.errno(), Some(2));
    assert!(matches!(
        data(Kind::Ok, b"x").expect_ok(),
        Err(ClientError::Protocol(_))
    ));
    assert!(matches!(
        data(Kind::Error, b"\x01").expect_ok(),
        Err(ClientError::Protocol(_))
    ));
    let raw = |id| RawFrame {
        header: Header {
            len: 0,
            kind: Kind::Ok as u8,
            id,
        },
        payload: Vec::new(),
    };
    assert!(matches!(classify(raw(0)), Incoming::Ignore));
    assert!(matches!(classify(raw(7)), Incoming::Route(7, _)));
}

#[test]
fn vsock_reply_line() {
    let mut r = VsockReply::default();
    assert!(b"OK 1073741824".iter().all(|b| r.push(*b).is_none()));
    assert!(r.push(b'\n').unwrap().is_ok());
    let mut r = VsockReply::default();
    assert!(b"NO".iter().all(|b| r.push(*b).is_none()));
    assert!(matches!(
        r.push(b'\n').unwrap(),
        Err(ClientError::VsockHandshake(_))
    ));
    let mut r = VsockReply::default();
    let long = (0..100).find_map(|_| r.push(b'O'));
    assert!(matches!(long, Some(Err(ClientError::VsockHandshake(_)))));
    assert_eq!(vsock_connect_line(5000), b"CONNECT 5000\n");
}
