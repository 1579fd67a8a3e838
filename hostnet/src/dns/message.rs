//! The forwarder's DNS messages, all parsed and built with `hickory-proto`:
//! which datagrams are queries it answers, the query it sends upstream,
//! which upstream replies belong to it, what of a reply's answer it
//! passes on (the CNAME chain from the question's name, within the
//! answer) and the reply the sandbox gets.

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::BinDecodable;
use std::net::IpAddr;

/// The largest request or reply the forwarder reads, writes or sends
/// (bigger ones are dropped); also the EDNS payload size it asks for.
pub const MAX_MESSAGE: usize = 4096;

/// A reply to a client that sent no EDNS fits this (RFC 1035).
const CLASSIC_UDP: usize = 512;

/// The most CNAMEs followed from the question's name within one answer.
pub const MAX_CNAME_HOPS: usize = 16;

/// A datagram from a client as a query with one question; `None` when it
/// is to be dropped: not DNS, over [`MAX_MESSAGE`], a response, not
/// exactly one question, or records where a query has none (answer and
/// authority sections; more than the OPT record in the additional one).
pub(crate) fn parse_query(buf: &[u8]) -> Option<Message> {
    if buf.len() > MAX_MESSAGE {
        return None;
    }
    // The header alone first: its counts decide whether the rest is worth
    // decoding (a count of 65535 questions would be allocated up front).
    let header = Header::from_bytes(buf.get(..12)?).ok()?;
    let c = header.counts;
    if header.metadata.message_type != MessageType::Query
        || c.queries != 1
        || c.answers != 0
        || c.authorities != 0
        || c.additionals > 1
    {
        return None;
    }
    let msg = Message::from_vec(buf).ok()?;
    // The one additional record may only be the OPT (hickory takes it out).
    (msg.queries.len() == 1 && msg.additionals.is_empty() && msg.signature.is_none()).then_some(msg)
}

/// The question of a message [`parse_query`] returned.
pub(crate) fn question(msg: &Message) -> &Query {
    &msg.queries[0]
}

/// Why a query is answered REFUSED without a look at its name: an opcode
/// other than QUERY, a class other than IN, or a meta query type (OPT,
/// and 128 to 255: TKEY, TSIG, IXFR, AXFR, MAILB, MAILA, ANY, ...).
pub(crate) fn refused(msg: &Message) -> bool {
    let q = question(msg);
    let qtype = u16::from(q.query_type());
    msg.metadata.op_code != OpCode::Query
        || q.query_class() != DNSClass::IN
        || q.query_type() == RecordType::OPT
        || (128..=255).contains(&qtype)
}

/// The forwarder's own answer to `query` with `rcode` and no records.
pub(crate) fn local_reply(query: &Message, rcode: ResponseCode) -> Option<Vec<u8>> {
    let mut reply = reply_to(query);
    reply.metadata.response_code = rcode;
    encode(&reply)
}

/// A response to `query`: its id, opcode, RD and CD bits and question,
/// recursion available, and an OPT record when the query had one.
fn reply_to(query: &Message) -> Message {
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.checking_disabled = query.metadata.checking_disabled;
    reply.metadata.recursion_available = true;
    reply.add_queries(query.queries.iter().cloned());
    if query.edns.is_some() {
        reply.set_edns(our_edns());
    }
    reply
}

fn our_edns() -> Edns {
    let mut e = Edns::new();
    e.set_max_payload(u16::try_from(MAX_MESSAGE).unwrap_or(u16::MAX));
    e
}

fn encode(msg: &Message) -> Option<Vec<u8>> {
    match msg.to_vec() {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!("dns: encoding a reply: {e}");
            None
        }
    }
}

/// The query sent upstream for `q`: a fresh random id (never the
/// client's), recursion desired, our EDNS payload size, no DNSSEC.
pub(crate) fn upstream_query(q: &Query) -> Option<(u16, Vec<u8>)> {
    let mut msg = Message::query();
    msg.metadata.recursion_desired = true;
    msg.add_query(q.clone());
    msg.set_edns(our_edns());
    Some((msg.metadata.id, encode(&msg)?))
}

