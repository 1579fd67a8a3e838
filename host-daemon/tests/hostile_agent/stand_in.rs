//! An agent stand-in that speaks the real protocol (`agent-proto`) as a
//! hostile guest would. It answers the handshake, `Health`, `Version` and
//! `PostRestore` honestly (so the daemon takes it for a working guest),
//! then misbehaves as [`Behaviour`] says when attacked. It listens on a
//! plain Unix socket, or as a VMM's hybrid vsock socket (`CONNECT <port>`
//! first, answered `OK <n>` unless it ignores CONNECT).
//!
//! It runs on one thread (a current-thread tokio runtime), however many
//! connections and floods it serves, so the test process's thread count
//! measures the daemon's.

use agent_client::Transport;
use agent_proto::{
    put_data, put_empty, put_message, AgentMode, DirEntries, DirEntry, ExecResult, ExecStarted,
    ExitStatus, FileDone, FileStat, FileType, FrameDecoder, HealthReply, HelloOk, Kind,
    PostRestoreReply, RawFrame, VersionReply, HEADER_LEN, MAX_PAYLOAD, PROTOCOL_VERSION,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};

/// How the stand-in answers requests (the handshake, health, version and
/// post-restore are always answered honestly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// As a real agent would (small fixed answers).
    Honest,
    /// A listing: `DirEntries` parts of ~1 MiB that never say `last`.
    ListNoLast,
    /// An exec: `ExecStarted`, then silence; every later request on the
    /// connection (signals included) is ignored too.
    SilentAfterStarted,
    /// An exec: `ExecStarted`, then 1 MiB `Stdout` frames without end.
    StdoutFlood,
    /// A download: `FileChunk` frames without end, never `FileDone`.
    DownloadNoEnd,
    /// A download: `Stat` answered, the `FileRead` never.
    DownloadSilent,
    /// `PostRestore` (the first call after a restore) never answered.
    IgnorePostRestore,
    /// Any request: floods of 1 MiB frames for request ids nobody asked
    /// for, and no answer.
    FloodOtherIds,
    /// Any request: the right answer, under another request id.
    WrongIds,
    /// Any request: a frame header announcing more than `MAX_PAYLOAD`.
    HugeFrame,
    /// Any request: a reply of the right kind whose payload does not
    /// decode.
    BadPayload,
    /// Hybrid vsock only: reads `CONNECT <port>` and never answers (the
    /// socket stays open until the daemon closes it).
    IgnoreConnect,
}

/// What the stand-in saw.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: AtomicUsize,
    /// Connections open now (closed once the daemon closes its end).
    pub open: AtomicUsize,
    /// Requests received (frames after the Hello).
    pub requests: AtomicUsize,
    /// `Exec` requests received.
    pub execs: AtomicUsize,
    /// Bytes written to the daemon.
    pub sent: AtomicU64,
}

struct Shared {
    behaviour: Mutex<Behaviour>,
    stats: Stats,
    /// Bytes any one flood sends at most (then it goes silent), so that a
    /// daemon that does not bound what it holds is caught without taking
    /// the machine down.
    flood_budget: u64,
}

impl Shared {
    fn behaviour(&self) -> Behaviour {
        *self.behaviour.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running stand-in; dropping it stops it and closes every connection.
pub struct StandIn {
    shared: Arc<Shared>,
    socket: PathBuf,
    hybrid: bool,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The guest port the daemon asks a hybrid vsock socket for.
const PORT: u32 = agent_proto::VSOCK_PORT;

impl StandIn {
    /// Listens at `socket` (as a hybrid vsock socket with `hybrid`), with
    /// `behaviour`; a flood sends at most `flood_budget` bytes.
    pub fn start(socket: &Path, hybrid: bool, behaviour: Behaviour, flood_budget: u64) -> StandIn {
        let _ = std::fs::remove_file(socket);
        let shared = Arc::new(Shared {
            behaviour: Mutex::new(behaviour),
            stats: Stats::default(),
            flood_budget,
        });
        let std_listener = std::os::unix::net::UnixListener::bind(socket)
            .unwrap_or_else(|e| panic!("bind {}: {e}", socket.display()));
        std_listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("hostile-agent".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = UnixListener::from_std(std_listener).unwrap();
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept_loop(listener, sh, hybrid) => {}
                    }
                });
                // Dropping the runtime drops every connection's task.
            })
            .unwrap();
        StandIn {
            shared,
            socket: socket.into(),
            hybrid,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Changes how later requests are answered.
    pub fn set(&self, b: Behaviour) {
        *self
            .shared
            .behaviour
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = b;
    }

    /// What it saw.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.shared.stats.open.load(Ordering::Acquire)
    }

