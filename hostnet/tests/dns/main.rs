//! The DNS forwarder over real UDP sockets on loopback: sandbox clients on
//! 127.0.0.x, the forwarder, and a tiny authoritative upstream; no outside
//! resolver is ever asked.

mod support;
mod upstream;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::*;
use tokio::net::UdpSocket;

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test]
async fn allowed_name_is_answered_after_its_address_is_allowed() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;
    let to = s.fwd.local_addr();

    let r = ask(&a, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    assert_eq!(r.answers[0].ttl, 30, "the record's TTL reaches the sandbox");
    // Already there when the answer arrived; 30 s raised to the 60 s floor.
    assert_eq!(
        s.sink.calls(),
        vec![("sb-a".into(), ip("198.51.100.10"), Duration::from_secs(60))]
    );

    // Case and the trailing dot do not matter; the question comes back as asked.
    let r = ask(&a, to, "PyPI.Example.TEST", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    assert!(r.queries[0]
        .name()
        .eq_case(&Name::from_ascii("PyPI.Example.TEST.").unwrap()));

    let r = ask(&a, to, "long.example.test.", RecordType::A).await;
    assert_eq!(
        (addresses(&r), r.answers[0].ttl),
        (vec![ip("198.51.100.40")], 3600)
    );
    // Seven days are capped to one, in the allowed set and in the answer.
    let r = ask(&a, to, "forever.example.test.", RecordType::A).await;
    assert_eq!(
        (addresses(&r), r.answers[0].ttl),
        (vec![ip("198.51.100.41")], 86_400)
    );
    let r = ask(&a, to, "v6.example.test.", RecordType::AAAA).await;
    assert_eq!(addresses(&r), vec![ip("2001:db8::10")]);
    // A name with no A record: NOERROR, nothing to allow, the zone's SOA.
    let r = ask(&a, to, "v6.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(r.answers.is_empty());
    assert_eq!(r.authorities.len(), 1);
    // An allowed name that does not exist: the upstream's NXDOMAIN.
    let r = ask(&a, to, "gone.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(s.upstream.seen("gone.example.test"), 1);

    assert_eq!(
        s.sink.calls()[2..],
        [
            (
                "sb-a".into(),
                ip("198.51.100.40"),
                Duration::from_secs(3600)
            ),
            ("sb-a".into(), ip("198.51.100.41"), DAY),
            ("sb-a".into(), ip("2001:db8::10"), Duration::from_secs(60)),
        ]
    );
    let st = s.stats();
    assert_eq!((st.queries, st.allowed, st.in_flight), (7, 7, 0), "{st:?}");
}

#[tokio::test]
async fn wildcard_matches_below_the_name_not_the_name_and_deny_wins() {
    let s = setup(|_| {}).await;
    let b = client(CLIENT_B).await;
    let to = s.fwd.local_addr();

    let r = ask(&b, to, "a.cdn.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.20")]);
    assert_eq!(s.sink.calls()[0].0, "sb-b", "the client's own slot");

    for (name, what) in [
        ("cdn.example.test.", "the wildcard's apex"),
        (
            "denied.cdn.example.test.",
            "a denied name under an allowed wildcard",
        ),
    ] {
        let r = ask(&b, to, name, RecordType::A).await;
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain, "{what}");
        assert!(r.answers.is_empty(), "{what}");
        assert_eq!(s.upstream.seen(name), 0, "{what} reached the upstream");
    }
    assert_eq!(s.sink.calls().len(), 1);
    assert_eq!(s.stats().denied, 2);
}

#[tokio::test]
async fn denied_names_and_meta_queries_are_answered_without_the_upstream() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;
    let to = s.fwd.local_addr();

    for name in [
        "secret.example.test.",
        "SeCreT.Example.Test",
        "pypi.example.test.evil.",
    ] {
        let r = ask(&a, to, name, RecordType::A).await;
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain, "{name}");
    }
    // An allowed name, but ANY and AXFR are refused.
    for t in [RecordType::ANY, RecordType::AXFR] {
        let r = ask(&a, to, "pypi.example.test.", t).await;
        assert_eq!(r.metadata.response_code, ResponseCode::Refused, "{t}");
    }
    assert_eq!(s.upstream.seen_total(), 0, "the upstream saw a query");
    assert!(s.sink.calls().is_empty());
    let st = s.stats();
    assert_eq!((st.denied, st.refused, st.allowed), (3, 2, 0), "{st:?}");
}

