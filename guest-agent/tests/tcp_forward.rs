//! TCP forwarding (`TcpConnect`) against the real agent running as a host
//! process: its "guest loopback" is the host's, so a test listener on
//! 127.0.0.1 stands for a server in the guest.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use agent_client::{tcp_connect, ClientError, ErrorCode, Transport};
use agent_proto::{put_message, Kind, TcpConnect};
use common::{expect_error, raw_connect, read, Agent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const T: Duration = Duration::from_secs(10);

#[test]
fn relays_bytes_both_ways_with_half_close() {
    let agent = Agent::start();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    // An upper-casing echo server that answers only once the client
    // half-closed (so the half-close must go through) and then closes.
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        s.write_all(&all.to_ascii_uppercase()).unwrap();
        all.len()
    });
    let t = Transport::Unix(agent.sock.clone());
    rt().block_on(async {
        let mut s = tcp_connect(&t, port, T).await.unwrap();
        // 3 MiB: more than every buffer on the way, so backpressure works.
        let data: Vec<u8> = (0..3 << 20).map(|i| b"abcdefgh"[i % 8]).collect();
        let (mut rd, mut wr) = s.split();
        let send = async {
            wr.write_all(&data).await.unwrap();
            wr.shutdown().await.unwrap();
        };
        let mut back = Vec::new();
        let recv = rd.read_to_end(&mut back);
        let ((), n) = tokio::join!(send, recv);
        n.unwrap();
        assert_eq!(back.len(), data.len());
        assert!(back == data.to_ascii_uppercase(), "relayed bytes differ");
    });
    assert_eq!(server.join().unwrap(), 3 << 20);
}

#[test]
fn server_speaks_first_and_many_relays_run_at_once() {
    let agent = Agent::start();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for _ in 0..20 {
            let (mut s, _) = l.accept().unwrap();
            std::thread::spawn(move || {
                s.write_all(b"hello\n").unwrap();
                let mut b = [0u8; 64];
                let n = s.read(&mut b).unwrap();
                s.write_all(&b[..n]).unwrap();
            });
        }
    });
    let t = Transport::Unix(agent.sock.clone());
    rt().block_on(async {
        let mut tasks = Vec::new();
        for i in 0..20 {
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = tcp_connect(&t, port, T).await.unwrap();
                let mut b = [0u8; 6];
                s.read_exact(&mut b).await.unwrap();
                assert_eq!(&b, b"hello\n");
                let msg = format!("ping {i}");
                s.write_all(msg.as_bytes()).await.unwrap();
                let mut back = Vec::new();
                s.read_to_end(&mut back).await.unwrap();
                assert_eq!(back, msg.as_bytes());
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    server.join().unwrap();
    // The agent is still fine and serves frames on other connections.
    agent.client().health().unwrap();
}

#[test]
fn closed_port_is_refused_and_the_agent_goes_on() {
    let agent = Agent::start();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Transport::Unix(agent.sock.clone());
    let err = rt().block_on(tcp_connect(&t, port, T)).unwrap_err();
    match err {
        ClientError::Remote { code, errno, .. } => {
            assert_eq!(code, ErrorCode::Io);
            assert_eq!(errno, libc::ECONNREFUSED);
        }
        e => panic!("expected ECONNREFUSED, got {e:?}"),
    }
    let err = rt().block_on(tcp_connect(&t, 0, T)).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Remote {
                code: ErrorCode::InvalidArgument,
                ..
            }
        ),
        "{err:?}"
    );
    agent.client().health().unwrap();
}

#[test]
fn guest_side_reset_ends_the_stream() {
    let agent = Agent::start();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        // Dropped at once: the relay must end, not hang.
        drop(s);
    });
    let t = Transport::Unix(agent.sock.clone());
    rt().block_on(async {
        let mut s = tcp_connect(&t, port, T).await.unwrap();
        let mut back = Vec::new();
        tokio::time::timeout(T, s.read_to_end(&mut back))
            .await
            .expect("the relay ends when the guest side closes")
            .unwrap();
        assert!(back.is_empty());
    });
    server.join().unwrap();
}

#[test]
fn tcp_connect_refused_on_a_connection_with_streams() {
    let agent = Agent::start();
    let mut s = raw_connect(&agent);
    // An exec that keeps running holds a stream on this connection.
    let mut buf = Vec::new();
    put_message(
        &mut buf,
        5,
        &agent_proto::ExecRequest {
            command: agent_proto::Command::Shell(b"sleep 5".to_vec()),
            env: vec![],
            clear_env: false,
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: 0,
        },
    );
    s.write_all(&buf).unwrap();
    let (h, _) = read(&mut s).unwrap();
    assert_eq!(h.kind, Kind::ExecStarted as u8);
    let mut buf = Vec::new();
    put_message(
        &mut buf,
        6,
        &TcpConnect {
            port: 1,
            timeout_ms: 0,
        },
    );
    s.write_all(&buf).unwrap();
    let e = expect_error(&mut s, ErrorCode::InvalidArgument);
    assert!(e.message.contains("no other streams"), "{}", e.message);
}

#[test]
fn a_port_served_on_a_unix_socket_is_reached_without_tcp() {
    // What a guest kernel without IPv4 offers: the service listens on
    // run/shoal/ports/<port> (relative to the agent's directory).
    let agent = Agent::start();
    let port = 40123;
    let dir = agent.dir.path().join("run/shoal/ports");
    std::fs::create_dir_all(&dir).unwrap();
    let l = std::os::unix::net::UnixListener::bind(dir.join(port.to_string())).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b.to_ascii_uppercase()).unwrap();
    });
    let t = Transport::Unix(agent.sock.clone());
    rt().block_on(async {
        let mut s = tcp_connect(&t, port, T).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"PING");
    });
    server.join().unwrap();
}
