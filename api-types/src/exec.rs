//! Exec: `POST /v1/sandboxes/{id}/exec` (one-shot: [`ExecRequest`] in,
//! [`ExecResult`] out), `POST /v1/sandboxes/{id}/exec/stream`
//! (newline-delimited JSON [`ExecEvent`]s), and the same request starting
//! a background command (`POST /v1/sandboxes/{id}/commands`, see
//! [`crate::commands`]).

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// How output bytes are carried in a JSON string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// The bytes are UTF-8 text, as is.
    Utf8,
    /// The bytes, base64 (standard alphabet, padded).
    Base64,
}

impl Encoding {
    /// `data` as a JSON string: text when it is UTF-8, else base64.
    pub fn encode(data: &[u8]) -> (String, Encoding) {
        match std::str::from_utf8(data) {
            Ok(s) => (s.into(), Encoding::Utf8),
            Err(_) => (Encoding::Base64.encode_as(data), Encoding::Base64),
        }
    }

    /// `data` in this encoding.
    pub fn encode_as(self, data: &[u8]) -> String {
        match self {
            Encoding::Utf8 => String::from_utf8_lossy(data).into_owned(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(data),
        }
    }

    /// The bytes of `s`, a string in this encoding.
    pub fn decode(self, s: &str) -> Result<Vec<u8>, base64::DecodeError> {
        match self {
            Encoding::Utf8 => Ok(s.as_bytes().to_vec()),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD.decode(s),
        }
    }
}

/// `POST /v1/sandboxes/{id}/exec[/stream]`: run a command (a paused
/// sandbox is resumed first). Exactly one of `cmd` and `shell`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv (argv[0] looked up in PATH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// Or a `/bin/sh -c` script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Extra environment (over the sandbox's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Kill the command's process tree after this many seconds (default
    /// 300, at most 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Standard input (UTF-8 text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Standard input (base64), instead of `stdin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_b64: Option<String>,
    /// Background commands only (`POST .../commands`): keep standard input
    /// open after `stdin`/`stdin_b64` (if any) for later writes
    /// (`POST .../commands/{cid}/stdin`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
}

impl ExecRequest {
    /// Runs `argv`.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> ExecRequest {
        ExecRequest {
            cmd: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    /// Runs a `/bin/sh -c` script.
    pub fn shell(script: impl Into<String>) -> ExecRequest {
        ExecRequest {
            shell: Some(script.into()),
            ..Default::default()
        }
    }

    /// With a timeout.
    pub fn with_timeout(mut self, secs: f64) -> ExecRequest {
        self.timeout_s = Some(secs);
        self
    }

    /// With `data` on standard input (sent as base64).
    pub fn with_stdin(mut self, data: &[u8]) -> ExecRequest {
        self.stdin = None;
        self.stdin_b64 = Some(Encoding::Base64.encode_as(data));
        self
    }
}

/// Output of a one-shot exec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// Exit code (null if killed by a signal).
    pub exit_code: Option<i32>,
    /// Signal that killed it.
    pub signal: Option<i32>,
    /// Its timeout fired (its processes were killed).
    pub timed_out: bool,
    /// Standard output, in `encoding`.
    pub stdout: String,
    /// Standard error, in `encoding`.
    pub stderr: String,
    /// Encoding of both streams.
    pub encoding: Encoding,
    /// Output beyond the limit (16 MiB per stream by default) was dropped,
    /// from either stream.
    pub truncated: bool,
    /// Standard output was cut at the limit.
    #[serde(default)]
    pub stdout_truncated: bool,
    /// Standard error was cut at the limit.
    #[serde(default)]
    pub stderr_truncated: bool,
    /// Request to exit (ms).
    pub duration_ms: f64,
}

impl ExecResult {
    /// Standard output's bytes.
    pub fn stdout_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        self.encoding.decode(&self.stdout)
    }

    /// Standard error's bytes.
    pub fn stderr_bytes(&self) -> Result<Vec<u8>, base64::DecodeError> {
        self.encoding.decode(&self.stderr)
    }

    /// The shell-style status: the exit code, 128 + the signal, or 1.
    pub fn code(&self) -> i32 {
        status_code(self.exit_code, self.signal)
    }
}

