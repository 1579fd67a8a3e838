//! Execs: spawning, their pipes, output to attached or detached clients,
//! exits, timers, signals, attach and stdin.

use super::*;

impl Server {
    // ------------------------------------------------------------------ exec

    /// Starts `req`; on a new terminal of `pty` (cols, rows) when given:
    /// the terminal is its stdin, stdout and stderr, its output comes as
    /// stdout, and `Stdin` frames are typed into it.
    pub(super) fn start_exec(
        &mut self,
        cid: u32,
        id: u32,
        req: ExecRequest,
        pty: Option<(u16, u16)>,
    ) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        if self.execs.len() >= MAX_EXECS {
            // Make room by forgetting the oldest finished exec nobody wants.
            if let Some(old) = self.retained.pop_front() {
                self.execs.remove(&old);
            } else {
                let msg = format!("at most {MAX_EXECS} execs at once");
                self.reply_err(cid, id, ErrorCode::Busy, 0, msg);
                return;
            }
        }
        let prep = match self.prepare(&req) {
            Ok(p) => p,
            Err(msg) => {
                self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
                return;
            }
        };
        let fds = match pty {
            Some((cols, rows)) => pty_fds(cols, rows),
            None => pipe_fds(req.stdin),
        };
        let (out_r, out_w, err_r, err_w, ins) = match fds {
            Ok(f) => f,
            Err((what, e)) => return self.reply_errno(cid, id, what, e),
        };
        let (in_r, in_w) = if let Some(ins) = ins {
            ins
        } else if req.stdin {
            match os::pipe() {
                Ok((r, w)) => (Some(r), Some(w)),
                Err(e) => return self.reply_errno(cid, id, "pipe", e),
            }
        } else {
            (None, None)
        };
        let exec_id = self.next_exec;
        self.next_exec += 1;
        let guest = self.mode == AgentMode::Guest;
        let cgroup = if guest {
            self.guest.exec_cgroup(exec_id)
        } else {
            None
        };
        let spec = launch::SpawnSpec {
            paths: &prep.paths,
            argv: &prep.argv,
            envp: prep
                .env
                .as_ref()
                .map_or(&self.base_env_ptrs, |(_, ptrs)| ptrs),
            cwd: prep.cwd.as_deref(),
            user: req.user.map(|u| (u.uid, u.gid)),
            stdio: [
                in_r.as_ref().unwrap_or(&self.devnull).as_raw_fd(),
                out_w.as_raw_fd(),
                err_w.as_raw_fd(),
            ],
            cgroup: cgroup.as_ref(),
            reset_oom: guest,
            drop_ptrace: guest,
            ctty: pty.is_some(),
        };
        let spawned = launch::spawn(&spec);
        drop((out_w, err_w, in_r));
        let spawned = match spawned {
            Ok(s) => s,
            Err((stage, e)) => {
                if let Some((dir, _)) = cgroup {
                    self.stale_cgroups.push(dir);
                }
                let argv0 = prep
                    .argv
                    .first()
                    .map(|a| a.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let msg = format!("{} {argv0}: {}", stage.what(), e.text());
                self.reply_err(cid, id, ErrorCode::SpawnFailed, e.0, msg);
                return;
            }
        };
        if let Some(w) = &in_w {
            let _ = os::set_nonblocking(os::fd_ref(w));
        }
        let readable = libc::EPOLLIN as u32;
        let _ = self
            .ep
            .add(out_r.as_raw_fd(), readable, pipe_token(exec_id, 0));
        if let Some(e) = &err_r {
            let _ = self.ep.add(e.as_raw_fd(), readable, pipe_token(exec_id, 1));
        }
        // An absurd timeout (overflowing Instant) means no timeout.
        let deadline = (req.timeout_ms > 0)
            .then(|| Instant::now().checked_add(Duration::from_millis(req.timeout_ms)))
            .flatten();
        let cgroup = cgroup.filter(|_| spawned.in_cgroup).map(|(dir, _)| dir);
        self.execs.insert(
            exec_id,
            Exec {
                pid: spawned.pid,
                attached: Some((cid, id)),
                pipes: [Some(out_r), err_r],
                grown: [false; 2],
                paused: false,
                stdin: in_w,
                stdin_buf: Vec::new(),
                stdin_close: false,
                stdin_watch: false,
                stdin_blocking: None,
                pending: VecDeque::new(),
                pending_bytes: 0,
                dropped: 0,
                status: None,
                timed_out: false,
                deadline,
                kill_at: deadline,
                linger: None,
                cgroup,
                result: None,
            },
        );
        self.by_pid.insert(spawned.pid, exec_id);
        if let Some(c) = self.conns.get_mut(&cid) {
            c.execs.insert(id, exec_id);
        }
        let started = ExecStarted {
            exec_id,
            pid: spawned.pid,
        };
        self.reply(cid, id, &started);
    }

