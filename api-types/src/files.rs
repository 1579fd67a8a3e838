//! Files in a sandbox: `PUT|GET|DELETE /v1/sandboxes/{id}/files` (raw
//! bodies, streamed), `GET .../files/stat` ([`FileStat`]) and
//! `GET .../files/list` ([`DirEntry`]s). Every route takes the absolute
//! guest path as `?path=`.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// A file's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (device, socket, fifo).
    Other,
}

impl FileType {
    /// Name as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FileType::File => "file",
            FileType::Dir => "dir",
            FileType::Symlink => "symlink",
            FileType::Other => "other",
        }
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /v1/sandboxes/{id}/files/stat`: a file's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileStat {
    /// Its type.
    pub r#type: FileType,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i64,
}

/// One entry of `GET /v1/sandboxes/{id}/files/list` (sorted by name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DirEntry {
    /// Name (non-UTF-8 bytes replaced).
    pub name: String,
    /// Type.
    pub r#type: FileType,
}

/// `PUT /v1/sandboxes/{id}/files` answers with the bytes written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Uploaded {
    /// Bytes written.
    pub bytes: u64,
}

/// `?path=` of download, stat and list.
#[derive(Debug, Clone, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Absolute guest path.
    pub path: String,
}

impl FileQuery {
    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([("path", Some(self.path.clone()))])
    }
}

/// Query of `PUT /v1/sandboxes/{id}/files` (the body is the file's bytes).
#[derive(Debug, Clone, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadQuery {
    /// Absolute guest path.
    pub path: String,
    /// Permission bits, octal (default 644).
    #[param(value_type = Option<String>, example = "755")]
    pub mode: Option<u32>,
    /// Append instead of truncating.
    pub append: Option<bool>,
    /// Create missing parent directories.
    pub parents: Option<bool>,
}

impl UploadQuery {
    /// A plain upload to `path` (mode 644, truncating).
    pub fn new(path: impl Into<String>) -> UploadQuery {
        UploadQuery {
            path: path.into(),
            mode: None,
            append: None,
            parents: None,
        }
    }

    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([
            ("path", Some(self.path.clone())),
            ("mode", self.mode.map(|m| format!("{m:o}"))),
            ("append", self.append.map(|b| b.to_string())),
            ("parents", self.parents.map(|b| b.to_string())),
        ])
    }
}

/// Query of `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MkdirQuery {
    /// Absolute guest path of the new directory.
    pub path: String,
    /// Create missing parents too, and succeed if it exists (`mkdir -p`).
    pub parents: Option<bool>,
    /// Permission bits, octal (default 755).
    #[param(value_type = Option<String>, example = "755")]
    pub mode: Option<u32>,
}

impl MkdirQuery {
    /// A plain mkdir of `path` (mode 755, no parents).
    pub fn new(path: impl Into<String>) -> MkdirQuery {
        MkdirQuery {
            path: path.into(),
            parents: None,
            mode: None,
        }
    }

    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([
            ("path", Some(self.path.clone())),
            ("parents", self.parents.map(|b| b.to_string())),
            ("mode", self.mode.map(|m| format!("{m:o}"))),
        ])
    }
}

/// `POST /v1/sandboxes/{id}/files/rename`: rename(2) within the sandbox
/// (replaces an existing `to` as rename(2) does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Absolute guest path of what is renamed.
    pub from: String,
    /// Absolute guest path it gets.
    pub to: String,
}

/// Query of `DELETE /v1/sandboxes/{id}/files`.
#[derive(Debug, Clone, PartialEq, Eq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RemoveQuery {
    /// Absolute guest path.
    pub path: String,
    /// Remove a directory tree.
    pub recursive: Option<bool>,
}

impl RemoveQuery {
    /// The query string.
    pub fn to_query(&self) -> String {
        crate::query_string([
            ("path", Some(self.path.clone())),
            ("recursive", self.recursive.map(|b| b.to_string())),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format() {
        let s = FileStat {
            r#type: FileType::Symlink,
            mode: 0o644,
            size: 3,
            mtime_ns: -1,
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"type":"symlink","mode":420,"size":3,"mtime_ns":-1}"#
        );
        for t in [
            FileType::File,
            FileType::Dir,
            FileType::Symlink,
            FileType::Other,
        ] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        let e: DirEntry = serde_json::from_str(r#"{"name":"a","type":"dir"}"#).unwrap();
        assert_eq!(e.r#type, FileType::Dir);
    }

    #[test]
    fn queries() {
        let mut u = UploadQuery::new("/tmp/a b");
        assert_eq!(u.to_query(), "?path=/tmp/a%20b");
        u.mode = Some(0o755);
        u.parents = Some(true);
        assert_eq!(u.to_query(), "?path=/tmp/a%20b&mode=755&parents=true");
        let r = RemoveQuery {
            path: "/x".into(),
            recursive: Some(true),
        };
        assert_eq!(r.to_query(), "?path=/x&recursive=true");
    }
}
