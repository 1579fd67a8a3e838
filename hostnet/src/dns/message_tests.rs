use super::*;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA, TXT};
use std::net::{Ipv4Addr, Ipv6Addr};

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn query_msg(n: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(n), t));
    m
}

fn a(n: &str, ttl: u32, ip: [u8; 4]) -> Record {
    Record::from_rdata(name(n), ttl, RData::A(A(Ipv4Addr::from(ip))))
}

fn cname(n: &str, ttl: u32, target: &str) -> Record {
    Record::from_rdata(name(n), ttl, RData::CNAME(CNAME(name(target))))
}

fn soa(zone: &str, ttl: u32) -> Record {
    let data = SOA::new(
        name("ns.example.test."),
        name("h.example.test."),
        1,
        60,
        60,
        60,
        30,
    );
    Record::from_rdata(name(zone), ttl, RData::SOA(data))
}

fn reply_with(q: &Query, rcode: ResponseCode, answers: Vec<Record>) -> Message {
    let mut m = Message::response(7, OpCode::Query);
    m.metadata.response_code = rcode;
    m.add_query(q.clone());
    m.answers = answers;
    m
}

#[test]
fn one_question_queries_parse() {
    let m = query_msg("pypi.example.test.", RecordType::A);
    let parsed = parse_query(&m.to_vec().unwrap()).unwrap();
    assert_eq!(question(&parsed).name(), &name("pypi.example.test."));
    assert!(!refused(&parsed));
    let mut with_edns = m.clone();
    with_edns.set_edns(Edns::new());
    assert!(parse_query(&with_edns.to_vec().unwrap()).is_some());
}

#[test]
fn what_is_not_one_plain_question_is_dropped() {
    assert!(parse_query(b"").is_none());
    assert!(parse_query(b"\x12\x34\x01").is_none());
    assert!(parse_query(&[0xff; 64]).is_none());
    // Two questions.
    let mut two = query_msg("a.example.test.", RecordType::A);
    two.add_query(Query::query(name("b.example.test."), RecordType::A));
    assert!(parse_query(&two.to_vec().unwrap()).is_none());
    // No question.
    assert!(parse_query(&Message::query().to_vec().unwrap()).is_none());
    // A response.
    let q = Query::query(name("a.example.test."), RecordType::A);
    let r = reply_with(&q, ResponseCode::NoError, vec![]);
    assert!(parse_query(&r.to_vec().unwrap()).is_none());
    // Records in the answer section.
    let mut ans = query_msg("a.example.test.", RecordType::A);
    ans.add_answer(a("a.example.test.", 1, [1, 2, 3, 4]));
    assert!(parse_query(&ans.to_vec().unwrap()).is_none());
    // Over the size cap, even when the start is a good query.
    let mut big = query_msg("a.example.test.", RecordType::A)
        .to_vec()
        .unwrap();
    big.resize(MAX_MESSAGE + 1, 0);
    assert!(parse_query(&big).is_none());
    // A header that claims 65535 questions over a short body.
    let mut many = query_msg("a.example.test.", RecordType::A)
        .to_vec()
        .unwrap();
    many[4] = 0xff;
    many[5] = 0xff;
    assert!(parse_query(&many).is_none());
    // A truncated question.
    let good = query_msg("a.example.test.", RecordType::A)
        .to_vec()
        .unwrap();
    assert!(parse_query(&good[..good.len() - 3]).is_none());
}

#[test]
fn meta_types_other_classes_and_opcodes_are_refused() {
    for t in [
        RecordType::ANY,
        RecordType::AXFR,
        RecordType::IXFR,
        RecordType::OPT,
    ] {
        let m = query_msg("a.example.test.", t);
        assert!(refused(&parse_query(&m.to_vec().unwrap()).unwrap()), "{t}");
    }
    for t in [
        RecordType::A,
        RecordType::AAAA,
        RecordType::CNAME,
        RecordType::HTTPS,
    ] {
        let m = query_msg("a.example.test.", t);
        assert!(!refused(&parse_query(&m.to_vec().unwrap()).unwrap()), "{t}");
    }
    let mut ch = query_msg("version.bind.", RecordType::TXT);
    ch.queries[0].set_query_class(DNSClass::CH);
    assert!(refused(&parse_query(&ch.to_vec().unwrap()).unwrap()));
    let mut notify = query_msg("a.example.test.", RecordType::SOA);
    notify.metadata.op_code = OpCode::Notify;
    assert!(refused(&parse_query(&notify.to_vec().unwrap()).unwrap()));
}

#[test]
fn local_reply_echoes_id_and_question() {
    let mut m = query_msg("Secret.Example.Test.", RecordType::A);
    m.metadata.id = 0xbeef;
    m.set_edns(Edns::new());
    let bytes = local_reply(&m, ResponseCode::NXDomain).unwrap();
    let r = Message::from_vec(&bytes).unwrap();
    assert_eq!(r.metadata.id, 0xbeef);
    assert_eq!(r.metadata.message_type, MessageType::Response);
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    assert!(r.metadata.recursion_desired);
    assert_eq!(r.queries, m.queries);
    assert!(r.queries[0].name().eq_case(&name("Secret.Example.Test.")));
    assert!(r.edns.is_some());
    assert!(r.answers.is_empty());
}