    /// Turns a request into what the child needs; Err is a message for
    /// InvalidArgument. The agent's base environment is used as it is
    /// unless the request changes it.
    fn prepare(&self, req: &ExecRequest) -> Result<Prepared, String> {
        let words: Vec<&[u8]> = match &req.command {
            Command::Argv(a) => a.iter().map(Vec::as_slice).collect(),
            Command::Shell(s) => vec![b"/bin/sh", b"-c", s.as_slice()],
        };
        let Some(&argv0) = words.first() else {
            return Err("empty argv".into());
        };
        let argv = words
            .iter()
            .map(|w| CString::new(*w).map_err(|_| "NUL byte in an argument".to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = None;
        if req.clear_env || !req.env.is_empty() {
            let mut e: Vec<(Vec<u8>, Vec<u8>)> = if req.clear_env {
                Vec::new()
            } else {
                self.base_env.clone()
            };
            for (k, v) in &req.env {
                if k.is_empty() || k.contains(&b'=') || k.contains(&0) || v.contains(&0) {
                    return Err(format!(
                        "invalid environment variable {:?}",
                        String::from_utf8_lossy(k)
                    ));
                }
                match e.iter_mut().find(|(ek, _)| ek == k) {
                    Some(slot) => slot.1.clone_from(v),
                    None => e.push((k.clone(), v.clone())),
                }
            }
            env = Some(e);
        }
        let path_var = env
            .as_ref()
            .unwrap_or(&self.base_env)
            .iter()
            .find(|(k, _)| k == b"PATH")
            .map_or(DEFAULT_PATH, |(_, v)| v.as_slice());
        let paths = launch::candidate_paths(argv0, path_var);
        let env = env.map(|e| {
            let c = env_cstrings(&e);
            let p = launch::pointers(&c);
            (c, p)
        });
        let cwd = match &req.cwd {
            Some(c) => Some(CString::new(c.as_slice()).map_err(|_| "NUL byte in cwd")?),
            None => None,
        };
        Ok(Prepared {
            paths,
            argv,
            env,
            cwd,
        })
    }

    pub(super) fn pipe_readable(&mut self, exec_id: u64, stream: usize, mask: u32) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = exec.pipes.get(stream).and_then(Option::as_ref) else {
            return;
        };
        // EPOLLHUP on a pipe: no writer is left. Without EPOLLIN nothing is
        // buffered either, so it is the end without a read(2) returning 0.
        let hup = mask & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0;
        if hup && mask & libc::EPOLLIN as u32 == 0 {
            if let Some(p) = exec.pipes.get_mut(stream) {
                *p = None;
            }
            self.check_done(exec_id);
            return;
        }
        let mut data = std::mem::take(&mut self.scratch);
        data.clear();
        match os::read_append(os::fd_ref(fd), &mut data, MAX_PAYLOAD, false) {
            Ok(0) => {
                if let Some(p) = exec.pipes.get_mut(stream) {
                    *p = None; // close: leaves the epoll set
                }
                self.scratch = data;
                self.check_done(exec_id);
                return;
            }
            Ok(n) => {
                if n >= 64 * 1024 && !exec.grown.get(stream).copied().unwrap_or(true) {
                    let _ = os::set_pipe_size(os::fd_ref(fd), PIPE_GROWN);
                    if let Some(g) = exec.grown.get_mut(stream) {
                        *g = true;
                    }
                }
            }
            Err(Errno(libc::EAGAIN | libc::EINTR)) => {
                self.scratch = data;
                return;
            }
            Err(_) => {
                if let Some(p) = exec.pipes.get_mut(stream) {
                    *p = None;
                }
                self.scratch = data;
                self.check_done(exec_id);
                return;
            }
        }
        let kind = if stream == 0 {
            Kind::Stdout
        } else {
            Kind::Stderr
        };
        self.emit(exec_id, kind, &data);
        // A short read after the last writer went away emptied the pipe.
        let ended = hup && data.len() < MAX_PAYLOAD;
        self.scratch = data;
        if ended {
            if let Some(p) = self
                .execs
                .get_mut(&exec_id)
                .and_then(|e| e.pipes.get_mut(stream))
            {
                *p = None;
            }
            self.check_done(exec_id);
        }
    }

    /// Routes output to the attached connection, or keeps it (bounded).
    pub(super) fn emit(&mut self, exec_id: u64, kind: Kind, data: &[u8]) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if let Some((cid, rid)) = exec.attached {
            if let Some(c) = self.conns.get_mut(&cid) {
                put_data(&mut c.out, kind, rid, data);
                let full = c.out_len() >= OUT_HIGH;
                self.mark_dirty(cid);
                if full {
                    self.pause(exec_id, cid);
                }
                return;
            }
        }
        exec.pending.push_back((kind, data.to_vec()));
        exec.pending_bytes += data.len();
        while exec.pending_bytes > DETACHED_OUTPUT_LIMIT {
            let Some((_, old)) = exec.pending.pop_front() else {
                break;
            };
            exec.pending_bytes -= old.len();
            exec.dropped += old.len() as u64;
        }
    }

