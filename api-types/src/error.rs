//! The error body every failed request gets: `{"error":{"code","message"}}`
//! with a 4xx/5xx status that follows from the code.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Machine-readable error codes; each has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed or invalid.
    BadRequest,
    /// 401: missing or wrong bearer token (TCP only).
    Unauthorized,
    /// 403: the caller may not do this (a template it does not own, a
    /// name reserved for the daemon).
    Forbidden,
    /// 404: no such sandbox, template, file or route.
    NotFound,
    /// 409: not possible in the current state.
    Conflict,
    /// 413: the request body is larger than the route takes.
    PayloadTooLarge,
    /// 429: admission quota full; retry after removing sandboxes
    /// (`Retry-After`).
    HostFull,
    /// 503: the host is short of memory (`Retry-After`).
    HostMemoryLow,
    /// 429: the sandbox has as many agent calls in flight as it may
    /// (`Retry-After`); more are refused, never queued.
    SandboxBusy,
    /// 502: the sandbox (its VMM or agent) failed.
    SandboxError,
    /// 504: a deadline passed.
    DeadlineExceeded,
    /// 500: the daemon failed.
    Internal,
    /// 507: the sandbox's file system is full (ENOSPC, EDQUOT): its upper
    /// layer (or /tmp) reached its cap.
    InsufficientStorage,
    /// 503: the sandbox asked for a network and the host cannot give one
    /// now (networking off or unsupported here, no slot free).
    NetworkUnavailable,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::BadRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::HostFull,
        ErrorCode::HostMemoryLow,
        ErrorCode::SandboxBusy,
        ErrorCode::SandboxError,
        ErrorCode::DeadlineExceeded,
        ErrorCode::Internal,
        ErrorCode::InsufficientStorage,
        ErrorCode::NetworkUnavailable,
    ];

    /// The HTTP status answered with this code.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::HostFull => 429,
            ErrorCode::HostMemoryLow => 503,
            ErrorCode::SandboxBusy => 429,
            ErrorCode::SandboxError => 502,
            ErrorCode::DeadlineExceeded => 504,
            ErrorCode::Internal => 500,
            ErrorCode::InsufficientStorage => 507,
            ErrorCode::NetworkUnavailable => 503,
        }
    }

    /// The code as on the wire (`bad_request`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::HostFull => "host_full",
            ErrorCode::HostMemoryLow => "host_memory_low",
            ErrorCode::SandboxBusy => "sandbox_busy",
            ErrorCode::SandboxError => "sandbox_error",
            ErrorCode::DeadlineExceeded => "deadline_exceeded",
            ErrorCode::Internal => "internal",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::NetworkUnavailable => "network_unavailable",
        }
    }

    /// Whether the same request may succeed later (429, 503): the daemon
    /// sends `Retry-After` with these.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::HostFull
                | ErrorCode::HostMemoryLow
                | ErrorCode::SandboxBusy
                | ErrorCode::NetworkUnavailable
        )
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// Code and message of an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// For people.
    pub message: String,
}

impl ErrorBody {
    /// An error body.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code,
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_and_statuses() {
        for c in ErrorCode::ALL {
            let v = serde_json::to_value(c).unwrap();
            assert_eq!(v, c.as_str());
            assert_eq!(serde_json::from_value::<ErrorCode>(v).unwrap(), c);
            assert_eq!(c.retryable(), c.status() == 429 || c.status() == 503);
        }
        let b = ErrorBody::new(ErrorCode::HostFull, "full");
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"error":{"code":"host_full","message":"full"}}"#
        );
    }
}