/// The shell-style status: the exit code, 128 + the signal, or 1.
pub fn status_code(exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    match (exit_code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

/// One line of a streamed exec: `start`, then `stdout`/`stderr` chunks,
/// then `exit` or `error` (the last line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The command started.
    Start {
        /// Its pid in the guest.
        pid: i32,
        /// The agent's id of this exec.
        exec_id: u64,
    },
    /// A chunk of standard output.
    Stdout {
        /// The bytes, in `encoding`.
        data: String,
        /// `utf8` or `base64`.
        encoding: Encoding,
    },
    /// A chunk of standard error.
    Stderr {
        /// The bytes, in `encoding`.
        data: String,
        /// `utf8` or `base64`.
        encoding: Encoding,
    },
    /// The command ended.
    Exit {
        /// Exit code (null if killed by a signal).
        exit_code: Option<i32>,
        /// Signal that killed it.
        signal: Option<i32>,
        /// Its timeout fired.
        timed_out: bool,
    },
    /// The exec failed (the sandbox or the daemon); nothing follows.
    Error {
        /// What happened.
        message: String,
    },
}

impl ExecEvent {
    /// A `stdout` event of `data`.
    pub fn stdout(data: &[u8]) -> ExecEvent {
        let (data, encoding) = Encoding::encode(data);
        ExecEvent::Stdout { data, encoding }
    }

    /// A `stderr` event of `data`.
    pub fn stderr(data: &[u8]) -> ExecEvent {
        let (data, encoding) = Encoding::encode(data);
        ExecEvent::Stderr { data, encoding }
    }

    /// The event as one line of the stream (JSON and `\n`).
    pub fn to_line(&self) -> Vec<u8> {
        let mut b = serde_json::to_vec(self).unwrap_or_default();
        b.push(b'\n');
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_wire_format() {
        let cases = [
            (
                ExecEvent::Start { pid: 7, exec_id: 3 },
                r#"{"type":"start","pid":7,"exec_id":3}"#,
            ),
            (
                ExecEvent::stdout(b"hi\n"),
                r#"{"type":"stdout","data":"hi\n","encoding":"utf8"}"#,
            ),
            (
                ExecEvent::stderr(&[0xff]),
                r#"{"type":"stderr","data":"/w==","encoding":"base64"}"#,
            ),
            (
                ExecEvent::Exit {
                    exit_code: None,
                    signal: Some(9),
                    timed_out: true,
                },
                r#"{"type":"exit","exit_code":null,"signal":9,"timed_out":true}"#,
            ),
            (
                ExecEvent::Error {
                    message: "x".into(),
                },
                r#"{"type":"error","message":"x"}"#,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(serde_json::to_string(&e).unwrap(), want);
            assert_eq!(serde_json::from_str::<ExecEvent>(want).unwrap(), e);
            assert_eq!(e.to_line(), format!("{want}\n").into_bytes());
        }
    }

    #[test]
    fn encodings_round_trip() {
        for d in [&b"text"[..], &[0, 159, 146, 150]] {
            let (s, e) = Encoding::encode(d);
            assert_eq!(e.decode(&s).unwrap(), d);
        }
        assert_eq!(Encoding::encode(b"ok").1, Encoding::Utf8);
        assert_eq!(Encoding::encode(&[0xc3]).1, Encoding::Base64);
    }

    #[test]
    fn exec_requests() {
        let r = ExecRequest::argv(["echo", "hi"]).with_timeout(5.0);
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":["echo","hi"],"timeout_s":5.0}"#
        );
        let r = ExecRequest::shell("cat").with_stdin(b"x");
        assert_eq!(r.stdin_b64.as_deref(), Some("eA=="));
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":[]}"#).is_err());
        assert_eq!(status_code(Some(3), None), 3);
        assert_eq!(status_code(None, Some(9)), 137);
        assert_eq!(status_code(None, None), 1);
    }
}
