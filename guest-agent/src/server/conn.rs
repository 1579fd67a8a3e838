//! Connections: accepting, reading frames, file transfers and the output
//! buffers flushed once per loop iteration.

use super::*;

impl Server {
    // ----------------------------------------------------------------- conns

    pub(super) fn accept(&mut self) {
        let fd = match listen::accept(&self.listener, self.unix) {
            Ok(fd) => fd,
            Err(Errno(libc::EMFILE | libc::ENFILE)) => {
                // Out of fds: stop listening until something closes, or the
                // level-triggered listener would spin.
                let _ = self.ep.delete(self.listener.as_raw_fd());
                self.listener_paused = true;
                return;
            }
            Err(_) => return,
        };
        if self.conns.len() >= MAX_CONNS {
            return; // dropped: the client sees the connection close
        }
        let mut cid = self.next_conn;
        while self.conns.contains_key(&cid) {
            cid = cid.wrapping_add(1);
        }
        self.next_conn = cid.wrapping_add(1);
        let events = libc::EPOLLIN as u32;
        if self
            .ep
            .add(fd.as_raw_fd(), events, TAG_CONN | u64::from(cid))
            .is_err()
        {
            return;
        }
        self.conns.insert(
            cid,
            Conn {
                fd,
                inbuf: Vec::with_capacity(IN_CAP),
                out: Vec::new(),
                out_pos: 0,
                hello: false,
                closing: false,
                dead: false,
                dirty: false,
                blocked: false,
                events,
                stdin_blocked: 0,
                execs: HashMap::new(),
                uploads: HashMap::new(),
                downloads: VecDeque::new(),
                paused_execs: Vec::new(),
                relay: None,
            },
        );
    }

    pub(super) fn resume_listener(&mut self) {
        if self.listener_paused
            && self
                .ep
                .add(
                    self.listener.as_raw_fd(),
                    libc::EPOLLIN as u32,
                    TOKEN_LISTENER,
                )
                .is_ok()
        {
            self.listener_paused = false;
        }
    }