#[tokio::test]
async fn a_client_no_slot_has_gets_no_answer() {
    let s = setup(|_| {}).await;
    let stranger = client(STRANGER).await;
    let to = s.fwd.local_addr();
    stranger
        .send_to(&query("pypi.example.test.", RecordType::A, 1, false), to)
        .await
        .unwrap();
    s.wait_stats("the stranger's query", |st| st.unknown_clients == 1)
        .await;
    assert_silent(&stranger);
    assert_eq!(s.upstream.seen_total(), 0);
    assert_eq!(s.stats().queries, 0);
}

#[tokio::test]
async fn cname_chain_addresses_all_reach_the_sink_and_nothing_else_does() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;

    let r = ask(
        &a,
        s.fwd.local_addr(),
        "www.chain.example.test.",
        RecordType::A,
    )
    .await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    let types: Vec<RecordType> = r.answers.iter().map(|r| r.record_type()).collect();
    assert_eq!(
        types,
        [
            RecordType::CNAME,
            RecordType::CNAME,
            RecordType::A,
            RecordType::A
        ]
    );
    assert_eq!(
        addresses(&r),
        vec![ip("198.51.100.30"), ip("198.51.100.31")]
    );
    let ttl = Duration::from_secs(120);
    assert_eq!(
        s.sink.calls(),
        vec![
            ("sb-a".into(), ip("198.51.100.30"), ttl),
            ("sb-a".into(), ip("198.51.100.31"), ttl),
        ],
        "the unrelated 203.0.113.66 in the upstream's answer is not allowed"
    );
}

#[tokio::test]
async fn forged_and_stray_upstream_replies_are_ignored() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;
    let r = ask(
        &a,
        s.fwd.local_addr(),
        "forged.example.test.",
        RecordType::A,
    )
    .await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.50")]);
    assert_eq!(
        s.sink.calls(),
        vec![("sb-a".into(), ip("198.51.100.50"), Duration::from_secs(60))]
    );
}

