//! The control-message codec: [`Reader`], the [`Wire`] trait and its
//! implementations for the primitive types, and [`decode`].

use thiserror::Error;

use crate::frame::{begin_frame, end_frame, Kind};

/// Errors decoding a control message.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The payload ended before the message did.
    #[error("payload truncated: needed {needed} more bytes, {left} left")]
    Truncated {
        /// Bytes the next field needed.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// The message ended before the payload did.
    #[error("{0} trailing bytes after the message")]
    TrailingBytes(usize),
    /// A bool byte other than 0 or 1.
    #[error("invalid bool byte {0}")]
    InvalidBool(u8),
    /// An enum or option tag that is not defined.
    #[error("invalid {what} tag {tag}")]
    InvalidTag {
        /// Which type.
        what: &'static str,
        /// The tag found.
        tag: u8,
    },
    /// A string that is not UTF-8.
    #[error("string is not UTF-8")]
    InvalidUtf8,
    /// A field outside the bounds its message allows.
    #[error("invalid value: {0}")]
    Invalid(&'static str),
}

/// A cursor over a payload being decoded.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// Bytes not consumed yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Truncated {
                needed: n,
                left: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    /// Takes exactly `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// Errors if bytes are left.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }

    /// Reads a u32 length prefix and checks that at least `len * min_item`
    /// bytes follow, so a bogus length cannot make us allocate.
    fn len_prefix(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = u32::get(self)?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let need = n.saturating_mul(min_item.max(1));
        if need > self.buf.len() {
            return Err(DecodeError::Truncated {
                needed: need,
                left: self.buf.len(),
            });
        }
        Ok(n)
    }
}

/// A value with a wire encoding (see the module docs for the rules).
pub trait Wire: Sized {
    /// Smallest encoded size, used to bound list allocations.
    const MIN_LEN: usize;
    /// Appends the encoding of `self`.
    fn put(&self, w: &mut Vec<u8>);
    /// Decodes one value.
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError>;

    /// Appends a slice of values (without the count). Overridden for bytes.
    fn put_slice(items: &[Self], w: &mut Vec<u8>) {
        for i in items {
            i.put(w);
        }
    }

    /// Decodes `n` values. Overridden for bytes.
    fn get_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, DecodeError> {
        // Reserve no more memory than the bytes left: `n` was only checked
        // against `MIN_LEN` per item (0 for structs), and an item in memory
        // can be far larger than its smallest encoding (a DirEntry is 40
        // bytes, its encoding at least 13), so a count equal to the bytes
        // left reserved 40 times the payload before the first item failed.
        let fit = r.remaining() / std::mem::size_of::<Self>().max(1);
        let mut v = Vec::with_capacity(n.min(fit));
        for _ in 0..n {
            v.push(Self::get(r)?);
        }
        Ok(v)
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = std::mem::size_of::<$t>();
            fn put(&self, w: &mut Vec<u8>) {
                w.extend_from_slice(&self.to_le_bytes());
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}
wire_int!(u16, u32, u64, i32, i64);

impl Wire for u8 {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(*self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let [b] = r.array()?;
        Ok(b)
    }
    fn put_slice(items: &[Self], w: &mut Vec<u8>) {
        w.extend_from_slice(items);
    }
    fn get_vec(r: &mut Reader<'_>, n: usize) -> Result<Vec<Self>, DecodeError> {
        Ok(r.take(n)?.to_vec())
    }
}

impl Wire for bool {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        w.push(u8::from(*self));
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(DecodeError::InvalidBool(b)),
        }
    }
}

impl<const N: usize> Wire for [u8; N] {
    const MIN_LEN: usize = N;
    fn put(&self, w: &mut Vec<u8>) {
        w.extend_from_slice(self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.array()
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        // Lengths are bounded by MAX_PAYLOAD in practice; saturate rather
        // than wrap for the impossible case.
        u32::try_from(self.len()).unwrap_or(u32::MAX).put(w);
        T::put_slice(self, w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(T::MIN_LEN)?;
        T::get_vec(r, n)
    }
}

impl Wire for String {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Vec<u8>) {
        u32::try_from(self.len()).unwrap_or(u32::MAX).put(w);
        w.extend_from_slice(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let n = r.len_prefix(1)?;
        let b = r.take(n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::InvalidUtf8)
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Vec<u8>) {
        match self {
            None => w.push(0),
            Some(v) => {
                w.push(1);
                v.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(None),
            1 => Ok(Some(T::get(r)?)),
            tag => Err(DecodeError::InvalidTag {
                what: "option",
                tag,
            }),
        }
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_LEN: usize = A::MIN_LEN + B::MIN_LEN;
    fn put(&self, w: &mut Vec<u8>) {
        self.0.put(w);
        self.1.put(w);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok((A::get(r)?, B::get(r)?))
    }
}

/// Implements [`Wire`] for a struct as its fields in order.
macro_rules! wire_struct {
    ($name:ident { $($field:ident),* $(,)? }) => {
        impl Wire for $name {
            const MIN_LEN: usize = 0;
            fn put(&self, w: &mut Vec<u8>) {
                $( self.$field.put(w); )*
            }
            fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
                Ok(Self { $( $field: Wire::get(r)?, )* })
            }
        }
    };
}

/// A control message: a [`Wire`] struct bound to its frame kind.
pub trait Message: Wire {
    /// The kind of frame that carries it.
    const KIND: Kind;
}

macro_rules! message {
    ($name:ident = $kind:ident { $($field:ident),* $(,)? }) => {
        wire_struct!($name { $($field),* });
        impl Message for $name {
            const KIND: Kind = Kind::$kind;
        }
    };
}

/// Decodes a whole payload as `M`, rejecting trailing bytes.
pub fn decode<M: Wire>(payload: &[u8]) -> Result<M, DecodeError> {
    let mut r = Reader::new(payload);
    let m = M::get(&mut r)?;
    r.finish()?;
    Ok(m)
}

/// Appends a control frame carrying `msg`.
pub fn put_message<M: Message>(out: &mut Vec<u8>, id: u32, msg: &M) {
    let at = begin_frame(out, M::KIND, id);
    msg.put(out);
    end_frame(out, at);
}