    pub(super) fn mark_dirty(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(cid);
            }
        }
    }

    pub(super) fn kill_conn(&mut self, cid: u32) {
        if let Some(c) = self.conns.get_mut(&cid) {
            c.dead = true;
        }
        self.mark_dirty(cid);
    }

    /// Queues a fatal error and closes the connection once it is sent.
    pub(super) fn fail_conn(&mut self, cid: u32, id: u32, code: ErrorCode, message: String) {
        self.reply_err(cid, id, code, 0, message);
        if let Some(c) = self.conns.get_mut(&cid) {
            c.closing = true;
        }
        self.update_events(cid);
    }

    pub(super) fn update_events(&mut self, cid: u32) {
        if self.relay_events(cid) {
            return;
        }
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.dead {
            return;
        }
        let mut ev = 0;
        if !c.closing && c.stdin_blocked == 0 && c.out_len() < OUT_MAX {
            ev |= libc::EPOLLIN as u32;
        }
        if c.blocked {
            ev |= libc::EPOLLOUT as u32;
        }
        if ev != c.events {
            if self
                .ep
                .modify(c.fd.as_raw_fd(), ev, TAG_CONN | u64::from(cid))
                .is_ok()
            {
                c.events = ev;
            } else {
                c.dead = true;
            }
        }
    }

    pub(super) fn conn_read(&mut self, cid: u32) {
        if self.is_relay(cid) {
            self.relay_host_read(cid);
            return;
        }
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.closing || c.dead {
            return;
        }
        let mut buf = std::mem::take(&mut c.inbuf);
        let room = IN_CAP.saturating_sub(buf.len());
        match os::read_append(os::fd_ref(&c.fd), &mut buf, room, true) {
            Ok(0) => {
                c.inbuf = buf;
                self.kill_conn(cid);
                return;
            }
            Ok(_) => {}
            Err(Errno(libc::EAGAIN | libc::EINTR)) => {
                c.inbuf = buf;
                return;
            }
            Err(_) => {
                c.inbuf = buf;
                self.kill_conn(cid);
                return;
            }
        }
        c.inbuf = buf;
        self.conn_frames(cid, false);
    }

    /// Handles the complete frames in a connection's input buffer.
    pub(super) fn conn_frames(&mut self, cid: u32, waited: bool) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let mut buf = std::mem::take(&mut c.inbuf);
        let mut pos = 0;
        while let Some(h) = buf.get(pos..).and_then(Header::parse_prefix) {
            let len = match h.checked_len() {
                Ok(len) => len,
                Err(e) => {
                    // The stream cannot be resynchronised past a bogus
                    // length: report and close.
                    self.fail_conn(cid, h.id, ErrorCode::TooLarge, e.to_string());
                    pos = buf.len();
                    break;
                }
            };
            let end = pos + HEADER_LEN + len;
            let Some(payload) = buf.get(pos + HEADER_LEN..end) else {
                break; // incomplete: wait for the rest
            };
            self.handle_frame(cid, h, payload);
            pos = end;
            if self.is_relay(cid) {
                // The rest is relayed bytes, not frames.
                let rest = buf.get(pos..).unwrap_or_default().to_vec();
                self.relay_take_input(cid, &rest);
                pos = buf.len();
                break;
            }
            if self.conns.get(&cid).is_none_or(|c| c.closing || c.dead) {
                pos = buf.len();
                break;
            }
        }
        buf.copy_within(pos.., 0);
        buf.truncate(buf.len() - pos);
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        // A frame is half here: the client writes frames whole, so wait
        // (bounded by SO_RCVTIMEO) for the rest in the same system call
        // rather than waking up per socket buffer's worth of it.
        let missing = Header::parse_prefix(&buf)
            .and_then(|h| h.checked_len().ok())
            .map(|len| (HEADER_LEN + len).saturating_sub(buf.len()))
            .unwrap_or(0);
        if missing > 0 && !waited && !c.closing && c.stdin_blocked == 0 {
            match os::recv_waitall(os::fd_ref(&c.fd), &mut buf, missing) {
                Ok(0) => {
                    c.inbuf = buf;
                    self.kill_conn(cid);
                    return;
                }
                Ok(_) => {
                    c.inbuf = buf;
                    return self.conn_frames(cid, true);
                }
                Err(_) => {} // timeout: wait for readiness as usual
            }
        }
        c.inbuf = buf;
    }

    // ----------------------------------------------------------------- files

    pub(super) fn file_write(&mut self, cid: u32, id: u32, req: &FileWrite) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        match files::open_write(&req.path, req.mode, req.append, req.create_parents) {
            Ok(file) => {
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.uploads.insert(id, Upload { file, bytes: 0 });
                }
            }
            Err(e) => self.reply_errno(cid, id, "open for writing", e),
        }
    }

    pub(super) fn file_data(&mut self, cid: u32, id: u32, data: &[u8]) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(up) = c.uploads.get_mut(&id) else {
            return; // failed or unknown upload: dropped (documented)
        };
        match os::write_all(os::fd_ref(&up.file), data) {
            Ok(()) => up.bytes += data.len() as u64,
            Err(e) => {
                c.uploads.remove(&id);
                self.reply_errno(cid, id, "write", e);
            }
        }
    }

    pub(super) fn file_read(&mut self, cid: u32, id: u32, req: &FileRead) {
        if !self.stream_allowed(cid, id) {
            return;
        }
        match files::open_read(&req.path, req.offset, req.limit) {
            Ok((file, left)) => {
                if let Some(c) = self.conns.get_mut(&cid) {
                    c.downloads.push_back(Download {
                        id,
                        file,
                        left,
                        sent: 0,
                    });
                }
                self.mark_dirty(cid);
            }
            Err(e) => self.reply_errno(cid, id, "open for reading", e),
        }
    }

    /// Reads the next chunk of the first download straight into the output
    /// buffer.
    pub(super) fn pump_download(&mut self, cid: u32) {
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        let Some(mut d) = c.downloads.pop_front() else {
            return;
        };
        let max = MAX_PAYLOAD as u64;
        let want = usize::try_from(d.left.unwrap_or(max).min(max)).unwrap_or(MAX_PAYLOAD);
        if want == 0 {
            put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
            return;
        }
        let at = begin_frame(&mut c.out, Kind::FileChunk, d.id);
        match os::read_append(os::fd_ref(&d.file), &mut c.out, want, false) {
            Ok(0) => {
                c.out.truncate(at);
                put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
            }
            Ok(n) => {
                end_frame(&mut c.out, at);
                d.sent += n as u64;
                d.left = d.left.map(|l| l.saturating_sub(n as u64));
                if d.left == Some(0) {
                    put_message(&mut c.out, d.id, &FileDone { bytes: d.sent });
                } else {
                    c.downloads.push_back(d);
                }
            }
            Err(e) => {
                c.out.truncate(at);
                let id = d.id;
                self.reply_errno(cid, id, "read", e);
            }
        }
    }

    // ---------------------------------------------------------------- output

    pub(super) fn flush(&mut self) {
        self.more_work = false;
        let dirty = std::mem::take(&mut self.dirty);
        for cid in dirty {
            if let Some(c) = self.conns.get_mut(&cid) {
                c.dirty = false;
            }
            self.service_output(cid);
            if self.conns.get(&cid).is_some_and(|c| c.dead) {
                self.close_conn(cid);
            }
        }
    }

    pub(super) fn service_output(&mut self, cid: u32) {
        let mut budget = DOWNLOAD_BUDGET;
        loop {
            while budget > 0
                && self
                    .conns
                    .get(&cid)
                    .is_some_and(|c| !c.dead && !c.downloads.is_empty() && c.out_len() < OUT_HIGH)
            {
                self.pump_download(cid);
                budget -= 1;
            }
            let Some(c) = self.conns.get_mut(&cid) else {
                return;
            };
            if c.dead {
                return;
            }
            if c.out_len() == 0 {
                c.blocked = false;
                break;
            }
            let pending = c.out.get(c.out_pos..).unwrap_or_default();
            match os::send(os::fd_ref(&c.fd), pending) {
                Ok(n) => {
                    c.out_pos += n;
                    if c.out_pos >= c.out.len() {
                        c.out.clear();
                        c.out_pos = 0;
                        c.blocked = false;
                    } else {
                        c.blocked = true; // socket buffer full
                        break;
                    }
                }
                Err(Errno(libc::EAGAIN)) => {
                    c.blocked = true;
                    break;
                }
                Err(Errno(libc::EINTR)) => continue,
                Err(_) => {
                    c.dead = true;
                    return;
                }
            }
            if c.downloads.is_empty() {
                break;
            }
            if budget == 0 {
                // Let other connections and events in; come back at once.
                self.more_work = true;
                c.dirty = true;
                self.dirty.push(cid);
                break;
            }
        }
        let Some(c) = self.conns.get_mut(&cid) else {
            return;
        };
        if c.out_pos > 0 && c.out_pos * 2 >= c.out.len() {
            c.out.drain(..c.out_pos);
            c.out_pos = 0;
        }
        if c.closing && c.out_len() == 0 {
            c.dead = true;
            return;
        }
        if c.out_len() < OUT_LOW && !c.paused_execs.is_empty() {
            for e in std::mem::take(&mut c.paused_execs) {
                self.resume(e);
            }
        }
        self.update_events(cid);
    }

    pub(super) fn close_conn(&mut self, cid: u32) {
        let Some(c) = self.conns.remove(&cid) else {
            return;
        };
        for (_, exec_id) in c.execs {
            if let Some(exec) = self.execs.get_mut(&exec_id) {
                if exec.attached.is_some_and(|(ac, _)| ac == cid) {
                    exec.attached = None;
                }
                if exec.stdin_blocking == Some(cid) {
                    exec.stdin_blocking = None;
                }
            }
            // Detached output is kept (bounded), so reading resumes.
            self.resume(exec_id);
        }
        self.resume_listener();
    }
}
