//! The API's operations as typed methods of [`DaemonClient`].

use crate::{api, Body, ClientError, DaemonClient, Response, Result};
use std::io::{BufRead, BufReader, Read};

/// A path segment (a sandbox id, a template name), percent-encoded.
fn seg(s: &str) -> String {
    api::encode_query_value(s).replace('/', "%2F")
}

fn sandbox(id: &str) -> String {
    format!("/v1/sandboxes/{}", seg(id))
}

impl DaemonClient {
    fn no_content(&self, method: &str, path: &str) -> Result<()> {
        self.request(method, path, Body::Empty)?.ok().map(drop)
    }

    fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call("GET", path, None::<&()>)
    }

    /// `GET /healthz`.
    pub fn health(&self) -> Result<api::Health> {
        self.get("/healthz")
    }

    /// `GET /openapi.json`: the daemon's OpenAPI document.
    pub fn openapi(&self) -> Result<serde_json::Value> {
        self.get("/openapi.json")
    }

    /// `GET /metrics`: Prometheus text.
    pub fn metrics(&self) -> Result<String> {
        let b = self
            .request("GET", "/metrics", Body::Empty)?
            .ok()?
            .bytes()?;
        String::from_utf8(b).map_err(|e| ClientError::Protocol(format!("metrics: {e}")))
    }

    /// `GET /v1/stats`.
    pub fn stats(&self) -> Result<api::Stats> {
        self.get("/v1/stats")
    }

    /// `GET /v1/events`.
    pub fn events(&self, q: &api::EventQuery) -> Result<Vec<api::Event>> {
        self.get(&format!("/v1/events{}", q.to_query()))
    }

    /// `POST /v1/sandboxes`: a running sandbox.
    pub fn create(&self, req: &api::CreateSandbox) -> Result<api::Sandbox> {
        self.call("POST", "/v1/sandboxes", Some(req))
    }

    /// `GET /v1/sandboxes/{id}`.
    pub fn sandbox(&self, id: &str) -> Result<api::Sandbox> {
        self.get(&sandbox(id))
    }

    /// `GET /v1/sandboxes`.
    pub fn list(&self, f: &api::ListFilter) -> Result<Vec<api::Sandbox>> {
        self.get(&format!("/v1/sandboxes{}", f.to_query()))
    }

    /// `DELETE /v1/sandboxes/{id}`: kills it and removes everything it had.
    pub fn kill(&self, id: &str) -> Result<()> {
        self.no_content("DELETE", &sandbox(id))
    }

    /// `POST /v1/sandboxes/{id}/pause`.
    pub fn pause(&self, id: &str) -> Result<api::Sandbox> {
        self.call("POST", &format!("{}/pause", sandbox(id)), None::<&()>)
    }

    /// `PUT /v1/sandboxes/{id}/network`: a networked sandbox's new egress
    /// policy, in force at once.
    pub fn set_network(&self, id: &str, net: &api::NetworkSpec) -> Result<api::Sandbox> {
        self.call("PUT", &format!("{}/network", sandbox(id)), Some(net))
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub fn resume(&self, id: &str) -> Result<api::Sandbox> {
        self.call("POST", &format!("{}/resume", sandbox(id)), None::<&()>)
    }

    /// `POST /v1/sandboxes/{id}/snapshot`: a new (ready) template.
    pub fn snapshot(&self, id: &str, req: &api::SnapshotRequest) -> Result<api::Template> {
        self.call("POST", &format!("{}/snapshot", sandbox(id)), Some(req))
    }

    /// `POST /v1/sandboxes/{id}/fork`: live clones of a running sandbox
    /// (those made, and why the others were not).
    pub fn fork(&self, id: &str, req: &api::ForkRequest) -> Result<api::Forked> {
        self.call("POST", &format!("{}/fork", sandbox(id)), Some(req))
    }

    /// `POST /v1/sandboxes/{id}/exec`: runs a command to its end.
    pub fn exec(&self, id: &str, req: &api::ExecRequest) -> Result<api::ExecResult> {
        self.call("POST", &format!("{}/exec", sandbox(id)), Some(req))
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: runs a command, its events
    /// as they come.
    pub fn exec_stream(&self, id: &str, req: &api::ExecRequest) -> Result<ExecStream> {
        let b = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let r = self
            .request(
                "POST",
                &format!("{}/exec/stream", sandbox(id)),
                Body::Json(b),
            )?
            .ok()?;
        Ok(ExecStream {
            lines: BufReader::new(r),
            done: false,
        })
    }

    /// `PUT /v1/sandboxes/{id}/files`: streams `data` into a guest file.
    pub fn put_file(
        &self,
        id: &str,
        q: &api::UploadQuery,
        data: &mut dyn Read,
    ) -> Result<api::Uploaded> {
        let r = self
            .request(
                "PUT",
                &format!("{}/files{}", sandbox(id), q.to_query()),
                Body::Stream(data),
            )?
            .ok()?;
        let b = r.bytes()?;
        serde_json::from_slice(&b)
            .map_err(|e| ClientError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&b))))
    }

    /// `GET /v1/sandboxes/{id}/files`: a guest file, streamed.
    pub fn get_file(&self, id: &str, path: &str) -> Result<Download> {
        let q = api::FileQuery { path: path.into() };
        let r = self
            .request(
                "GET",
                &format!("{}/files{}", sandbox(id), q.to_query()),
                Body::Empty,
            )?
            .ok()?;
        let size = r.header("x-file-size").and_then(|v| v.parse().ok());
        Ok(Download { size, r })
    }

    /// `GET /v1/sandboxes/{id}/files/stat`.
    pub fn stat(&self, id: &str, path: &str) -> Result<api::FileStat> {
        let q = api::FileQuery { path: path.into() };
        self.get(&format!("{}/files/stat{}", sandbox(id), q.to_query()))
    }

    /// `GET /v1/sandboxes/{id}/files/list`.
    pub fn list_dir(&self, id: &str, path: &str) -> Result<Vec<api::DirEntry>> {
        let q = api::FileQuery { path: path.into() };
        self.get(&format!("{}/files/list{}", sandbox(id), q.to_query()))
    }

    /// `DELETE /v1/sandboxes/{id}/files`.
    pub fn remove_file(&self, id: &str, q: &api::RemoveQuery) -> Result<()> {
        self.no_content("DELETE", &format!("{}/files{}", sandbox(id), q.to_query()))
    }

    /// `POST /v1/templates`: registered, built in the background.
    pub fn create_template(&self, req: &api::CreateTemplate) -> Result<api::Template> {
        self.call("POST", "/v1/templates", Some(req))
    }

    /// `GET /v1/templates/{name}`.
    pub fn template(&self, name: &str) -> Result<api::Template> {
        self.get(&format!("/v1/templates/{}", seg(name)))
    }

    /// `GET /v1/templates`.
    pub fn templates(&self) -> Result<Vec<api::Template>> {
        self.get("/v1/templates")
    }

    /// `DELETE /v1/templates/{name}`.
    pub fn delete_template(&self, name: &str) -> Result<()> {
        self.no_content("DELETE", &format!("/v1/templates/{}", seg(name)))
    }

    /// `GET /v1/images`: the host's OCI images and their disk use.
    pub fn images(&self) -> Result<api::ImageList> {
        self.get("/v1/images")
    }

    /// `GET /v1/images/{ref-or-id}`.
    pub fn image(&self, reference: &str) -> Result<api::Image> {
        self.get(&format!("/v1/images/{}", seg(reference)))
    }

    /// `POST /v1/images`: pull an image (answers once it is stored).
    pub fn pull_image(&self, req: &api::PullImage) -> Result<api::Image> {
        self.call("POST", "/v1/images", Some(req))
    }

    /// `DELETE /v1/images/{ref-or-id}`: the image as it was.
    pub fn remove_image(&self, reference: &str) -> Result<api::Image> {
        self.call(
            "DELETE",
            &format!("/v1/images/{}", seg(reference)),
            None::<&()>,
        )
    }

    /// `GET /v1/pools`.
    pub fn pools(&self) -> Result<Vec<api::Pool>> {
        self.get("/v1/pools")
    }

    /// `PUT /v1/pools/{template}`.
    pub fn set_pool(&self, template: &str, target: u32) -> Result<api::Pool> {
        self.call(
            "PUT",
            &format!("/v1/pools/{}", seg(template)),
            Some(&api::SetPool { target }),
        )
    }

    /// `DELETE /v1/pools/{template}`.
    pub fn delete_pool(&self, template: &str) -> Result<()> {
        self.no_content("DELETE", &format!("/v1/pools/{}", seg(template)))
    }
}