#[test]
fn upstream_replies_must_match_id_and_question() {
    let q = Query::query(name("pypi.example.test."), RecordType::A);
    let (id, bytes) = upstream_query(&q).unwrap();
    let sent = Message::from_vec(&bytes).unwrap();
    assert_eq!(sent.metadata.id, id);
    assert!(sent.metadata.recursion_desired);
    assert_eq!(sent.queries, vec![q.clone()]);
    assert_eq!(usize::from(sent.max_payload()), MAX_MESSAGE);

    let mut good = reply_with(&q, ResponseCode::NoError, vec![]);
    good.metadata.id = id;
    assert!(upstream_reply(&good.to_vec().unwrap(), id, &q).is_some());
    // Names compare without regard to case.
    let mut upper = good.clone();
    upper.queries[0].set_name(name("PYPI.example.TEST."));
    assert!(upstream_reply(&upper.to_vec().unwrap(), id, &q).is_some());

    let mut wrong_id = good.clone();
    wrong_id.metadata.id = id.wrapping_add(1);
    let mut other_name = good.clone();
    other_name.queries[0].set_name(name("evil.example.test."));
    let mut other_type = good.clone();
    other_type.queries[0].set_query_type(RecordType::AAAA);
    let mut truncated = good.clone();
    truncated.metadata.truncation = true;
    let mut not_response = good.clone();
    not_response.metadata.message_type = MessageType::Query;
    let mut two = good.clone();
    two.add_query(q.clone());
    for bad in [
        wrong_id,
        other_name,
        other_type,
        truncated,
        not_response,
        two,
    ] {
        assert!(
            upstream_reply(&bad.to_vec().unwrap(), id, &q).is_none(),
            "{bad}"
        );
    }
    assert!(upstream_reply(b"garbage", id, &q).is_none());
    let mut big = good.to_vec().unwrap();
    big.resize(MAX_MESSAGE + 1, 0);
    assert!(upstream_reply(&big, id, &q).is_none());
}

#[test]
fn answer_follows_the_cname_chain_within_the_answer() {
    let q = Query::query(name("www.chain.example.test."), RecordType::A);
    let reply = reply_with(
        &q,
        ResponseCode::NoError,
        vec![
            a("evil.example.test.", 30, [203, 0, 113, 66]),
            cname("mid.chain.example.test.", 300, "end.cdn.example.test."),
            cname("WWW.chain.example.test.", 300, "mid.chain.example.test."),
            a("end.cdn.example.test.", 20, [198, 51, 100, 30]),
            a("end.cdn.example.test.", 200_000, [198, 51, 100, 31]),
            a("www.chain.example.test.", 30, [203, 0, 113, 67]),
        ],
    );
    let ans = answer_of(reply, &q, 86_400).unwrap();
    let addrs: Vec<_> = ans.addresses().collect();
    // The A record at the CNAME's own name is off the chain (a name with
    // a CNAME has no other data) and so is the unrelated one.
    assert_eq!(
        addrs,
        vec![
            (IpAddr::from([198, 51, 100, 30]), 20),
            (IpAddr::from([198, 51, 100, 31]), 86_400),
        ]
    );
    assert_eq!(ans.records.len(), 4);
    assert_eq!(ans.records[0].record_type(), RecordType::CNAME);
}

#[test]
fn cname_loops_and_long_chains_end() {
    let q = Query::query(name("a.example.test."), RecordType::A);
    let looped = reply_with(
        &q,
        ResponseCode::NoError,
        vec![
            cname("a.example.test.", 1, "b.example.test."),
            cname("b.example.test.", 1, "a.example.test."),
        ],
    );
    let ans = answer_of(looped, &q, 60).unwrap();
    assert_eq!(ans.records.len(), MAX_CNAME_HOPS + 1);
    assert_eq!(ans.addresses().count(), 0);

    let mut long = Vec::new();
    for i in 0..40 {
        long.push(cname(
            &format!("c{i}.example.test."),
            1,
            &format!("c{}.example.test.", i + 1),
        ));
    }
    long.push(a("c40.example.test.", 1, [198, 51, 100, 1]));
    let q = Query::query(name("c0.example.test."), RecordType::A);
    let ans = answer_of(reply_with(&q, ResponseCode::NoError, long), &q, 60).unwrap();
    assert_eq!(ans.addresses().count(), 0);
}

