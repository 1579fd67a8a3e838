//! Background commands, mkdir, rename and a sandbox's new limits, as
//! typed methods of [`DaemonClient`].

use crate::{api, Body, ClientError, DaemonClient, ExecStream, Result};
use std::io::Read;

/// Longest screenshot read (the daemon's own cap is 64 MiB).
pub const MAX_SCREEN: u64 = 64 << 20;

fn sandbox(id: &str) -> String {
    format!(
        "/v1/sandboxes/{}",
        api::encode_query_value(id).replace('/', "%2F")
    )
}

fn command(id: &str, cid: &str) -> String {
    format!(
        "{}/commands/{}",
        sandbox(id),
        api::encode_query_value(cid).replace('/', "%2F")
    )
}

impl DaemonClient {
    /// `POST /v1/sandboxes/{id}/commands`: starts a background command.
    pub fn start_command(&self, id: &str, req: &api::ExecRequest) -> Result<api::Command> {
        self.call("POST", &format!("{}/commands", sandbox(id)), Some(req))
    }

    /// `GET /v1/sandboxes/{id}/commands`: the sandbox's commands, oldest
    /// first.
    pub fn commands(&self, id: &str) -> Result<Vec<api::Command>> {
        self.call("GET", &format!("{}/commands", sandbox(id)), None::<&()>)
    }

    /// `GET /v1/sandboxes/{id}/commands/{cid}`.
    pub fn command(&self, id: &str, cid: &str) -> Result<api::Command> {
        self.call("GET", &command(id, cid), None::<&()>)
    }

    /// `GET /v1/sandboxes/{id}/commands/{cid}/stream`: its output kept so
    /// far, then live, then its end (re-attach).
    pub fn command_stream(&self, id: &str, cid: &str) -> Result<ExecStream> {
        let r = self
            .request("GET", &format!("{}/stream", command(id, cid)), Body::Empty)?
            .ok()?;
        Ok(ExecStream::new(r))
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/wait`: its result once it
    /// ended (504 `deadline_exceeded` after `timeout_s`; it goes on).
    pub fn wait_command(
        &self,
        id: &str,
        cid: &str,
        timeout_s: Option<f64>,
    ) -> Result<api::ExecResult> {
        let q = api::WaitQuery { timeout_s };
        self.call(
            "POST",
            &format!("{}/wait{}", command(id, cid), q.to_query()),
            None::<&()>,
        )
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/signal`.
    pub fn signal_command(&self, id: &str, cid: &str, signal: i32, group: bool) -> Result<()> {
        let b = api::SignalCommand { signal, group };
        self.no_body("POST", &format!("{}/signal", command(id, cid)), Some(&b))
    }

    /// `POST /v1/sandboxes/{id}/commands/{cid}/stdin`: streams `data` to
    /// its stdin, then closes it with `close`.
    pub fn command_stdin(
        &self,
        id: &str,
        cid: &str,
        data: &mut dyn Read,
        close: bool,
    ) -> Result<()> {
        let q = api::StdinQuery { close: Some(close) };
        self.request(
            "POST",
            &format!("{}/stdin{}", command(id, cid), q.to_query()),
            Body::Stream(data),
        )?
        .ok()
        .map(drop)
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    pub fn mkdir(&self, id: &str, q: &api::MkdirQuery) -> Result<()> {
        self.no_body(
            "POST",
            &format!("{}/files/mkdir{}", sandbox(id), q.to_query()),
            None::<&()>,
        )
    }

    /// `POST /v1/sandboxes/{id}/files/rename`.
    pub fn rename(&self, id: &str, from: &str, to: &str) -> Result<()> {
        let b = api::RenameRequest {
            from: from.into(),
            to: to.into(),
        };
        self.no_body("POST", &format!("{}/files/rename", sandbox(id)), Some(&b))
    }

    /// `PATCH /v1/sandboxes/{id}`: a new TTL (from now; 0 none) and idle
    /// timeout, each if given.
    pub fn update_sandbox(&self, id: &str, req: &api::UpdateSandbox) -> Result<api::Sandbox> {
        self.call("PATCH", &sandbox(id), Some(req))
    }

    /// `GET /v1/sandboxes/{id}/screen`: a PNG of a `vm` sandbox's display
    /// (at most [`MAX_SCREEN`] bytes are read).
    pub fn screen(&self, id: &str) -> Result<Vec<u8>> {
        let r = self
            .request("GET", &format!("{}/screen", sandbox(id)), Body::Empty)?
            .ok()?;
        let mut png = Vec::new();
        r.body
            .take(MAX_SCREEN + 1)
            .read_to_end(&mut png)
            .map_err(|e| ClientError::Protocol(format!("reading the screen: {e}")))?;
        if png.len() as u64 > MAX_SCREEN {
            return Err(ClientError::Protocol(format!(
                "the screen is over {MAX_SCREEN} bytes"
            )));
        }
        if !png.starts_with(b"\x89PNG\r\n\x1a\n") {
            return Err(ClientError::Protocol(format!(
                "the screen is not a PNG ({} bytes)",
                png.len()
            )));
        }
        Ok(png)
    }

    /// `POST /v1/sandboxes/{id}/input`: keyboard and pointer events for a
    /// `vm` sandbox's display, in order (1 to [`api::MAX_INPUT_EVENTS`]).
    pub fn input(&self, id: &str, events: &[api::InputEvent]) -> Result<()> {
        let b = api::InputRequest {
            events: events.to_vec(),
        };
        self.no_body("POST", &format!("{}/input", sandbox(id)), Some(&b))
    }

    /// A call answered with no body (204).
    fn no_body(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<()> {
        let b = match body {
            Some(b) => {
                Body::Json(serde_json::to_vec(b).map_err(|e| ClientError::Protocol(e.to_string()))?)
            }
            None => Body::Empty,
        };
        self.request(method, path, b)?.ok().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_encoded() {
        assert_eq!(command("ab", "7"), "/v1/sandboxes/ab/commands/7");
        assert_eq!(command("a/b", "x y"), "/v1/sandboxes/a%2Fb/commands/x%20y");
    }
}