/// The events of a streamed exec, in order; it ends after `exit` or
/// `error`.
pub struct ExecStream {
    lines: BufReader<Response>,
    done: bool,
}

impl ExecStream {
    /// The events of a streamed response.
    pub(crate) fn new(r: Response) -> ExecStream {
        ExecStream {
            lines: BufReader::new(r),
            done: false,
        }
    }
}

impl Iterator for ExecStream {
    type Item = Result<api::ExecEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(0) => {
                self.done = true;
                None
            }
            Ok(_) => {
                let ev = serde_json::from_str::<api::ExecEvent>(line.trim_end()).map_err(|e| {
                    ClientError::Protocol(format!("exec event {:?}: {e}", line.trim_end()))
                });
                self.done = matches!(
                    ev,
                    Err(_) | Ok(api::ExecEvent::Exit { .. } | api::ExecEvent::Error { .. })
                );
                Some(ev)
            }
            Err(e) => {
                self.done = true;
                Some(Err(ClientError::Protocol(format!(
                    "reading the exec stream: {e}"
                ))))
            }
        }
    }
}

/// A guest file being downloaded: read it.
pub struct Download {
    /// Its size (the `x-file-size` header).
    pub size: Option<u64>,
    r: Response,
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.r.read(buf)
    }
}

impl Read for Response {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader().read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_encoded() {
        assert_eq!(sandbox("0123456789ab"), "/v1/sandboxes/0123456789ab");
        assert_eq!(seg("a/b c"), "a%2Fb%20c");
    }

