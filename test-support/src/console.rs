//! Console capture: what a guest printed, collected in memory.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};

/// Collects console output in memory; clones share one buffer (give a
/// clone to the VM, read through another).
#[derive(Clone, Default)]
pub struct Console(Arc<Mutex<Vec<u8>>>);

impl Console {
    fn buf(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Everything so far.
    pub fn bytes(&self) -> Vec<u8> {
        self.buf().clone()
    }

    /// Everything so far, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf()).into_owned()
    }

    /// How many bytes so far.
    pub fn len(&self) -> usize {
        self.buf().len()
    }

    /// Whether nothing was printed yet.
    pub fn is_empty(&self) -> bool {
        self.buf().is_empty()
    }
}

impl Write for Console {
    fn write(&mut self, d: &[u8]) -> std::io::Result<usize> {
        self.buf().extend_from_slice(d);
        Ok(d.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_what_was_written() {
        let c = Console::default();
        let mut w = c.clone();
        assert!(c.is_empty());
        w.write_all(b"hello\n\xff").unwrap();
        assert_eq!(c.bytes(), b"hello\n\xff");
        assert_eq!(c.len(), 7);
        assert_eq!(c.text(), "hello\n\u{fffd}");
    }
}
