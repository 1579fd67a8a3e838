use super::*;
use std::io::{BufRead, BufReader};

fn socket() -> (tempfile::TempDir, PathBuf, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    let l = UnixListener::bind(&path).unwrap();
    (dir, path, l)
}

fn read_line(r: &mut impl BufRead) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l
}

#[test]
fn bad_lines_are_answered_and_the_connection_stays() {
    let (_d, path, l) = socket();
    serve(l, |cmd| {
        match cmd {
            Command::Stats(r) => r.ok(crate::wire::tests::stats()),
            other => other.refuse("nope"),
        }
        true
    })
    .unwrap();
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(b"garbage\n{\"op\":\"pause\"}\n{\"op\":\"stats\"}\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let l1 = read_line(&mut r);
    assert!(
        l1.starts_with("{\"ok\":false,\"error\":\"bad request:"),
        "{l1}"
    );
    assert_eq!(read_line(&mut r), "{\"ok\":false,\"error\":\"nope\"}\n");
    assert!(read_line(&mut r).starts_with("{\"ok\":true,\"stats\":{"));
    // Unknown fields and ops are bad requests too.
    s.write_all(b"{\"op\":\"snapshot\",\"dir\":\"/s\",\"x\":1}\n{\"op\":\"explode\"}\n")
        .unwrap();
    assert!(read_line(&mut r).contains("bad request"));
    assert!(read_line(&mut r).contains("bad request"));
}

#[test]
fn an_endless_request_line_is_cut_off() {
    let (_d, path, l) = socket();
    serve(l, |cmd| {
        cmd.refuse("unreachable");
        true
    })
    .unwrap();
    let mut s = UnixStream::connect(&path).unwrap();
    // The server stops reading at the cap; the rest may not be taken.
    let _ = s.write_all(&vec![b'x'; MAX_LINE + 10]);
    let mut r = BufReader::new(s);
    let l = read_line(&mut r);
    assert!(
        l.contains(&format!("request longer than {MAX_LINE} bytes")),
        "{l}"
    );
    // And the connection is closed (reset, as the server left bytes unread).
    let mut rest = String::new();
    match r.read_line(&mut rest) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection still open: {other:?} {rest:?}"),
    }
}