#[test]
fn other_types_pass_without_addresses_and_failures_are_none() {
    let q = Query::query(name("v6.example.test."), RecordType::AAAA);
    let six = Record::from_rdata(
        name("v6.example.test."),
        30,
        RData::AAAA(AAAA(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10))),
    );
    let v4 = a("v6.example.test.", 30, [198, 51, 100, 2]);
    let ans = answer_of(reply_with(&q, ResponseCode::NoError, vec![v4, six]), &q, 60).unwrap();
    assert_eq!(ans.records.len(), 1);
    assert_eq!(
        ans.addresses().next().unwrap().0,
        IpAddr::from(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10))
    );

    let q = Query::query(name("t.example.test."), RecordType::TXT);
    let txt = Record::from_rdata(
        name("t.example.test."),
        5,
        RData::TXT(TXT::new(vec!["hi".into()])),
    );
    let ans = answer_of(reply_with(&q, ResponseCode::NoError, vec![txt]), &q, 60).unwrap();
    assert_eq!((ans.records.len(), ans.addresses().count()), (1, 0));

    for rc in [
        ResponseCode::ServFail,
        ResponseCode::Refused,
        ResponseCode::FormErr,
    ] {
        assert!(answer_of(reply_with(&q, rc, vec![]), &q, 60).is_none());
    }
}

#[test]
fn negative_answers_keep_their_zone_soa() {
    let q = Query::query(name("nope.example.test."), RecordType::A);
    let mut reply = reply_with(&q, ResponseCode::NXDomain, vec![]);
    reply.add_authority(soa("other.test.", 30));
    reply.add_authority(soa("example.test.", 100_000));
    let ans = answer_of(reply, &q, 3600).unwrap();
    assert_eq!(ans.rcode, ResponseCode::NXDomain);
    assert_eq!(ans.soa.len(), 1);
    assert_eq!(
        (ans.soa[0].name.clone(), ans.soa[0].ttl),
        (name("example.test."), 3600)
    );
}

#[test]
fn replies_fit_the_client_and_say_when_cut() {
    let records: Vec<Record> = (0..100u8)
        .map(|i| a("many.example.test.", 30, [198, 51, 100, i]))
        .collect();
    let ans = Answer {
        rcode: ResponseCode::NoError,
        records,
        soa: vec![soa("example.test.", 30)],
    };
    let mut client = query_msg("many.example.test.", RecordType::A);
    client.metadata.id = 4242;
    let bytes = answer_reply(&client, &ans).unwrap();
    assert!(bytes.len() <= 512);
    let r = Message::from_vec(&bytes).unwrap();
    assert!(r.metadata.truncation);
    assert_eq!(r.metadata.id, 4242);
    assert!(!r.answers.is_empty() && r.answers.len() < 100);

    let mut edns_client = client.clone();
    let mut e = Edns::new();
    e.set_max_payload(65_000);
    edns_client.set_edns(e);
    let bytes = answer_reply(&edns_client, &ans).unwrap();
    let r = Message::from_vec(&bytes).unwrap();
    assert!(bytes.len() <= MAX_MESSAGE);
    assert!(!r.metadata.truncation);
    assert_eq!(r.answers.len(), 100);
    assert_eq!(r.authorities.len(), 1);
}

/// A small deterministic generator for the mutation test.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
    }
}

#[test]
fn mutated_queries_and_replies_never_panic_and_replies_stay_capped() {
    let mut client = query_msg("www.chain.example.test.", RecordType::A);
    client.set_edns(Edns::new());
    let q = question(&client).clone();
    let mut upstream = reply_with(
        &q,
        ResponseCode::NoError,
        vec![
            cname("www.chain.example.test.", 300, "end.cdn.example.test."),
            a("end.cdn.example.test.", 20, [198, 51, 100, 30]),
        ],
    );
    upstream.add_authority(soa("example.test.", 30));
    let seeds = [client.to_vec().unwrap(), upstream.to_vec().unwrap()];
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut parsed, mut answered) = (0, 0);
    for _ in 0..20_000 {
        let mut bytes = seeds[rng.below(2)].clone();
        for _ in 0..=rng.below(6) {
            match rng.below(4) {
                0 | 1 => {
                    let i = rng.below(bytes.len());
                    bytes[i] = u8::try_from(rng.next() & 0xff).unwrap();
                }
                2 => bytes.truncate(rng.below(bytes.len() + 1)),
                _ => {
                    let i = rng.below(bytes.len() + 1);
                    bytes.insert(i, u8::try_from(rng.next() & 0xff).unwrap());
                }
            }
            if bytes.is_empty() {
                break;
            }
        }
        if let Some(m) = parse_query(&bytes) {
            parsed += 1;
            let _ = refused(&m);
            let _ = crate::dns::names::wire_name(question(&m).name());
            for rc in [ResponseCode::Refused, ResponseCode::NXDomain] {
                assert!(local_reply(&m, rc).is_none_or(|r| r.len() <= MAX_MESSAGE));
            }
        }
        // As the upstream's reply: any id is taken from the bytes.
        let id = bytes
            .get(..2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
        if let Some(r) = upstream_reply(&bytes, id, &q) {
            if let Some(ans) = answer_of(r, &q, 86_400) {
                answered += 1;
                let out = answer_reply(&client, &ans);
                assert!(out.is_none_or(|r| r.len() <= MAX_MESSAGE));
            }
        }
    }
    // The mutations reach the code past the parsers, not only their errors.
    assert!(
        parsed > 100 && answered > 100,
        "{parsed} parsed, {answered} answered"
    );
}