#[tokio::test]
async fn upstream_silence_is_servfail_at_the_deadline() {
    let deadline = Duration::from_secs(1);
    let s = setup(|c| c.upstream_timeout = deadline).await;
    let a = client(CLIENT_A).await;
    let start = tokio::time::Instant::now();
    let r = ask(&a, s.fwd.local_addr(), "slow.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(start.elapsed() >= deadline, "answered before the deadline");
    assert_eq!(s.upstream.seen("slow.example.test"), 1);
    assert!(s.sink.calls().is_empty());
    let st = s.stats();
    assert_eq!((st.upstream_failures, st.in_flight), (1, 0), "{st:?}");
}

#[tokio::test]
async fn a_silent_first_upstream_gives_way_to_the_next() {
    // Bound and never read: queries to it go nowhere.
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let s = setup(|c| {
        c.upstreams.insert(0, silent_addr);
        c.upstream_timeout = Duration::from_secs(4);
    })
    .await;
    let a = client(CLIENT_A).await;
    let r = ask(&a, s.fwd.local_addr(), "pypi.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    let mut buf = [0u8; 4096];
    let n = silent
        .try_recv(&mut buf)
        .expect("the first upstream was asked first");
    let asked = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(
        asked.queries,
        vec![Query::query(
            Name::from_ascii("pypi.example.test.").unwrap(),
            RecordType::A
        )]
    );
}

#[tokio::test]
async fn bad_datagrams_are_dropped_and_it_keeps_serving() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;
    let to = s.fwd.local_addr();

    let good = query("pypi.example.test.", RecordType::A, 7, false);
    let mut two_questions = Message::from_vec(&good).unwrap();
    two_questions.add_query(Query::query(
        Name::from_ascii("b.example.test.").unwrap(),
        RecordType::A,
    ));
    let mut oversized = good.clone();
    oversized.resize(5000, 0);
    let mut at_cap_plus_one = good.clone();
    at_cap_plus_one.resize(shoal_hostnet::dns::MAX_MESSAGE + 1, 0);
    let mut response = Message::from_vec(&good).unwrap();
    response.metadata.message_type = hickory_proto::op::MessageType::Response;
    let mut huge_count = good.clone();
    huge_count[4..6].copy_from_slice(&[0xff, 0xff]);
    let bad: Vec<Vec<u8>> = vec![
        vec![],
        b"hello".to_vec(),
        vec![0xff; 300],
        two_questions.to_vec().unwrap(),
        oversized,
        at_cap_plus_one,
        response.to_vec().unwrap(),
        huge_count,
        good[..good.len() - 2].to_vec(),
    ];
    for p in &bad {
        a.send_to(p, to).await.unwrap();
    }
    let n = u64::try_from(bad.len()).unwrap();
    s.wait_stats("the bad datagrams", |st| st.dropped == n)
        .await;
    assert_silent(&a);
    assert_eq!(s.upstream.seen_total(), 0);

    let r = ask(&a, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    let st = s.stats();
    assert_eq!(
        (st.received, st.dropped, st.queries),
        (n + 1, n, 1),
        "{st:?}"
    );
}

#[tokio::test]
async fn a_flooding_client_is_throttled_while_another_is_answered() {
    let s = setup(|c| {
        c.rate.per_second = 2;
        c.rate.burst = 5;
        // Only the rate can hold the flood back here.
        c.max_in_flight = 1000;
        c.max_in_flight_per_client = 1000;
    })
    .await;
    let (a, b) = (client(CLIENT_A).await, client(CLIENT_B).await);
    let to = s.fwd.local_addr();

    const FLOOD: u16 = 100;
    for id in 0..FLOOD {
        a.send_to(&query("pypi.example.test.", RecordType::A, id, false), to)
            .await
            .unwrap();
    }
    s.wait_stats("the flood", |st| st.queries == u64::from(FLOOD))
        .await;
    let throttled = s.stats().throttled;
    // 5 at once and 2 a second: passing half would take the flood 20 s.
    assert!(
        throttled >= u64::from(FLOOD / 2),
        "only {throttled} throttled"
    );

    let r = ask(&b, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);

    let passed = u64::from(FLOOD) - throttled;
    for _ in 0..passed {
        let r = next_reply(&a).await;
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    }
    s.wait_stats("the flood's answers", |st| st.allowed == passed + 1)
        .await;
    assert_silent(&a);
    assert_eq!(
        s.upstream.seen("pypi.example.test"),
        usize::try_from(passed + 1).unwrap()
    );
}

#[tokio::test]
async fn queries_in_flight_are_capped_per_client_and_in_all() {
    let s = setup(|c| {
        c.upstream_timeout = Duration::from_secs(8);
        c.max_in_flight = 4;
        c.max_in_flight_per_client = 3;
    })
    .await;
    let (a, b) = (client(CLIENT_A).await, client(CLIENT_B).await);
    let to = s.fwd.local_addr();
    let slow = |id| query("slow.example.test.", RecordType::A, id, false);

    for id in 0..6 {
        a.send_to(&slow(id), to).await.unwrap();
    }
    s.wait_stats("A's slow queries", |st| st.queries == 6).await;
    let st = s.stats();
    assert_eq!((st.in_flight, st.throttled), (3, 3), "{st:?}");

    // B still has the fourth place.
    let r = ask(&b, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    s.wait_stats("B's query done", |st| st.in_flight == 3).await;
    // Its two slow ones: one place left in all.
    for id in 10..12 {
        b.send_to(&slow(id), to).await.unwrap();
    }
    s.wait_stats("B's slow queries", |st| st.queries == 9).await;
    let st = s.stats();
    assert_eq!((st.in_flight, st.throttled), (4, 4), "{st:?}");

    for sock in [&a, &a, &a, &b] {
        assert_eq!(
            next_reply(sock).await.metadata.response_code,
            ResponseCode::ServFail
        );
    }
    s.wait_stats("all done", |st| {
        st.in_flight == 0 && st.upstream_failures == 4
    })
    .await;
    assert_eq!(s.upstream.seen("slow.example.test"), 4);
}

#[tokio::test]
async fn a_failing_sink_makes_the_answer_servfail() {
    let s = setup(|_| {}).await;
    let a = client(CLIENT_A).await;
    let to = s.fwd.local_addr();

    s.sink.fail.store(true, Ordering::SeqCst);
    let r = ask(&a, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(
        r.answers.is_empty(),
        "an address the sandbox could not reach"
    );
    assert_eq!(s.stats().sink_failures, 1);

    s.sink.fail.store(false, Ordering::SeqCst);
    let r = ask(&a, to, "pypi.example.test.", RecordType::A).await;
    assert_eq!(addresses(&r), vec![ip("198.51.100.10")]);
    let st = s.stats();
    assert_eq!((st.allowed, st.sink_failures), (1, 1), "{st:?}");
}

#[tokio::test]
async fn a_stuck_sink_is_servfail_and_keeps_its_place_in_flight() {
    let s = setup(|c| c.sink_timeout = Duration::from_millis(300)).await;
    let a = client(CLIENT_A).await;
    s.sink.hold(true);
    let r = ask(&a, s.fwd.local_addr(), "pypi.example.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(r.answers.is_empty());
    let st = s.stats();
    assert_eq!((st.sink_failures, st.in_flight), (1, 1), "{st:?}");
    s.sink.hold(false);
    s.wait_stats("the sink call's end", |st| st.in_flight == 0)
        .await;
    assert_silent(&a);
}

#[tokio::test]
async fn shutdown_ends_queries_in_flight_and_frees_the_socket() {
    let s = setup(|c| c.upstream_timeout = Duration::from_secs(60)).await;
    let a = client(CLIENT_A).await;
    let to = s.fwd.local_addr();
    a.send_to(&query("slow.example.test.", RecordType::A, 1, false), to)
        .await
        .unwrap();
    s.wait_stats("the slow query in flight", |st| st.in_flight == 1)
        .await;

    tokio::time::timeout(PATIENCE, s.fwd.shutdown())
        .await
        .expect("shutdown waited on the query in flight");
    // The port is free again, and the query was never answered.
    let again = UdpSocket::bind(to)
        .await
        .expect("binding the forwarder's port after shutdown");
    drop(again);
    assert_silent(&a);
}

#[tokio::test]
async fn bad_settings_are_refused() {
    use shoal_hostnet::dns::{DnsError, DnsForwarder, ForwarderConfig};
    let listen = "127.0.0.1:0".parse().unwrap();
    let up = "127.0.0.1:53".parse().unwrap();
    let cases: Vec<(&str, ForwarderConfig)> = vec![
        ("no upstream", ForwarderConfig::new(listen, vec![])),
        (
            "port 0 upstream",
            ForwarderConfig::new(listen, vec!["127.0.0.1:0".parse().unwrap()]),
        ),
        ("zero rate", {
            let mut c = ForwarderConfig::new(listen, vec![up]);
            c.rate.per_second = 0;
            c
        }),
        ("floor over cap", {
            let mut c = ForwarderConfig::new(listen, vec![up]);
            c.min_allow_ttl = DAY * 2;
            c
        }),
    ];
    for (what, c) in cases {
        let policy = std::sync::Arc::new(NoSlots);
        let sink = std::sync::Arc::new(Sink::default());
        match DnsForwarder::bind(c, policy, sink).await {
            Err(DnsError::Config(_)) => {}
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}

struct NoSlots;
impl shoal_hostnet::dns::DnsPolicy for NoSlots {
    fn lookup(&self, _: std::net::IpAddr) -> Option<Box<dyn shoal_hostnet::dns::SlotView + '_>> {
        None
    }
}
