//! PTY execs (`PtyExec`, `PtyResize`) against the real agent as a host
//! process: the command's stdin, stdout and stderr are one terminal, of
//! the size asked for and then resized, fed by stdin writes.

mod common;

use agent_client::{
    AsyncClient, ClientError, Config, ErrorCode, ExecEvent, ExecRequest, Transport,
};
use common::Agent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pty_exec_has_a_terminal_that_resizes_and_takes_input() {
    let agent = Agent::start();
    let c = AsyncClient::connect(&Transport::Unix(agent.sock.clone()), Config::default())
        .await
        .expect("connect to the agent");
    let req = ExecRequest::shell("stty size; read a; stty size; tty; echo a=$a >&2; exit 4");
    let mut h = c.exec_pty(&req, 80, 24).await.unwrap();
    let mut out = Vec::new();
    // The first size, then the resize and the input.
    while !String::from_utf8_lossy(&out).contains("24 80") {
        match h.next_event().await.unwrap() {
            Some(ExecEvent::Stdout(d)) => out.extend_from_slice(&d),
            other => panic!("before the input: {other:?}"),
        }
    }
    c.resize_pty(h.exec_id(), 100, 30).await.unwrap();
    h.write_stdin(b"hi\n").await.unwrap();
    let result = loop {
        match h.next_event().await.unwrap() {
            Some(ExecEvent::Stdout(d)) => out.extend_from_slice(&d),
            Some(ExecEvent::Stderr(d)) => panic!("a terminal has no separate stderr: {d:?}"),
            Some(ExecEvent::Exit(r)) => break r,
            None => panic!("no result"),
        }
    };
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("30 100"), "{text}");
    assert!(text.contains("/dev/pts/"), "{text}");
    // stderr is the terminal too; the terminal echoes the input.
    assert!(text.contains("a=hi"), "{text}");
    assert_eq!(result.status, agent_client::ExitStatus::Exited(4));

    // Resizing what is not a terminal, or no exec, fails.
    let plain = c.exec(&ExecRequest::shell("sleep 5")).await.unwrap();
    assert!(c.resize_pty(plain.exec_id(), 10, 10).await.is_err());
    plain.signal(libc::SIGKILL, true).await.unwrap();
    match c.resize_pty(987_654, 10, 10).await {
        Err(ClientError::Remote {
            code: ErrorCode::NoSuchExec,
            ..
        }) => {}
        other => panic!("resize of no exec: {other:?}"),
    }
}
