//! A streaming `multipart/form-data` reader: bytes in as they come, parts
//! out (a part's start with its name and filename, its data, its end),
//! holding back only what could be the start of a boundary.

/// The most a part's headers may take.
const MAX_HEADERS: usize = 16 << 10;

/// What the reader found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A part starts.
    Start {
        /// Its form field name.
        name: String,
        /// Its filename, if it has one.
        filename: Option<String>,
    },
    /// Some of the part's bytes.
    Data(Vec<u8>),
    /// The part ended.
    End,
    /// The closing boundary came: the body is done.
    Done,
}

/// Why a body is not multipart as sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    /// A part's headers are too long or not what a form sends.
    #[error("bad multipart part headers: {0}")]
    Headers(String),
    /// Bytes after the closing boundary, or no boundary where one belongs.
    #[error("malformed multipart body: {0}")]
    Malformed(&'static str),
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<String> {
    let mut it = content_type.split(';');
    if !it
        .next()?
        .trim()
        .eq_ignore_ascii_case("multipart/form-data")
    {
        return None;
    }
    it.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })
    .filter(|b| !b.is_empty() && b.len() <= 200)
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    /// Before the first boundary.
    Preamble,
    /// Right after a boundary: `--` (the end) or CRLF (a part).
    AfterBoundary,
    /// In a part's headers.
    Headers,
    /// In a part's body.
    Body,
    /// After the closing boundary.
    Done,
}

/// The reader.
#[derive(Debug)]
pub struct Multipart {
    /// `\r\n--BOUNDARY`.
    delim: Vec<u8>,
    buf: Vec<u8>,
    state: State,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Multipart {
    /// A reader for `boundary`.
    pub fn new(boundary: &str) -> Multipart {
        Multipart {
            delim: format!("\r\n--{boundary}").into_bytes(),
            // The first boundary may come without the CRLF before it.
            buf: b"\r\n".to_vec(),
            state: State::Preamble,
        }
    }

    /// Takes `data`; returns the parts it completes.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Part>, MultipartError> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Preamble => match find(&self.buf, &self.delim) {
                    Some(i) => {
                        self.buf.drain(..i + self.delim.len());
                        self.state = State::AfterBoundary;
                    }
                    None => {
                        let keep = self.delim.len().min(self.buf.len());
                        self.buf.drain(..self.buf.len() - keep);
                        return Ok(out);
                    }
                },
                State::AfterBoundary => {
                    if self.buf.len() < 2 {
                        return Ok(out);
                    }
                    if self.buf.starts_with(b"--") {
                        self.buf.clear();
                        self.state = State::Done;
                        out.push(Part::Done);
                        return Ok(out);
                    }
                    // Transport padding, then CRLF.
                    match find(&self.buf, b"\r\n") {
                        Some(i) if self.buf[..i].iter().all(|b| *b == b' ' || *b == b'\t') => {
                            self.buf.drain(..i + 2);
                            self.state = State::Headers;
                        }
                        Some(_) => return Err(MultipartError::Malformed("text after a boundary")),
                        None if self.buf.len() > 64 => {
                            return Err(MultipartError::Malformed("text after a boundary"))
                        }
                        None => return Ok(out),
                    }
                }
                State::Headers => match find(&self.buf, b"\r\n\r\n") {
                    Some(i) => {
                        let head = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                        self.buf.drain(..i + 4);
                        out.push(part_start(&head)?);
                        self.state = State::Body;
                    }
                    None if self.buf.len() > MAX_HEADERS => {
                        return Err(MultipartError::Headers("over 16 KiB".into()))
                    }
                    None => return Ok(out),
                },
                State::Body => match find(&self.buf, &self.delim) {
                    Some(i) => {
                        if i > 0 {
                            out.push(Part::Data(self.buf[..i].to_vec()));
                        }
                        self.buf.drain(..i + self.delim.len());
                        out.push(Part::End);
                        self.state = State::AfterBoundary;
                    }
                    None => {
                        let keep = (self.delim.len() - 1).min(self.buf.len());
                        let n = self.buf.len() - keep;
                        if n > 0 {
                            out.push(Part::Data(self.buf.drain(..n).collect()));
                        }
                        return Ok(out);
                    }
                },
                State::Done => {
                    // An epilogue is allowed and ignored.
                    self.buf.clear();
                    return Ok(out);
                }
            }
        }
    }
}

