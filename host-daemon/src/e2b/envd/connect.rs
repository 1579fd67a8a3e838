//! The Connect protocol as the E2B SDK speaks it: the JSON codec, unary
//! calls (a plain JSON body each way) and streams (messages in 5-byte
//! envelopes: flags, then the length big-endian; the last one, flagged
//! [`FLAG_END`], carries the end of the stream: `{}` or the error).

use crate::ApiError;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::time::Duration;

/// An envelope's flag: its payload is compressed (never used here).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// An envelope's flag: the end of the stream.
pub const FLAG_END: u8 = 0x02;
/// The largest message taken from a client.
pub const MAX_MESSAGE: usize = 16 << 20;

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled`
    Canceled,
    /// `unknown`
    Unknown,
    /// `invalid_argument`
    InvalidArgument,
    /// `deadline_exceeded`
    DeadlineExceeded,
    /// `not_found`
    NotFound,
    /// `already_exists`
    AlreadyExists,
    /// `permission_denied`
    PermissionDenied,
    /// `resource_exhausted`
    ResourceExhausted,
    /// `failed_precondition`
    FailedPrecondition,
    /// `unimplemented`
    Unimplemented,
    /// `internal`
    Internal,
    /// `unavailable`
    Unavailable,
    /// `unauthenticated`
    Unauthenticated,
}

impl Code {
    /// The code's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the Connect spec's
    /// table).
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An RPC's error: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    /// The code.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl RpcError {
    /// An error with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// `invalid_argument`.
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidArgument, message)
    }

    /// The error as JSON (`{"code","message"}`).
    pub fn json(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }

    /// A unary call's error response.
    pub fn unary_response(&self) -> Response {
        (
            self.code.http_status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

impl From<ApiError> for RpcError {
    fn from(e: ApiError) -> RpcError {
        use agent_client::ClientError as C;
        let code = match &e {
            ApiError::Agent(C::Remote { errno, .. }) if *errno == libc::EEXIST => {
                Code::AlreadyExists
            }
            ApiError::Agent(C::Remote { errno, .. })
                if *errno == libc::EACCES || *errno == libc::EPERM =>
            {
                Code::PermissionDenied
            }
            _ => match e.status() {
                400 | 413 => Code::InvalidArgument,
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                409 => Code::FailedPrecondition,
                429 | 507 => Code::ResourceExhausted,
                502 | 503 => Code::Unavailable,
                504 => Code::DeadlineExceeded,
                _ => Code::Internal,
            },
        };
        RpcError::new(code, e.to_string())
    }
}

/// One envelope around `payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.push(flags);
    let n = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    v.extend_from_slice(&n.to_be_bytes());
    v.extend_from_slice(payload);
    Bytes::from(v)
}

/// A stream's message.
pub fn message(v: &Value) -> Bytes {
    envelope(0, v.to_string().as_bytes())
}

/// A stream's end: `{}`, or `{"error":...}`.
pub fn end_of_stream(err: Option<&RpcError>) -> Bytes {
    let v = match err {
        None => json!({}),
        Some(e) => json!({ "error": e.json() }),
    };
    envelope(FLAG_END, v.to_string().as_bytes())
}

/// Why an envelope stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// A message over the limit.
    #[error("a message of {0} bytes is over the limit of {MAX_MESSAGE}")]
    TooLarge(usize),
    /// Compressed (the SDK never compresses; compression was refused).
    #[error("compressed messages are not accepted (connect-encoding: identity)")]
    Compressed,
    /// The stream ended inside an envelope.
    #[error("the stream ended inside a message")]
    Truncated,
}

/// Takes envelopes out of a byte stream as it comes.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    /// Appends bytes read.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole envelope (flags, payload), if one is there.
    pub fn next_envelope(&mut self) -> Result<Option<(u8, Vec<u8>)>, EnvelopeError> {
        let Some(head) = self.buf.get(..5) else {
            return Ok(None);
        };
        let flags = head[0];
        let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if n > MAX_MESSAGE {
            return Err(EnvelopeError::TooLarge(n));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(EnvelopeError::Compressed);
        }
        if self.buf.len() < 5 + n {
            return Ok(None);
        }
        let payload = self.buf[5..5 + n].to_vec();
        self.buf.drain(..5 + n);
        Ok(Some((flags, payload)))
    }

    /// The input ended: an error if part of an envelope is left.
    pub fn finish(&self) -> Result<(), EnvelopeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(EnvelopeError::Truncated)
        }
    }
}

/// The call's deadline from `Connect-Timeout-Ms` (at most 10 digits, as
/// the spec allows), if it has one.
pub fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, RpcError> {
    let Some(v) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let s = v.to_str().unwrap_or("");
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RpcError::invalid(format!(
            "connect-timeout-ms {s:?}: expected 1 to 10 digits"
        )));
    }
    Ok(s.parse::<u64>().ok().map(Duration::from_millis))
}

/// The keepalive interval a stream's client asks for
/// (`Keepalive-Ping-Interval`, seconds; envd's default 90 s).
pub fn keepalive(headers: &HeaderMap) -> Duration {
    let s = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(90);
    Duration::from_secs(s.clamp(1, 3600))
}

/// Reads a whole request body of at most `limit` bytes within `deadline`.
pub async fn read_body(body: Body, limit: usize, deadline: Duration) -> Result<Bytes, RpcError> {
    let read = axum::body::to_bytes(body, limit);
    match tokio::time::timeout(deadline, read).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(RpcError::invalid(format!(
            "reading the request body (at most {limit} bytes): {e}"
        ))),
        Err(_) => Err(RpcError::new(
            Code::DeadlineExceeded,
            "the request body did not come in time",
        )),
    }
}

