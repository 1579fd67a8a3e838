//! The on-disk container: `MAGIC`, format version, body length, CRC32 of
//! the body, body (bincode).

use serde::{de::DeserializeOwned, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// File magic.
pub const MAGIC: [u8; 8] = *b"SHOALSNP";
/// Current format version; bump on any incompatible state change.
/// 1: first format. 2: virtio-pmem device states (`SnapshotState::pmem`).
pub const FORMAT_VERSION: u32 = 2;
/// Largest state body accepted (guest memory is stored separately).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
const HEADER_LEN: usize = 8 + 4 + 8 + 4;
/// Body buffer reserved before reading (it grows as bytes arrive).
const INITIAL_BODY_CAPACITY: u64 = 1 << 20;

/// Errors reading or writing snapshot state.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// I/O on the state file.
    #[error("snapshot state {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not a Shoal snapshot.
    #[error("{0} is not a Shoal snapshot (bad magic)")]
    BadMagic(PathBuf),
    /// Written by an incompatible version.
    #[error("{path} has snapshot format version {found}; this build reads version {FORMAT_VERSION} only")]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
    },
    /// Declared body larger than the cap.
    #[error("{path}: state body of {len} bytes exceeds the {MAX_STATE_BYTES}-byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Declared length.
        len: u64,
    },
    /// Fewer bytes than declared.
    #[error("{0}: truncated snapshot state")]
    Truncated(PathBuf),
    /// Body does not match its checksum.
    #[error("{0}: snapshot state is corrupted (checksum mismatch)")]
    Checksum(PathBuf),
    /// Body does not decode.
    #[error("{path}: cannot decode snapshot state: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        source: bincode::Error,
    },
    /// State does not encode.
    #[error("cannot encode snapshot state: {0}")]
    Encode(bincode::Error),
}

/// Writes `state` in the container format to `w`.
pub fn write_to<T: Serialize, W: Write>(w: &mut W, state: &T) -> Result<(), std::io::Error> {
    let body = bincode::serialize(state).map_err(std::io::Error::other)?;
    let mut hdr = Vec::with_capacity(HEADER_LEN);
    hdr.extend_from_slice(&MAGIC);
    hdr.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    hdr.extend_from_slice(&(body.len() as u64).to_le_bytes());
    hdr.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    w.write_all(&hdr)?;
    w.write_all(&body)
}

/// Reads a container from `r`; `path` names it in errors.
pub fn read_from<T: DeserializeOwned, R: Read>(r: &mut R, path: &Path) -> Result<T, SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.into(),
        source,
    };
    let mut hdr = [0u8; HEADER_LEN];
    read_full(r, &mut hdr)
        .map_err(io)?
        .then_some(())
        .ok_or_else(|| SnapshotError::Truncated(path.into()))?;
    if hdr[..8] != MAGIC {
        return Err(SnapshotError::BadMagic(path.into()));
    }
    let field = |a: usize, b: usize| hdr[a..b].to_vec();
    let version = u32::from_le_bytes(field(8, 12).try_into().unwrap_or_default());
    if version != FORMAT_VERSION {
        return Err(SnapshotError::Version {
            path: path.into(),
            found: version,
        });
    }
    let len = u64::from_le_bytes(field(12, 20).try_into().unwrap_or_default());
    if len > MAX_STATE_BYTES {
        return Err(SnapshotError::TooLarge {
            path: path.into(),
            len,
        });
    }
    let crc = u32::from_le_bytes(field(20, 24).try_into().unwrap_or_default());
    // Memory grows with the bytes actually read, not with the declared
    // length: a short file that claims a large body is reported truncated
    // without first allocating what it claimed.
    let mut body = Vec::with_capacity(usize::try_from(len.min(INITIAL_BODY_CAPACITY)).unwrap_or(0));
    r.take(len).read_to_end(&mut body).map_err(io)?;
    if (body.len() as u64) < len {
        return Err(SnapshotError::Truncated(path.into()));
    }
    if crc32fast::hash(&body) != crc {
        return Err(SnapshotError::Checksum(path.into()));
    }
    bincode::options()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(MAX_STATE_BYTES)
        .deserialize(&body)
        .map_err(|source| SnapshotError::Decode {
            path: path.into(),
            source,
        })
}

use bincode::Options;

/// Reads exactly `buf.len()` bytes; `Ok(false)` on early end of file.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => return Ok(false),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes `state` to `path` atomically (temporary file, fsync, rename).
pub fn save<T: Serialize>(path: &Path, state: &T) -> Result<(), SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.into(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    write_to(&mut f, state).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reads the state at `path`.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, SnapshotError> {
    let mut f = std::fs::File::open(path).map_err(|source| SnapshotError::Io {
        path: path.into(),
        source,
    })?;
    read_from(&mut f, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct S {
        a: u64,
        b: Vec<u8>,
        c: String,
    }

    fn sample() -> S {
        S {
            a: 7,
            b: vec![1, 2, 3],
            c: "x".into(),
        }
    }

    fn bytes() -> Vec<u8> {
        let mut v = vec![];
        write_to(&mut v, &sample()).unwrap();
        v
    }

    fn read(b: &[u8]) -> Result<S, SnapshotError> {
        read_from(&mut &b[..], Path::new("t"))
    }

    #[test]
    fn round_trip_and_file() {
        assert_eq!(read(&bytes()).unwrap(), sample());
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state");
        save(&p, &sample()).unwrap();
        assert_eq!(load::<S>(&p).unwrap(), sample());
        assert!(!p.with_extension("tmp").exists());
    }

    #[test]
    fn refuses_bad_input() {
        let good = bytes();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(read(&b), Err(SnapshotError::BadMagic(_))));
        let mut b = good.clone();
        b[8] = 99;
        let e = read(&b).unwrap_err();
        assert!(matches!(e, SnapshotError::Version { found: 99, .. }));
        assert!(e.to_string().contains("version 99"));
        let mut b = good.clone();
        b[12..20].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(read(&b), Err(SnapshotError::TooLarge { .. })));
        assert!(matches!(
            read(&good[..good.len() - 1]),
            Err(SnapshotError::Truncated(_))
        ));
        assert!(matches!(
            read(&good[..10]),
            Err(SnapshotError::Truncated(_))
        ));
        let mut b = good.clone();
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(read(&b), Err(SnapshotError::Checksum(_))));
        // A body that passes the checksum but is not the expected type.
        let mut other = vec![];
        write_to(&mut other, &1u8).unwrap();
        assert!(matches!(read(&other), Err(SnapshotError::Decode { .. })));
        assert!(matches!(
            load::<S>(Path::new("/nonexistent/state")),
            Err(SnapshotError::Io { .. })
        ));
    }
}