/// A part's start from its headers.
fn part_start(head: &str) -> Result<Part, MultipartError> {
    let cd = head
        .split("\r\n")
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-disposition")
                .then(|| v.trim().to_string())
        })
        .ok_or_else(|| MultipartError::Headers("no Content-Disposition".into()))?;
    let (mut name, mut filename) = (None, None);
    for p in split_params(&cd).into_iter().skip(1) {
        let Some((k, v)) = p.split_once('=') else {
            continue;
        };
        let v = unquote(v.trim());
        match k.trim().to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    Ok(Part::Start {
        name: name.ok_or_else(|| MultipartError::Headers("a part without a name".into()))?,
        filename,
    })
}

/// `form-data; name="a;b"; filename=x` split at the `;`s outside quotes.
fn split_params(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut esc) = (Vec::new(), String::new(), false, false);
    for c in s.chars() {
        match c {
            _ if esc => {
                cur.push(c);
                esc = false;
            }
            '\\' if quoted => {
                cur.push(c);
                esc = true;
            }
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ';' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut s = String::new();
            let mut esc = false;
            for c in inner.chars() {
                if esc || c != '\\' {
                    s.push(c);
                    esc = false;
                } else {
                    esc = true;
                }
            }
            s
        }
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> Vec<u8> {
        b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/a;b.txt\"\r\n\
          Content-Type: application/octet-stream\r\n\r\nhello\r\n--Xy world\r\n--XyZ\r\n\
          Content-Disposition: form-data; name=\"file\"; filename=\"b\"\r\n\r\n\r\n--XyZ--\r\n"
            .to_vec()
    }

    fn collect(parts: Vec<Part>) -> Vec<Part> {
        // Data runs merged, to compare across chunkings.
        let mut out: Vec<Part> = Vec::new();
        for p in parts {
            match (out.last_mut(), p) {
                (Some(Part::Data(a)), Part::Data(b)) => a.extend_from_slice(&b),
                (_, p) => out.push(p),
            }
        }
        out
    }

    #[test]
    fn parts_come_out_whatever_the_chunking() {
        let want = vec![
            Part::Start {
                name: "file".into(),
                filename: Some("/tmp/a;b.txt".into()),
            },
            Part::Data(b"hello\r\n--Xy world".to_vec()),
            Part::End,
            Part::Start {
                name: "file".into(),
                filename: Some("b".into()),
            },
            Part::End,
            Part::Done,
        ];
        let b = body();
        for step in [1, 2, 3, 7, 1000] {
            let mut m = Multipart::new("XyZ");
            let mut got = Vec::new();
            for c in b.chunks(step) {
                got.extend(m.push(c).unwrap());
            }
            assert_eq!(collect(got), want, "chunks of {step}");
        }
    }

    #[test]
    fn boundaries_are_read_from_the_content_type() {
        assert_eq!(
            boundary("multipart/form-data; boundary=\"abc\"").as_deref(),
            Some("abc")
        );
        assert_eq!(
            boundary("Multipart/Form-Data;charset=x; boundary=q1").as_deref(),
            Some("q1")
        );
        assert_eq!(boundary("application/octet-stream"), None);
        assert_eq!(boundary("multipart/form-data"), None);
    }

    #[test]
    fn bad_bodies_are_refused() {
        let mut m = Multipart::new("b");
        assert!(m.push(b"--b\r\nX-No: disposition\r\n\r\nx").is_err());
        let mut m = Multipart::new("b");
        assert!(m.push(&vec![b'a'; MAX_HEADERS + 100]).unwrap().is_empty());
        let mut m = Multipart::new("b");
        let mut big = b"--b\r\n".to_vec();
        big.extend(vec![b'h'; MAX_HEADERS + 10]);
        assert!(m.push(&big).is_err());
        let mut m = Multipart::new("b");
        assert!(m.push(b"--bjunk\r\n").is_err());
    }
}