    /// How the daemon reaches it.
    pub fn transport(&self) -> Transport {
        if self.hybrid {
            Transport::HybridVsock {
                uds: self.socket.clone(),
                port: PORT,
            }
        } else {
            Transport::Unix(self.socket.clone())
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

async fn accept_loop(listener: UnixListener, sh: Arc<Shared>, hybrid: bool) {
    loop {
        let Ok((s, _)) = listener.accept().await else {
            continue;
        };
        sh.stats.accepted.fetch_add(1, Ordering::AcqRel);
        sh.stats.open.fetch_add(1, Ordering::AcqRel);
        let sh = sh.clone();
        tokio::spawn(async move {
            serve(s, &sh, hybrid).await;
            sh.stats.open.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

async fn write(w: &Writer, sh: &Shared, bytes: &[u8]) -> bool {
    let ok = w.lock().await.write_all(bytes).await.is_ok();
    if ok {
        sh.stats
            .sent
            .fetch_add(bytes.len() as u64, Ordering::AcqRel);
    }
    ok
}

async fn serve(s: UnixStream, sh: &Arc<Shared>, hybrid: bool) {
    let (rd, wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    let w: Writer = Arc::new(tokio::sync::Mutex::new(wr));
    if hybrid {
        let mut line = String::new();
        if rd.read_line(&mut line).await.unwrap_or(0) == 0 || !line.starts_with("CONNECT ") {
            return;
        }
        if sh.behaviour() == Behaviour::IgnoreConnect {
            // Hold the socket, answer nothing, until the daemon closes it.
            let mut sink = [0u8; 4096];
            while rd.read(&mut sink).await.is_ok_and(|n| n > 0) {}
            return;
        }
        if !write(&w, sh, format!("OK {}\n", 1u32 << 30).as_bytes()).await {
            return;
        }
    }
    let mut dec = FrameDecoder::new();
    let mut greeted = false;
    let mut silenced = false;
    loop {
        loop {
            match dec.next_frame() {
                Ok(Some(f)) => {
                    if !greeted {
                        greeted = true;
                        let ok = HelloOk {
                            version: PROTOCOL_VERSION,
                            agent: "hostile-stand-in".into(),
                            mode: AgentMode::Guest,
                        };
                        if !write(&w, sh, &msg(0, &ok)).await {
                            return;
                        }
                        continue;
                    }
                    sh.stats.requests.fetch_add(1, Ordering::AcqRel);
                    if f.header.kind == Kind::Exec as u8 {
                        sh.stats.execs.fetch_add(1, Ordering::AcqRel);
                    }
                    if !silenced {
                        silenced = answer(f, sh, &w).await;
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        match rd.read(dec.spare(256 << 10)).await {
            Ok(0) | Err(_) => return,
            Ok(n) => dec.commit(n),
        }
    }
}

fn msg<M: agent_proto::Message>(id: u32, m: &M) -> Vec<u8> {
    let mut v = Vec::new();
    put_message(&mut v, id, m);
    v
}

fn honest_stat() -> FileStat {
    FileStat {
        file_type: FileType::File,
        mode: 0o644,
        size: 1 << 20,
        uid: 0,
        gid: 0,
        mtime_ns: 0,
        nlink: 1,
        ino: 7,
    }
}

/// Answers one request; true once the connection is to be ignored.
async fn answer(f: RawFrame, sh: &Arc<Shared>, w: &Writer) -> bool {
    let id = f.header.id;
    let Some(kind) = Kind::from_u8(f.header.kind) else {
        return false;
    };
    // Always honest: what makes the daemon take this for a working guest.
    let honest_system = match kind {
        Kind::Health => Some(msg(
            id,
            &HealthReply {
                running_execs: 0,
                execs: 0,
                connections: 1,
                mode: AgentMode::Guest,
            },
        )),
        Kind::Version => Some(msg(
            id,
            &VersionReply {
                protocol: PROTOCOL_VERSION,
                agent: "hostile-stand-in".into(),
                mode: AgentMode::Guest,
            },
        )),
        Kind::PostRestore if sh.behaviour() == Behaviour::IgnorePostRestore => return false,
        Kind::PostRestore => Some(msg(
            id,
            &PostRestoreReply {
                entropy_credited: true,
                clock_set: true,
            },
        )),
        // Stream frames of requests already answered: nothing to say.
        Kind::Stdin | Kind::StdinClose | Kind::FileData | Kind::FileEnd => return false,
        _ => None,
    };
    if let Some(reply) = honest_system {
        write(w, sh, &reply).await;
        return false;
    }
    let b = sh.behaviour();
    match (b, kind) {
        (Behaviour::ListNoLast, Kind::ListDir) => {
            spawn_flood(sh, w, move |_| {
                let entries = (0..250u64)
                    .map(|i| DirEntry {
                        name: format!("{i:04}-{}", "x".repeat(4000)).into_bytes(),
                        file_type: FileType::File,
                        ino: i + 1,
                    })
                    .collect();
                msg(
                    id,
                    &DirEntries {
                        entries,
                        last: false,
                    },
                )
            });
            false
        }
        (Behaviour::SilentAfterStarted, Kind::Exec) => {
            write(w, sh, &msg(id, &started(id))).await;
            true
        }
        (Behaviour::StdoutFlood, Kind::Exec) => {
            write(w, sh, &msg(id, &started(id))).await;
            spawn_flood(sh, w, move |_| data(Kind::Stdout, id, MAX_PAYLOAD));
            false
        }
        (Behaviour::DownloadNoEnd, Kind::FileRead) => {
            spawn_flood(sh, w, move |_| data(Kind::FileChunk, id, MAX_PAYLOAD));
            false
        }
        (Behaviour::DownloadSilent, Kind::FileRead) => false,
        (Behaviour::DownloadNoEnd | Behaviour::DownloadSilent, Kind::Stat) => {
            write(w, sh, &msg(id, &honest_stat())).await;
            false
        }
        (Behaviour::FloodOtherIds, _) => {
            spawn_flood(sh, w, move |n| {
                let other = id.wrapping_add(100_000 + u32::try_from(n % 4096).unwrap_or(0));
                data(Kind::Stdout, other, MAX_PAYLOAD)
            });
            false
        }
        (Behaviour::WrongIds, _) => {
            if let Some(r) = honest(kind, id.wrapping_add(7777)) {
                write(w, sh, &r).await;
            }
            false
        }
        (Behaviour::HugeFrame, _) => {
            let len = u32::try_from(MAX_PAYLOAD + 1).unwrap_or(u32::MAX);
            let mut v = Vec::with_capacity(HEADER_LEN);
            v.extend_from_slice(&len.to_le_bytes());
            v.push(reply_kind(kind) as u8);
            v.extend_from_slice(&id.to_le_bytes());
            write(w, sh, &v).await;
            false
        }
        (Behaviour::BadPayload, _) => {
            let mut v = Vec::new();
            put_data(&mut v, reply_kind(kind), id, &[0xff; 3]);
            write(w, sh, &v).await;
            false
        }
        _ => {
            if let Some(r) = honest(kind, id) {
                write(w, sh, &r).await;
            }
            false
        }
    }
}

fn started(id: u32) -> ExecStarted {
    ExecStarted {
        exec_id: u64::from(id),
        pid: 4242,
    }
}

fn data(kind: Kind, id: u32, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_LEN + n);
    put_data(&mut v, kind, id, &vec![b'y'; n]);
    v
}

/// The kind an honest agent would answer `kind` with.
fn reply_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Stat => Kind::StatOk,
        Kind::ListDir => Kind::DirEntries,
        Kind::Exec | Kind::Attach => Kind::ExecStarted,
        Kind::FileRead => Kind::FileChunk,
        _ => Kind::Ok,
    }
}

/// An honest answer to `kind` under `id`.
fn honest(kind: Kind, id: u32) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    match kind {
        Kind::Stat => put_message(&mut v, id, &honest_stat()),
        Kind::ListDir => put_message(
            &mut v,
            id,
            &DirEntries {
                entries: vec![DirEntry {
                    name: b"a".to_vec(),
                    file_type: FileType::File,
                    ino: 1,
                }],
                last: true,
            },
        ),
        Kind::Exec => {
            put_message(&mut v, id, &started(id));
            put_data(&mut v, Kind::Stdout, id, b"hi\n");
            put_message(
                &mut v,
                id,
                &ExecResult {
                    status: ExitStatus::Exited(0),
                    timed_out: false,
                    dropped_bytes: 0,
                },
            );
        }
        Kind::FileRead => {
            put_data(&mut v, Kind::FileChunk, id, &[b'z'; 1 << 20]);
            put_message(&mut v, id, &FileDone { bytes: 1 << 20 });
        }
        Kind::Signal | Kind::Mkdir | Kind::Remove | Kind::Rename | Kind::Chmod => {
            put_empty(&mut v, Kind::Ok, id)
        }
        _ => return None,
    }
    Some(v)
}

/// Writes `frame(n)` for n = 0, 1, ... until the budget is spent or the
/// daemon closes the connection.
fn spawn_flood(sh: &Arc<Shared>, w: &Writer, frame: impl Fn(u64) -> Vec<u8> + Send + 'static) {
    let (sh, w) = (sh.clone(), w.clone());
    tokio::spawn(async move {
        let mut sent = 0u64;
        let mut n = 0u64;
        while sent < sh.flood_budget {
            let f = frame(n);
            n += 1;
            sent += f.len() as u64;
            if !write(&w, &sh, &f).await {
                return;
            }
        }
    });
}
