//! What an E2B client sends shoald's envd data plane, fed in arbitrary
//! pieces: Connect envelopes (`shoald::e2b::envd::connect::Decoder`) and
//! `multipart/form-data` uploads (`shoald::e2b::envd::multipart`), and the
//! paths it names (`users::absolute`). Checks: nothing panics, the pieces
//! give exactly what the whole input gives, nothing over the message limit
//! comes out, and a path made absolute is normalized.

use bolero::{check, TypeGenerator};
use shoald::e2b::envd::connect::{Decoder, MAX_MESSAGE};
use shoald::e2b::envd::multipart::{Multipart, Part};
use shoald::e2b::envd::users::{absolute, GuestUser};

#[derive(Debug, Clone, TypeGenerator)]
struct Input {
    data: Vec<u8>,
    /// Piece sizes (each `% 64 + 1`).
    cuts: Vec<u8>,
    /// Prefix the data with a well-formed envelope of this many bytes.
    lead: Option<u8>,
    path: String,
}

#[test]
fn e2b_envd() {
    check!()
        .with_type::<Input>()
        .with_test_time(shoal_fuzz::budget())
        .for_each(run);
}

fn pieces<'a>(data: &'a [u8], cuts: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let (mut at, mut i) = (0, 0);
    while at < data.len() {
        let n = cuts.get(i).map_or(data.len(), |c| usize::from(*c % 64) + 1);
        let end = (at + n).min(data.len());
        out.push(&data[at..end]);
        at = end;
        i += 1;
    }
    out
}

/// Envelopes out of `parts`, and whether an error stopped them.
fn envelopes(parts: &[&[u8]]) -> (Vec<(u8, Vec<u8>)>, bool) {
    let mut d = Decoder::default();
    let mut out = Vec::new();
    for p in parts {
        d.push(p);
        loop {
            match d.next_envelope() {
                Ok(Some(e)) => {
                    assert!(e.1.len() <= MAX_MESSAGE);
                    out.push(e);
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
    }
    (out, false)
}

/// Multipart parts (data runs merged), and whether an error stopped them.
fn multipart(parts: &[&[u8]]) -> (Vec<Part>, bool) {
    let mut m = Multipart::new("bNd");
    let mut out: Vec<Part> = Vec::new();
    for p in parts {
        match m.push(p) {
            Ok(v) => {
                for x in v {
                    match (out.last_mut(), x) {
                        (Some(Part::Data(a)), Part::Data(b)) => a.extend_from_slice(&b),
                        (_, x) => out.push(x),
                    }
                }
            }
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

fn run(input: &Input) {
    let mut data = Vec::new();
    if let Some(n) = input.lead {
        data.push(0);
        data.extend_from_slice(&u32::from(n).to_be_bytes());
        data.extend(std::iter::repeat_n(b'x', usize::from(n)));
    }
    data.extend_from_slice(&input.data);
    let whole = [&data[..]];
    let cut = pieces(&data, &input.cuts);
    let (a, ea) = envelopes(&whole);
    let (b, eb) = envelopes(&cut);
    assert_eq!((&a, ea), (&b, eb));
    if input.lead.is_some() {
        assert!(!a.is_empty());
    }

    let mut body =
        b"--bNd\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n".to_vec();
    body.extend_from_slice(&input.data);
    for d in [&body[..], &input.data[..]] {
        let (a, ea) = multipart(&[d]);
        let (b, eb) = multipart(&pieces(d, &input.cuts));
        // An error may come at a different piece, but what came before it
        // agrees; without one the parts are the same.
        if !ea && !eb {
            assert_eq!(a, b);
        }
    }

    let user = GuestUser {
        name: "user".into(),
        uid: 1000,
        gid: 1000,
        home: "/home/user".into(),
    };
    if let Ok(p) = absolute(&input.path, &user) {
        assert!(p.starts_with('/'));
        assert!(!p.contains("//") && !p.contains("/./") && !p.contains("/../"));
        assert!(p == "/" || !p.ends_with('/'));
    }
}
