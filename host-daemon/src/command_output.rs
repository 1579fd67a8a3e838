//! What the daemon keeps of a background command's output, bounded
//! whatever the guest sends: the first bytes of each stream (the *head*,
//! what a wait returns, as a one-shot exec would, with its truncated
//! flags) and the most recent bytes past them (the *tail*, a ring), each
//! chunk numbered in the order it came. A re-attach replays the head and
//! the tail, in order, then follows live output by number; whatever fell
//! out of the ring in between is skipped.
//!
//! Every chunk costs its bytes and [`CHUNK_COST`] (so a guest sending
//! one-byte frames cannot make the bookkeeping outgrow the bound): the
//! head of a stream holds at most `head_limit` of cost, the tail at most
//! `tail_limit`.

use axum::body::Bytes;
use std::collections::VecDeque;

/// What one kept chunk costs beyond its bytes (its record and the
/// allocator's share).
pub const CHUNK_COST: usize = 64;

/// Standard output or error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout = 0,
    /// Standard error.
    Stderr = 1,
}

/// One kept chunk: its number and bytes.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Its number (every chunk kept gets the next one).
    pub seq: u64,
    /// Which stream.
    pub stream: Stream,
    /// The bytes.
    pub data: Bytes,
}

/// A command's kept output.
#[derive(Debug)]
pub struct Output {
    head_limit: usize,
    tail_limit: usize,
    head: Vec<Chunk>,
    /// Cost of each stream's head.
    head_cost: [usize; 2],
    /// A stream's output did not all fit in its head.
    truncated: [bool; 2],
    tail: VecDeque<Chunk>,
    tail_cost: usize,
    /// Bytes that fell out of the tail.
    dropped: u64,
    next: u64,
}

impl Output {
    /// Empty, with at most `head_limit` of cost per stream's head and
    /// `tail_limit` in the tail.
    pub fn new(head_limit: usize, tail_limit: usize) -> Output {
        Output {
            head_limit,
            tail_limit,
            head: Vec::new(),
            head_cost: [0; 2],
            truncated: [false; 2],
            tail: VecDeque::new(),
            tail_cost: 0,
            dropped: 0,
            next: 0,
        }
    }

    /// Keeps `data` (what does not fit the head goes to the tail, whose
    /// oldest chunks make room).
    pub fn push(&mut self, stream: Stream, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let s = stream as usize;
        let room = self
            .head_limit
            .saturating_sub(self.head_cost[s])
            .saturating_sub(CHUNK_COST);
        let n = room.min(data.len());
        if n > 0 {
            self.head.push(Chunk {
                seq: self.next,
                stream,
                data: data.slice(..n),
            });
            self.next += 1;
            self.head_cost[s] += n + CHUNK_COST;
        }
        if n == data.len() {
            return;
        }
        self.truncated[s] = true;
        let mut rest = data.slice(n..);
        // A chunk larger than the whole tail keeps its last bytes.
        let fits = self.tail_limit.saturating_sub(CHUNK_COST);
        if rest.len() > fits {
            self.dropped += (rest.len() - fits) as u64;
            rest = rest.slice(rest.len() - fits..);
        }
        if rest.is_empty() {
            return;
        }
        self.tail_cost += rest.len() + CHUNK_COST;
        self.tail.push_back(Chunk {
            seq: self.next,
            stream,
            data: rest,
        });
        self.next += 1;
        while self.tail_cost > self.tail_limit {
            let Some(old) = self.tail.pop_front() else {
                break;
            };
            self.tail_cost -= old.data.len() + CHUNK_COST;
            self.dropped += old.data.len() as u64;
        }
    }

    /// The first kept chunk numbered `seq` or later.
    pub fn next_from(&self, seq: u64) -> Option<Chunk> {
        let h = self.head.partition_point(|c| c.seq < seq);
        let t = self.tail.partition_point(|c| c.seq < seq);
        match (self.head.get(h), self.tail.get(t)) {
            (Some(a), Some(b)) if b.seq < a.seq => Some(b.clone()),
            (Some(a), _) => Some(a.clone()),
            (None, b) => b.cloned(),
        }
    }

