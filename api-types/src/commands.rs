//! Background commands: `POST /v1/sandboxes/{id}/commands` starts one
//! (the body is an [`ExecRequest`](crate::ExecRequest), with `stdin_open`
//! to keep its standard input open) and answers with a [`Command`]; it
//! can then be listed, looked at, streamed (re-attached) from any
//! connection, waited for ([`WaitQuery`]), signalled ([`SignalCommand`])
//! and written to ([`StdinQuery`]), by its id.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Where a background command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommandState {
    /// Still running.
    Running,
    /// It ended: `exit_code` or `signal` say how.
    Exited,
    /// The daemon lost it: the sandbox no longer knows the command (it was
    /// paused to disk, which ends its processes' connection, or restarted),
    /// or did not end it by its deadline. How it ended is unknown.
    Lost,
}

impl CommandState {
    /// Name as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CommandState::Running => "running",
            CommandState::Exited => "exited",
            CommandState::Lost => "lost",
        }
    }
}

impl std::fmt::Display for CommandState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A background command, as every command route shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Command {
    /// Its id (the sandbox agent's exec id, as a string).
    pub id: String,
    /// Its process id in the guest.
    pub pid: i32,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// Running, exited or lost.
    pub state: CommandState,
    /// Exit code once it exited (null while running, or if killed by a
    /// signal).
    pub exit_code: Option<i32>,
    /// The signal that killed it.
    pub signal: Option<i32>,
    /// Its timeout fired (its processes were killed).
    pub timed_out: bool,
    /// When it started, seconds since the epoch.
    pub started_at: f64,
}

/// `POST /v1/sandboxes/{id}/commands/{cid}/signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalCommand {
    /// Signal number (1..=64; 15 is SIGTERM, 9 SIGKILL).
    #[schema(minimum = 1, maximum = 64, example = 15)]
    pub signal: i32,
    /// To the command's whole process group (default), or only to its
    /// own process.
    #[serde(default = "yes")]
    pub group: bool,
}

fn yes() -> bool {
    true
}

/// Query of `POST /v1/sandboxes/{id}/commands/{cid}/wait`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Give up after this many seconds (504 `deadline_exceeded`; the
    /// command goes on). Default: until the command's own deadline.
    pub timeout_s: Option<f64>,
}

impl WaitQuery {
    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([("timeout_s", self.timeout_s.map(|t| t.to_string()))])
    }
}

/// Query of `POST /v1/sandboxes/{id}/commands/{cid}/stdin` (the body is
/// the bytes, streamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close the command's standard input after the body.
    pub close: Option<bool>,
}

impl StdinQuery {
    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([("close", self.close.map(|b| b.to_string()))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_wire_format() {
        let c = Command {
            id: "7".into(),
            pid: 42,
            sandbox_id: "abc".into(),
            state: CommandState::Running,
            exit_code: None,
            signal: None,
            timed_out: false,
            started_at: 1.5,
        };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"id":"7","pid":42,"sandbox_id":"abc","state":"running","exit_code":null,"signal":null,"timed_out":false,"started_at":1.5}"#
        );
        for s in [
            CommandState::Running,
            CommandState::Exited,
            CommandState::Lost,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn signal_bodies() {
        let s: SignalCommand = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(
            s,
            SignalCommand {
                signal: 15,
                group: true
            }
        );
        let s: SignalCommand = serde_json::from_str(r#"{"signal":9,"group":false}"#).unwrap();
        assert!(!s.group);
        assert!(serde_json::from_str::<SignalCommand>(r#"{"sig":9}"#).is_err());
    }

    #[test]
    fn queries() {
        assert_eq!(WaitQuery::default().to_query(), "");
        assert_eq!(
            WaitQuery {
                timeout_s: Some(2.5)
            }
            .to_query(),
            "?timeout_s=2.5"
        );
        assert_eq!(StdinQuery { close: Some(true) }.to_query(), "?close=true");
    }
}