    /// Stops reading an exec's pipes until its connection drains.
    pub(super) fn pause(&mut self, exec_id: u64, cid: u32) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if exec.paused {
            return;
        }
        // Removed rather than set to no events: EPOLLHUP is reported even
        // then, and would spin the loop once the command exits.
        for p in exec.pipes.iter().flatten() {
            let _ = self.ep.delete(p.as_raw_fd());
        }
        exec.paused = true;
        if let Some(c) = self.conns.get_mut(&cid) {
            c.paused_execs.push(exec_id);
        }
    }

    pub(super) fn resume(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        if !exec.paused {
            return;
        }
        for (i, p) in exec.pipes.iter().enumerate() {
            if let Some(p) = p {
                let token = pipe_token(exec_id, i as u64);
                let _ = self.ep.add(p.as_raw_fd(), libc::EPOLLIN as u32, token);
            }
        }
        exec.paused = false;
    }

    /// Finishes an exec once it has exited and its pipes are closed.
    pub(super) fn check_done(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(status) = exec.status else {
            return;
        };
        if exec.result.is_some() {
            return;
        }
        if exec.pipes.iter().any(Option::is_some) {
            if exec.linger.is_none() {
                exec.linger = Some(Instant::now() + LINGER);
            }
            return;
        }
        exec.linger = None;
        exec.deadline = None;
        exec.stdin = None;
        exec.stdin_buf = Vec::new();
        let result = ExecResult {
            status,
            timed_out: exec.timed_out,
            dropped_bytes: exec.dropped,
        };
        let kill_at = exec.kill_at.filter(|_| !exec.timed_out);
        if let Some(dir) = exec.cgroup.take() {
            if os::rmdir(&dir).is_err() {
                // Background processes are left: they die at the exec's
                // deadline (a backgrounded fork bomb must not outlive it).
                match kill_at {
                    Some(at) if self.doomed.len() < MAX_EXECS => self.doomed.push((at, dir)),
                    Some(_) => {
                        guest::kill_cgroup(&dir);
                        self.stale_cgroups.push(dir);
                    }
                    None => self.stale_cgroups.push(dir),
                }
            }
        }
        let blocking = exec.stdin_blocking.take();
        let attached = exec.attached;
        if let Some(bc) = blocking {
            self.unblock_conn(bc);
        }
        if let Some((cid, rid)) = attached {
            if self.conns.contains_key(&cid) {
                self.reply(cid, rid, &result);
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.execs.remove(&rid);
                }
                self.execs.remove(&exec_id);
                self.resume_listener();
                return;
            }
        }
        if let Some(exec) = self.execs.get_mut(&exec_id) {
            exec.attached = None;
            exec.result = Some(result);
        }
        self.retained.push_back(exec_id);
        while self.retained.len() > MAX_RETAINED {
            if let Some(old) = self.retained.pop_front() {
                self.execs.remove(&old);
            }
        }
        self.resume_listener();
    }

    pub(super) fn on_sigchld(&mut self) {
        let mut buf = [0u8; 128 * 4];
        let _ = os::read(os::fd_ref(&self.sigfd), &mut buf);
        while let Some((pid, status)) = os::reap_one() {
            let Some(exec_id) = self.by_pid.remove(&pid) else {
                continue; // an orphan (PID 1) or a failed spawn
            };
            let st = if libc::WIFSIGNALED(status) {
                ExitStatus::Signaled(libc::WTERMSIG(status))
            } else {
                ExitStatus::Exited(libc::WEXITSTATUS(status))
            };
            if let Some(exec) = self.execs.get_mut(&exec_id) {
                exec.status = Some(st);
                exec.deadline = None;
            }
            self.check_done(exec_id);
        }
        if !self.stale_cgroups.is_empty() {
            self.stale_cgroups
                .retain(|d| os::rmdir(d).is_err_and(|e| e.0 == libc::EBUSY));
        }
    }

    pub(super) fn check_timers(&mut self) {
        if self.doomed.is_empty()
            && !self
                .execs
                .values()
                .any(|e| e.deadline.is_some() || e.linger.is_some())
        {
            return;
        }
        let now = Instant::now();
        if self.doomed.iter().any(|(at, _)| *at <= now) {
            let (due, kept) = std::mem::take(&mut self.doomed)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            self.doomed = kept;
            for (_, dir) in due {
                guest::kill_cgroup(&dir);
                // Removed once the killed processes are reaped.
                self.stale_cgroups.push(dir);
            }
        }
        let mut done = Vec::new();
        let mut lingered = Vec::new();
        for (&id, exec) in &mut self.execs {
            if exec.deadline.is_some_and(|d| d <= now) {
                exec.deadline = None;
                exec.timed_out = true;
                // The command leads its own session and process group.
                let _ = os::kill(-exec.pid, libc::SIGKILL);
                if let Some(cg) = &exec.cgroup {
                    guest::kill_cgroup(cg);
                }
            }
            if exec.linger.is_some_and(|d| d <= now) {
                lingered.push(id);
            }
        }
        for id in lingered {
            // Whatever the pipes hold is the command's output, however long
            // ago its exit was seen (the loop may have been busy since,
            // e.g. spawning a burst of other commands): read it first.
            self.drain_pipes(id);
            let Some(exec) = self.execs.get_mut(&id) else {
                continue;
            };
            if exec.result.is_some() {
                continue;
            }
            if exec.paused {
                // Output is waiting for the client, not for a background
                // process: keep it.
                exec.linger = Some(now + LINGER);
            } else {
                exec.pipes = [None, None];
                done.push(id);
            }
        }
        for id in done {
            self.check_done(id);
        }
    }

    /// Reads what an exec's pipes hold now, without waiting (at most
    /// [`DRAIN_READS`] reads a pipe: a background process may keep
    /// writing), as their readiness events would.
    fn drain_pipes(&mut self, exec_id: u64) {
        for stream in 0..2 {
            for _ in 0..DRAIN_READS {
                let Some(exec) = self.execs.get(&exec_id) else {
                    return;
                };
                if exec.paused || exec.result.is_some() {
                    return;
                }
                let Some(fd) = exec.pipes.get(stream).and_then(Option::as_ref) else {
                    break;
                };
                let ready = os::ready_now(os::fd_ref(fd));
                let mut mask = 0;
                if ready & libc::POLLIN != 0 {
                    mask |= libc::EPOLLIN as u32;
                }
                if ready & (libc::POLLHUP | libc::POLLERR) != 0 {
                    mask |= libc::EPOLLHUP as u32;
                }
                if mask == 0 {
                    break;
                }
                self.pipe_readable(exec_id, stream, mask);
            }
        }
    }

    /// Sets a PTY exec's terminal size.
    pub(super) fn pty_resize(&mut self, cid: u32, id: u32, req: &PtyResize) {
        let fd = self
            .execs
            .get(&req.exec_id)
            .and_then(|e| e.pipes[0].as_ref())
            .map(|fd| os::set_winsize(os::fd_ref(fd), req.cols, req.rows));
        match fd {
            None => {
                let msg = format!("no running exec {}", req.exec_id);
                self.reply_err(cid, id, ErrorCode::NoSuchExec, 0, msg);
            }
            Some(r) => self.reply_result(cid, id, "TIOCSWINSZ", r),
        }
    }

    pub(super) fn signal(&mut self, cid: u32, id: u32, req: &SignalRequest) {
        if !(0..=64).contains(&req.signal) {
            let msg = format!("invalid signal {}", req.signal);
            return self.reply_err(cid, id, ErrorCode::InvalidArgument, 0, msg);
        }
        let target = match self.execs.get(&req.exec_id) {
            Some(e) if e.status.is_none() => {
                if req.group {
                    -e.pid
                } else {
                    e.pid
                }
            }
            _ => {
                let msg = format!("no running exec {}", req.exec_id);
                return self.reply_err(cid, id, ErrorCode::NoSuchExec, 0, msg);
            }
        };
        let r = os::kill(target, req.signal);
        self.reply_result(cid, id, "kill", r);
    }

    pub(super) fn attach(&mut self, cid: u32, id: u32, exec_id: u64) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            let msg = format!("no exec {exec_id}");
            return self.reply_err(cid, id, ErrorCode::NoSuchExec, 0, msg);
        };
        let previous = exec.attached.replace((cid, id));
        let pid = exec.pid;
        let pending = std::mem::take(&mut exec.pending);
        exec.pending_bytes = 0;
        let result = exec.result.take();
        let paused = exec.paused;
        if let Some((pc, pr)) = previous {
            if let Some(c) = self.conns.get_mut(&pc) {
                c.execs.remove(&pr);
            }
            let msg = format!("exec {exec_id} was attached by another connection");
            self.reply_err(pc, pr, ErrorCode::Detached, 0, msg);
        }
        self.reply(cid, id, &ExecStarted { exec_id, pid });
        if let Some(out) = self.out(cid) {
            for (kind, data) in &pending {
                put_data(out, *kind, id, data);
            }
        }
        if let Some(result) = result {
            self.reply(cid, id, &result);
            self.execs.remove(&exec_id);
            self.retained.retain(|&e| e != exec_id);
            return;
        }
        if let Some(c) = self.conns.get_mut(&cid) {
            c.execs.insert(id, exec_id);
        }
        if paused {
            self.resume(exec_id);
        }
    }

    pub(super) fn stdin_data(&mut self, cid: u32, id: u32, data: &[u8]) {
        let Some(&exec_id) = self.conns.get(&cid).and_then(|c| c.execs.get(&id)) else {
            return; // finished, or no such stream: dropped (documented)
        };
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = &exec.stdin else {
            return;
        };
        if exec.stdin_close {
            return;
        }
        if exec.stdin_buf.is_empty() {
            let n = match os::write(os::fd_ref(fd), data) {
                Ok(n) => n,
                Err(Errno(libc::EAGAIN | libc::EINTR)) => 0,
                Err(_) => {
                    // EPIPE: the command closed its stdin.
                    exec.stdin = None;
                    return;
                }
            };
            let rest = data.get(n..).unwrap_or_default();
            if rest.is_empty() {
                return;
            }
            exec.stdin_buf.extend_from_slice(rest);
            let token = pipe_token(exec_id, 2);
            exec.stdin_watch = self
                .ep
                .add(fd.as_raw_fd(), libc::EPOLLOUT as u32, token)
                .is_ok();
        } else {
            exec.stdin_buf.extend_from_slice(data);
        }
        if exec.stdin_buf.len() > STDIN_LIMIT && exec.stdin_blocking.is_none() {
            exec.stdin_blocking = Some(cid);
            if let Some(c) = self.conns.get_mut(&cid) {
                c.stdin_blocked += 1;
            }
            self.update_events(cid);
        }
    }

    pub(super) fn unblock_conn(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            c.stdin_blocked = c.stdin_blocked.saturating_sub(1);
        }
        self.update_events(cid);
    }

    pub(super) fn stdin_writable(&mut self, exec_id: u64) {
        let Some(exec) = self.execs.get_mut(&exec_id) else {
            return;
        };
        let Some(fd) = &exec.stdin else {
            return;
        };
        match os::write(os::fd_ref(fd), &exec.stdin_buf) {
            Ok(n) => {
                exec.stdin_buf.drain(..n.min(exec.stdin_buf.len()));
            }
            Err(Errno(libc::EAGAIN | libc::EINTR)) => return,
            Err(_) => {
                exec.stdin = None;
                exec.stdin_buf = Vec::new();
            }
        }
        if exec.stdin_buf.is_empty() {
            if exec.stdin_close {
                exec.stdin = None;
            } else if let Some(fd) = &exec.stdin {
                let _ = self.ep.delete(fd.as_raw_fd());
            }
            exec.stdin_watch = false;
            exec.stdin_buf = Vec::new();
        }
        if exec.stdin_buf.len() <= STDIN_LIMIT / 2 {
            if let Some(bc) = exec.stdin_blocking.take() {
                self.unblock_conn(bc);
            }
        }
    }

    pub(super) fn stdin_close(&mut self, cid: u32, id: u32) {
        let Some(&exec_id) = self.conns.get(&cid).and_then(|c| c.execs.get(&id)) else {
            return;
        };
        if let Some(exec) = self.execs.get_mut(&exec_id) {
            if exec.stdin_buf.is_empty() {
                exec.stdin = None;
            } else {
                exec.stdin_close = true;
            }
        }
    }
}