    fn response(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![],
            body: Box::new(std::io::Cursor::new(body.as_bytes().to_vec())),
        }
    }

    #[test]
    fn exec_streams_end_after_exit_or_error() {
        let text = concat!(
            r#"{"type":"start","pid":1,"exec_id":2}"#,
            "\n",
            r#"{"type":"stdout","data":"aGk=","encoding":"base64"}"#,
            "\n",
            r#"{"type":"exit","exit_code":0,"signal":null,"timed_out":false}"#,
            "\n",
            "not read\n"
        );
        let s = ExecStream {
            lines: BufReader::new(response(200, text)),
            done: false,
        };
        let ev: Vec<api::ExecEvent> = s.map(|e| e.unwrap()).collect();
        assert_eq!(ev.len(), 3);
        match &ev[1] {
            api::ExecEvent::Stdout { data, encoding } => {
                assert_eq!(encoding.decode(data).unwrap(), b"hi")
            }
            e => panic!("{e:?}"),
        }
        let mut s = ExecStream {
            lines: BufReader::new(response(200, "{\"type\":\"nope\"}\n{}\n")),
            done: false,
        };
        assert!(matches!(s.next(), Some(Err(ClientError::Protocol(_)))));
        assert!(s.next().is_none(), "a bad line ends the stream");
    }

    #[test]
    fn errors_are_typed() {
        let e = response(429, r#"{"error":{"code":"host_full","message":"full"}}"#)
            .ok()
            .err()
            .unwrap();
        assert_eq!(
            (e.status(), e.code(), e.to_string().as_str()),
            (Some(429), Some(api::ErrorCode::HostFull), "full (HTTP 429)")
        );
        let e = response(400, "plain").ok().err().unwrap();
        assert_eq!((e.status(), e.code()), (Some(400), None));
        assert!(e.to_string().starts_with("plain"));
        assert!(response(404, "{}").ok().err().unwrap().is_not_found());
    }
}