/// The one message of a server-streaming call's request body.
pub fn single_message(body: &[u8]) -> Result<Value, RpcError> {
    let mut d = Decoder::default();
    d.push(body);
    let (flags, payload) = d
        .next_envelope()
        .map_err(|e| RpcError::invalid(e.to_string()))?
        .ok_or_else(|| RpcError::invalid("the request has no message"))?;
    if flags & FLAG_END != 0 {
        return Err(RpcError::invalid("the request has no message"));
    }
    parse_json(&payload)
}

/// A JSON object from a message (`{}` for an empty one).
pub fn parse_json(payload: &[u8]) -> Result<Value, RpcError> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(payload) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(RpcError::invalid("the message is not a JSON object")),
        Err(e) => Err(RpcError::invalid(format!("the message is not JSON: {e}"))),
    }
}

/// A unary call's success response.
pub fn unary_ok(v: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// The response of a streaming call that failed before its first
/// message: 200 and the end of the stream with the error (as connect-go
/// answers).
pub fn stream_error(e: &RpcError) -> Response {
    stream_response(Body::from(end_of_stream(Some(e))))
}

/// A streaming call's response around `body` (envelopes).
pub fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        body,
    )
        .into_response()
}

/// A protobuf int64/uint64 as ProtoJSON reads it: a number or a decimal
/// string.
pub fn int64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_in_pieces() {
        let mut wire = envelope(0, br#"{"a":1}"#).to_vec();
        wire.extend_from_slice(&end_of_stream(None));
        let mut d = Decoder::default();
        for b in &wire[..wire.len() - 1] {
            d.push(std::slice::from_ref(b));
        }
        assert_eq!(
            d.next_envelope().unwrap(),
            Some((0, br#"{"a":1}"#.to_vec()))
        );
        assert_eq!(d.next_envelope().unwrap(), None);
        assert_eq!(d.finish(), Err(EnvelopeError::Truncated));
        d.push(&wire[wire.len() - 1..]);
        assert_eq!(d.next_envelope().unwrap(), Some((FLAG_END, b"{}".to_vec())));
        assert!(d.finish().is_ok());
    }

    #[test]
    fn oversized_and_compressed_envelopes_are_refused() {
        let mut d = Decoder::default();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_envelope(), Err(EnvelopeError::TooLarge(_))));
        let mut d = Decoder::default();
        d.push(&envelope(FLAG_COMPRESSED, b"x"));
        assert_eq!(d.next_envelope(), Err(EnvelopeError::Compressed));
    }

    #[test]
    fn end_of_stream_carries_the_error() {
        let e = RpcError::new(Code::NotFound, "no such process");
        let b = end_of_stream(Some(&e));
        assert_eq!(b[0], FLAG_END);
        let v: Value = serde_json::from_slice(&b[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no such process");
        let n = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
        assert_eq!(n, b.len() - 5);
    }

    #[test]
    fn single_message_takes_the_first_envelope() {
        let body = envelope(0, br#"{"process":{"cmd":"/bin/bash"}}"#);
        assert_eq!(
            single_message(&body).unwrap()["process"]["cmd"],
            "/bin/bash"
        );
        assert!(single_message(b"").is_err());
        assert!(single_message(&end_of_stream(None)).is_err());
        assert!(single_message(&envelope(0, b"[1]")).is_err());
        assert_eq!(single_message(&envelope(0, b"")).unwrap(), json!({}));
    }

    #[test]
    fn timeouts_and_keepalives_are_parsed_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h).unwrap(), None);
        h.insert("connect-timeout-ms", "60000".parse().unwrap());
        assert_eq!(timeout(&h).unwrap(), Some(Duration::from_secs(60)));
        h.insert("connect-timeout-ms", "-1".parse().unwrap());
        assert!(timeout(&h).is_err());
        h.insert("connect-timeout-ms", "12345678901".parse().unwrap());
        assert!(timeout(&h).is_err());
        assert_eq!(keepalive(&h), Duration::from_secs(90));
        h.insert("keepalive-ping-interval", "50".parse().unwrap());
        assert_eq!(keepalive(&h), Duration::from_secs(50));
        h.insert("keepalive-ping-interval", "0".parse().unwrap());
        assert_eq!(keepalive(&h), Duration::from_secs(1));
    }

    #[test]
    fn api_errors_map_to_the_codes_the_sdk_tells_apart() {
        use agent_client::ClientError as C;
        let remote = |errno| {
            ApiError::Agent(C::Remote {
                code: agent_proto::ErrorCode::Io,
                errno,
                message: "x".into(),
            })
        };
        assert_eq!(RpcError::from(remote(libc::ENOENT)).code, Code::NotFound);
        assert_eq!(
            RpcError::from(remote(libc::EEXIST)).code,
            Code::AlreadyExists
        );
        assert_eq!(
            RpcError::from(remote(libc::EACCES)).code,
            Code::PermissionDenied
        );
        assert_eq!(
            RpcError::from(ApiError::Timeout("t".into())).code,
            Code::DeadlineExceeded
        );
        assert_eq!(
            RpcError::from(ApiError::BadRequest("b".into())).code,
            Code::InvalidArgument
        );
        assert_eq!(Code::NotFound.http_status(), StatusCode::NOT_FOUND);
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
    }

    #[test]
    fn int64_reads_numbers_and_strings() {
        assert_eq!(int64(&json!(5)), Some(5));
        assert_eq!(int64(&json!("7")), Some(7));
        assert_eq!(int64(&json!("x")), None);
        assert_eq!(int64(&json!(null)), None);
    }
}