/// What an exec request turns into before the spawn.
struct Prepared {
    paths: Vec<CString>,
    argv: Vec<CString>,
    /// A changed environment (C strings and the pointer array over them).
    env: Option<(Vec<CString>, Vec<*const libc::c_char>)>,
    cwd: Option<CString>,
}

/// `NAME=value` C strings (entries with a NUL byte are skipped).
pub(super) fn env_cstrings(env: &[(Vec<u8>, Vec<u8>)]) -> Vec<CString> {
    env.iter()
        .filter_map(|(k, v)| {
            let mut e = Vec::with_capacity(k.len() + 1 + v.len());
            e.extend_from_slice(k);
            e.push(b'=');
            e.extend_from_slice(v);
            CString::new(e).ok()
        })
        .collect()
}

/// An exec's fds: stdout (read, write), stderr (read, if a pipe of its
/// own; write), and stdin (read, write) when they come with the rest.
type ExecFds = (
    OwnedFd,
    OwnedFd,
    Option<OwnedFd>,
    OwnedFd,
    Option<(Option<OwnedFd>, Option<OwnedFd>)>,
);

/// Pipes for stdout and stderr (stdin is the caller's).
fn pipe_fds(_stdin: bool) -> Result<ExecFds, (&'static str, Errno)> {
    let (out_r, out_w) = os::pipe().map_err(|e| ("pipe", e))?;
    let (err_r, err_w) = os::pipe().map_err(|e| ("pipe", e))?;
    Ok((out_r, out_w, Some(err_r), err_w, None))
}

/// A new terminal of `cols` x `rows`: the child gets its slave side as
/// stdin, stdout and stderr; the master is read as stdout and written as
/// stdin.
fn pty_fds(cols: u16, rows: u16) -> Result<ExecFds, (&'static str, Errno)> {
    let (master, slave) = os::openpty(cols, rows).map_err(|e| ("openpty", e))?;
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| ("dup", Errno(e.raw_os_error().unwrap_or(libc::EIO))))
    };
    let out_r = dup(&master)?;
    let out_w = dup(&slave)?;
    let err_w = dup(&slave)?;
    Ok((out_r, out_w, None, err_w, Some((Some(slave), Some(master)))))
}
