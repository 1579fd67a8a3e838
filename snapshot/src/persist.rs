//! The save/restore contract every stateful component implements, and
//! helpers for KVM's plain-old-data structures.

/// A component whose state can be saved and restored.
///
/// `State` is a plain serde struct; `ConstructorArgs` carries what the state
/// cannot (guest memory, file descriptors, interrupt lines).
pub trait Persist: Sized {
    /// The saved state.
    type State;
    /// What restore needs besides the state.
    type ConstructorArgs;
    /// Why a save or restore failed.
    type Error;

    /// Captures the current state.
    fn save(&self) -> Result<Self::State, Self::Error>;
    /// Rebuilds the component from `state`.
    fn restore(args: Self::ConstructorArgs, state: &Self::State) -> Result<Self, Self::Error>;
}

/// A byte image had the wrong size for its type.
#[derive(Debug, thiserror::Error)]
#[error("saved {what} is {got} bytes, expected {want}")]
pub struct PodError {
    /// The type.
    pub what: &'static str,
    /// Bytes found.
    pub got: usize,
    /// Bytes expected.
    pub want: usize,
}

/// The bytes of a plain-old-data value.
///
/// # Safety
/// `T` must be a `repr(C)` struct of integers and integer arrays whose every
/// byte is initialized (KVM's bindgen structs, with explicit padding fields).
pub unsafe fn pod_to_bytes<T: Copy>(v: &T) -> Vec<u8> {
    let n = std::mem::size_of::<T>();
    // SAFETY: the caller guarantees all n bytes of *v are initialized.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), n) }.to_vec()
}

/// A plain-old-data value from bytes, checking the size.
///
/// # Safety
/// Every bit pattern must be a valid `T` (see [`pod_to_bytes`]).
pub unsafe fn pod_from_bytes<T: Copy + Default>(
    what: &'static str,
    b: &[u8],
) -> Result<T, PodError> {
    let want = std::mem::size_of::<T>();
    if b.len() != want {
        return Err(PodError {
            what,
            got: b.len(),
            want,
        });
    }
    let mut v = T::default();
    // SAFETY: `v` is a valid T of exactly `want` bytes; the caller guarantees
    // any byte pattern is a valid T.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), (&mut v as *mut T).cast::<u8>(), want) };
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Default, Debug, PartialEq)]
    struct P {
        a: u32,
        b: [u16; 2],
    }
    #[test]
    fn pod_round_trip_and_size_check() {
        let p = P { a: 5, b: [1, 2] };
        // SAFETY: P is repr(C) integers without padding.
        let b = unsafe { pod_to_bytes(&p) };
        assert_eq!(b.len(), 8);
        // SAFETY: as above; any bytes are a valid P.
        assert_eq!(unsafe { pod_from_bytes::<P>("p", &b) }.unwrap(), p);
        // SAFETY: as above.
        assert!(unsafe { pod_from_bytes::<P>("p", &b[..7]) }.is_err());
    }
}