    /// A stream's head, whole, and whether the stream was cut there.
    pub fn head(&self, stream: Stream) -> (Vec<u8>, bool) {
        let mut v = Vec::new();
        for c in self.head.iter().filter(|c| c.stream == stream) {
            v.extend_from_slice(&c.data);
        }
        (v, self.truncated[stream as usize])
    }

    /// What is kept, bookkeeping included (at most twice the head limit
    /// and the tail limit).
    pub fn cost(&self) -> usize {
        self.head_cost[0] + self.head_cost[1] + self.tail_cost
    }

    /// The number the next chunk kept will get (a reader starting here
    /// sees only what comes from now on).
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Bytes that fell out of the tail (not replayed to a new attach).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    fn replay(o: &Output) -> Vec<(Stream, Vec<u8>)> {
        let mut v = Vec::new();
        let mut seq = 0;
        while let Some(c) = o.next_from(seq) {
            seq = c.seq + 1;
            v.push((c.stream, c.data.to_vec()));
        }
        v
    }

    #[test]
    fn small_output_is_kept_whole_in_order() {
        let mut o = Output::new(1 << 20, 1 << 20);
        o.push(Stream::Stdout, b(b"a"));
        o.push(Stream::Stderr, b(b"e"));
        o.push(Stream::Stdout, b(b"b"));
        o.push(Stream::Stdout, Bytes::new());
        assert_eq!(
            replay(&o),
            [
                (Stream::Stdout, b"a".to_vec()),
                (Stream::Stderr, b"e".to_vec()),
                (Stream::Stdout, b"b".to_vec())
            ]
        );
        assert_eq!(o.head(Stream::Stdout), (b"ab".to_vec(), false));
        assert_eq!(o.head(Stream::Stderr), (b"e".to_vec(), false));
        assert_eq!(o.dropped(), 0);
    }

    #[test]
    fn a_flood_keeps_the_head_and_the_latest_tail_within_the_bounds() {
        let (head, tail) = (1000, 2000);
        let mut o = Output::new(head, tail);
        for i in 0..10_000u32 {
            o.push(Stream::Stdout, b(format!("{i:08}\n").as_bytes()));
            assert!(o.cost() <= 2 * head + tail, "cost {}", o.cost());
        }
        // One-byte chunks are bounded by their count too.
        for _ in 0..10_000 {
            o.push(Stream::Stderr, b(b"x"));
        }
        assert!(o.cost() <= 2 * head + tail, "cost {}", o.cost());
        let (out, cut) = o.head(Stream::Stdout);
        assert!(cut);
        assert!(out.starts_with(b"00000000\n00000001\n"), "{out:?}");
        assert!(out.len() <= head);
        let (err, cut) = o.head(Stream::Stderr);
        assert!(cut && !err.is_empty() && err.len() <= head);
        assert!(o.dropped() > 0);
        // The replay: the head, then the latest chunks (the last one last).
        let r = replay(&o);
        assert_eq!(r.first().unwrap().1, b"00000000\n");
        assert_eq!(r.last().unwrap(), &(Stream::Stderr, b"x".to_vec()));
        // A reader that is behind skips what fell out of the ring.
        let c = o.next_from(r.len() as u64 / 2).unwrap();
        assert!(c.seq >= r.len() as u64 / 2);
    }

    #[test]
    fn a_chunk_larger_than_the_head_is_split() {
        let mut o = Output::new(100 + CHUNK_COST, 1 << 20);
        o.push(Stream::Stdout, Bytes::from(vec![7u8; 250]));
        let (h, cut) = o.head(Stream::Stdout);
        assert_eq!((h.len(), cut), (100, true));
        let r = replay(&o);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].1.len() + r[1].1.len(), 250);
        // One larger than the whole tail keeps its last bytes there.
        let mut o = Output::new(10 + CHUNK_COST, 100 + CHUNK_COST);
        let big: Vec<u8> = (0..=255u8).collect();
        o.push(Stream::Stdout, Bytes::from(big.clone()));
        let r = replay(&o);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].1, big[..10]);
        assert_eq!(r[1].1, big[156..]);
        assert_eq!(o.dropped(), 146);
        assert!(o.cost() <= 2 * (10 + CHUNK_COST) + 100 + CHUNK_COST);
    }
}