/// `buf` as the upstream's reply to our query `id` for `q`: a response of
/// opcode QUERY with that id and that one question (names compared
/// without regard to case), not truncated, at most [`MAX_MESSAGE`].
/// `None` for anything else (a stray or forged datagram).
pub(crate) fn upstream_reply(buf: &[u8], id: u16, q: &Query) -> Option<Message> {
    if buf.len() > MAX_MESSAGE {
        return None;
    }
    let msg = Message::from_vec(buf).ok()?;
    let m = &msg.metadata;
    let same_question = msg.queries.len() == 1
        && msg.queries[0].name() == q.name()
        && msg.queries[0].query_type() == q.query_type()
        && msg.queries[0].query_class() == q.query_class();
    (m.id == id
        && m.message_type == MessageType::Response
        && m.op_code == OpCode::Query
        && !m.truncation
        && same_question)
        .then_some(msg)
}

/// What of an upstream's reply the sandbox gets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    /// NOERROR or NXDOMAIN.
    pub rcode: ResponseCode,
    /// The CNAME chain from the question's name and the records of the
    /// question's type at its end, TTLs capped.
    pub records: Vec<Record>,
    /// SOA records of a zone holding the chain's last name (negative
    /// caching), TTLs capped.
    pub soa: Vec<Record>,
}

impl Answer {
    /// The A and AAAA addresses of the answer with their TTLs.
    pub(crate) fn addresses(&self) -> impl Iterator<Item = (IpAddr, u32)> + '_ {
        self.records
            .iter()
            .filter_map(|r| r.data.ip_addr().map(|ip| (ip, r.ttl)))
    }
}

/// The answer to `q` within `reply`, every TTL capped to `max_ttl`;
/// `None` when its rcode is neither NOERROR nor NXDOMAIN (an upstream
/// failure). Records off the chain from `q`'s name are left out:
/// unrelated addresses never reach the sandbox or its allowed set.
pub(crate) fn answer_of(reply: Message, q: &Query, max_ttl: u32) -> Option<Answer> {
    let rcode = reply.metadata.response_code;
    if rcode != ResponseCode::NoError && rcode != ResponseCode::NXDomain {
        return None;
    }
    let qtype = q.query_type();
    let in_class = |r: &&Record| r.dns_class == DNSClass::IN;
    let mut name: Name = q.name().clone();
    let mut records = Vec::new();
    for _ in 0..=MAX_CNAME_HOPS {
        // A name with a CNAME has no other data (RFC 1034 3.6.2): where an
        // answer has both, the CNAME is followed.
        let cname = reply
            .answers
            .iter()
            .filter(in_class)
            .find_map(|r| match &r.data {
                RData::CNAME(target) if r.name == name && qtype != RecordType::CNAME => {
                    Some((r, target.0.clone()))
                }
                _ => None,
            });
        match cname {
            Some((r, target)) => {
                records.push(r.clone());
                name = target;
            }
            None => {
                records.extend(
                    reply
                        .answers
                        .iter()
                        .filter(in_class)
                        .filter(|r| r.name == name && r.record_type() == qtype)
                        .cloned(),
                );
                break;
            }
        }
    }
    let soa = reply
        .authorities
        .iter()
        .filter(in_class)
        .filter(|r| matches!(r.data, RData::SOA(_)) && r.name.zone_of(&name))
        .take(1)
        .cloned()
        .collect();
    let mut answer = Answer {
        rcode,
        records,
        soa,
    };
    for r in answer.records.iter_mut().chain(answer.soa.iter_mut()) {
        r.ttl = r.ttl.min(max_ttl);
    }
    Some(answer)
}

/// The reply to the client's `query` with `answer`, within the size the
/// client takes (512 bytes without EDNS, its EDNS payload size up to
/// [`MAX_MESSAGE`] with): records that do not fit are left out from the
/// end and the TC bit set.
pub(crate) fn answer_reply(query: &Message, answer: &Answer) -> Option<Vec<u8>> {
    let limit = match &query.edns {
        Some(e) => usize::from(e.max_payload()).clamp(CLASSIC_UDP, MAX_MESSAGE),
        None => CLASSIC_UDP,
    };
    let mut reply = reply_to(query);
    reply.metadata.response_code = answer.rcode;
    reply.answers = answer.records.clone();
    reply.authorities = answer.soa.clone();
    loop {
        let bytes = encode(&reply)?;
        if bytes.len() <= limit {
            return Some(bytes);
        }
        reply.metadata.truncation = true;
        if !reply.authorities.is_empty() {
            reply.authorities.clear();
        } else if reply.answers.pop().is_none() {
            // Only the question left and still too big: cannot happen
            // for a name that parsed from a packet within the limit.
            return None;
        }
    }
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
