//! A tiny authoritative server for the forwarder's tests, on a loopback
//! UDP socket, built with hickory-proto. It counts the queries it sees
//! per name, so a test can tell what the forwarder passed on.
//!
//! The zone (all under `example.test`, unknown names NXDOMAIN with the
//! zone's SOA):
//! - `pypi` A 198.51.100.10 TTL 30
//! - `a.cdn` A 198.51.100.20, `cdn` A 198.51.100.21, `denied.cdn` A
//!   198.51.100.22 (TTL 30)
//! - `www.chain` CNAME `mid.chain` CNAME `end.cdn2`, A 198.51.100.30 and
//!   .31 TTL 120; the answer also carries an unrelated `evil` A
//!   203.0.113.66 that the forwarder must not pass on
//! - `v6` AAAA 2001:db8::10 TTL 30 (and no A)
//! - `long` A 198.51.100.40 TTL 3600; `forever` A 198.51.100.41 TTL 7 days
//! - `slow`: never answered
//! - `forged`: first a reply with another id (203.0.113.1), then one for
//!   another question (203.0.113.2), then the real one (198.51.100.50)

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

/// The server; stops on drop.
pub struct Upstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<HashMap<String, usize>>>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub async fn start() -> Upstream {
        let sock = UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("binding the test upstream on 127.0.0.1");
        let addr = sock.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let task = tokio::spawn(serve(sock, seen.clone()));
        Upstream { addr, seen, task }
    }

    /// How many queries for `name` (any case, with or without the dot) it saw.
    pub fn seen(&self, name: &str) -> usize {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        self.seen.lock().unwrap().get(&key).copied().unwrap_or(0)
    }

    /// All queries it saw.
    pub fn seen_total(&self) -> usize {
        self.seen.lock().unwrap().values().sum()
    }
}

async fn serve(sock: UdpSocket, seen: Arc<Mutex<HashMap<String, usize>>>) {
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let Some(q) = query.queries.first().cloned() else {
            continue;
        };
        let key = q
            .name()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        *seen.lock().unwrap().entry(key.clone()).or_default() += 1;
        for reply in replies(&query, &q, &key) {
            let _ = sock.send_to(&reply.to_vec().unwrap(), peer).await;
        }
    }
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn a(n: &str, ttl: u32, ip: [u8; 4]) -> Record {
    Record::from_rdata(name(n), ttl, RData::A(A(Ipv4Addr::from(ip))))
}

fn soa() -> Record {
    let data = SOA::new(
        name("ns.example.test."),
        name("hostmaster.example.test."),
        1,
        3600,
        600,
        86400,
        30,
    );
    Record::from_rdata(name("example.test."), 30, RData::SOA(data))
}

fn reply(query: &Message, q: &Query, rcode: ResponseCode, answers: Vec<Record>) -> Message {
    let mut m = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.authoritative = true;
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.response_code = rcode;
    m.add_query(q.clone());
    if answers.is_empty() {
        m.add_authority(soa());
    }
    m.answers = answers;
    m
}

/// What the server sends for `q` (`key`: its name in lower case).
fn replies(query: &Message, q: &Query, key: &str) -> Vec<Message> {
    let t = q.query_type();
    let ok = |answers| vec![reply(query, q, ResponseCode::NoError, answers)];
    let addr = |n: &str, ttl, ip| {
        if t == RecordType::A {
            ok(vec![a(n, ttl, ip)])
        } else {
            ok(vec![])
        }
    };
    match key {
        "slow.example.test" => vec![],
        "pypi.example.test" => addr("pypi.example.test.", 30, [198, 51, 100, 10]),
        "a.cdn.example.test" => addr("a.cdn.example.test.", 30, [198, 51, 100, 20]),
        "cdn.example.test" => addr("cdn.example.test.", 30, [198, 51, 100, 21]),
        "denied.cdn.example.test" => addr("denied.cdn.example.test.", 30, [198, 51, 100, 22]),
        "long.example.test" => addr("long.example.test.", 3600, [198, 51, 100, 40]),
        "forever.example.test" => addr("forever.example.test.", 7 * 86400, [198, 51, 100, 41]),
        "www.chain.example.test" => {
            let cname = |n: &str, target: &str| {
                Record::from_rdata(name(n), 300, RData::CNAME(CNAME(name(target))))
            };
            let mut answers = vec![
                a("evil.example.test.", 30, [203, 0, 113, 66]),
                cname("www.chain.example.test.", "mid.chain.example.test."),
                cname("mid.chain.example.test.", "end.cdn2.example.test."),
            ];
            if t == RecordType::A {
                answers.push(a("end.cdn2.example.test.", 120, [198, 51, 100, 30]));
                answers.push(a("end.cdn2.example.test.", 120, [198, 51, 100, 31]));
            }
            ok(answers)
        }
        "v6.example.test" if t == RecordType::AAAA => {
            let ip = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10);
            ok(vec![Record::from_rdata(
                name("v6.example.test."),
                30,
                RData::AAAA(AAAA(ip)),
            )])
        }
        "v6.example.test" => ok(vec![]),
        "forged.example.test" => {
            let mut wrong_id = reply(
                query,
                q,
                ResponseCode::NoError,
                vec![a("forged.example.test.", 30, [203, 0, 113, 1])],
            );
            wrong_id.metadata.id = query.metadata.id.wrapping_add(1);
            let other_q = Query::query(name("other.example.test."), t);
            let wrong_q = reply(
                query,
                &other_q,
                ResponseCode::NoError,
                vec![a("forged.example.test.", 30, [203, 0, 113, 2])],
            );
            let good = reply(
                query,
                q,
                ResponseCode::NoError,
                vec![a("forged.example.test.", 30, [198, 51, 100, 50])],
            );
            vec![wrong_id, wrong_q, good]
        }
        _ => vec![reply(query, q, ResponseCode::NXDomain, vec![])],
    }
}
