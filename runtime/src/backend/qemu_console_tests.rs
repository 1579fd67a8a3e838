//! The console driver against a real shell: a host `sh` whose stdin and
//! stdout are the accepted end of a stand-in for QEMU's chardev socket
//! (what the guest's console shell is after [`SETUP`]).

use super::*;
use std::os::unix::net::UnixListener;

/// Serves `path` with a fresh `sh` per connection; returns the listener's
/// thread handle (it runs until the test ends).
fn shell_console(path: &Path) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let c = c.unwrap();
            let out = c.try_clone().unwrap();
            let mut sh = std::process::Command::new("sh")
                .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(c)))
                .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(out)))
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // It ends when the console's connection closes.
            std::thread::spawn(move || sh.wait());
        }
    });
}

fn console() -> (tempfile::TempDir, Console) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("console.sock");
    shell_console(&p);
    let c = Console::new(&p);
    (d, c)
}

const S: Duration = Duration::from_secs(20);

#[test]
fn commands_give_their_output_and_exit_status() {
    let (_d, c) = console();
    let r = c.run("echo hello; echo err >&2", None, S, S, 1024).unwrap();
    assert_eq!(r.output, b"hello\nerr\n");
    assert_eq!((r.code, r.timed_out, r.dropped), (0, false, 0));
    let r = c.run("exit 3", None, S, S, 1024).unwrap();
    assert_eq!(r.code, 3);
    // Quotes, newlines and a syntax error stay inside the command.
    let r = c
        .run("echo 'a'\\''b'\necho \"$((1+1))\"", None, S, S, 1024)
        .unwrap();
    assert_eq!(r.output, b"a'b\n2\n");
    let r = c.run("if then", None, S, S, 1024).unwrap();
    assert_ne!(r.code, 0);
    let r = c.run("echo still here", None, S, S, 1024).unwrap();
    assert_eq!(r.output, b"still here\n");
}

#[test]
fn stdin_goes_through_whole_and_output_is_capped() {
    let (_d, c) = console();
    let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let r = c.run("cat", Some(&data), S, S, 1 << 20).unwrap();
    assert_eq!(r.output, data);
    let r = c.run("seq 1 10000", None, S, S, 100).unwrap();
    assert_eq!(r.output.len(), 100);
    assert!(r.dropped > 40_000, "{}", r.dropped);
    assert_eq!(r.code, 0);
}

#[test]
fn a_fake_end_marker_cannot_forge_a_result() {
    let (_d, c) = console();
    // Markers of any other nonce (earlier calls', made-up ones) are output.
    let r = c
        .run(
            "printf '%s-%s 0\\n' 0123456789abcdef01234567 e; echo after; exit 7",
            None,
            S,
            S,
            1024,
        )
        .unwrap();
    assert_eq!(r.code, 7);
    assert_eq!(r.output, b"0123456789abcdef01234567-e 0\nafter\n");
}

#[test]
fn a_command_over_its_deadline_times_out_and_the_console_recovers() {
    let (_d, c) = console();
    // The host's deadline passes first: a timeout, the shell still busy.
    let e = c
        .run(
            "sleep 3; echo late",
            None,
            S,
            Duration::from_millis(300),
            1024,
        )
        .unwrap_err();
    assert!(matches!(e, ConsoleError::Timeout(_)), "{e}");
    // The next call waits for it, and never takes its output for its own.
    let r = c.run("echo next", None, S, S, 1024).unwrap();
    assert_eq!(r.output, b"next\n");
    // The guest-side limit kills a command that runs too long.
    let r = c
        .run("sleep 30", None, Duration::from_secs(1), S, 1024)
        .unwrap();
    assert!(r.timed_out && r.code == 137, "{r:?}");
}

#[test]
fn what_a_console_cannot_carry_is_refused() {
    let (_d, c) = console();
    assert!(matches!(
        c.run("a\0b", None, S, S, 10),
        Err(ConsoleError::Invalid(_))
    ));
    let big = "x".repeat(MAX_SCRIPT + 1);
    assert!(matches!(
        c.run(&big, None, S, S, 10),
        Err(ConsoleError::Invalid(_))
    ));
}
