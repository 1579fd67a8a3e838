//! 8250 UART (COM1) on top of `vm-superio`, with a bounded output sink.
//!
//! A guest that prints forever must not grow host memory or fill the disk:
//! [`BoundedSink`] buffers at most one line (capped at [`LINE_CAP`] bytes)
//! and stops writing after `limit` bytes, noting once that output was cut.

use crate::bus::BusDevice;
use crate::irq::IrqLine;
use snapshot::Persist;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// COM1 port base.
pub const COM1_PORT: u64 = 0x3f8;
/// COM1 interrupt.
pub const COM1_IRQ: u32 = 4;
/// Length of the UART port range.
pub const UART_PORT_LEN: u64 = 8;
/// Largest partial line held before it is written out.
pub const LINE_CAP: usize = 4096;

/// Notice written once when the output limit is reached.
const CUT_NOTICE: &[u8] = b"\n[shoal: serial output limit reached; further guest output dropped]\n";

/// Observes console output as it is written (boot timing, markers).
pub trait ConsoleObserver: Send {
    /// Called with each complete (or capped) chunk of output.
    fn on_output(&mut self, chunk: &[u8]);
}

/// Counters shared with the VMM.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Bytes the guest wrote to the UART.
    pub guest_bytes: AtomicU64,
    /// Bytes dropped after the limit.
    pub dropped_bytes: AtomicU64,
}

/// A line-buffered writer that never writes more than `limit` bytes.
pub struct BoundedSink {
    out: Box<dyn Write + Send>,
    buf: Vec<u8>,
    limit: u64,
    written: u64,
    cut: bool,
    stats: Arc<SinkStats>,
    observer: Option<Box<dyn ConsoleObserver>>,
    /// When the first guest byte arrived.
    pub first_byte: Option<Instant>,
}

impl BoundedSink {
    /// Wraps `out`, allowing at most `limit` bytes of guest output.
    pub fn new(out: Box<dyn Write + Send>, limit: u64) -> Self {
        Self {
            out,
            buf: Vec::with_capacity(256),
            limit,
            written: 0,
            cut: false,
            stats: Arc::new(SinkStats::default()),
            observer: None,
            first_byte: None,
        }
    }

    /// Installs an observer that sees every chunk before it is written.
    pub fn set_observer(&mut self, obs: Box<dyn ConsoleObserver>) {
        self.observer = Some(obs);
    }

    /// Shared counters.
    pub fn stats(&self) -> Arc<SinkStats> {
        self.stats.clone()
    }

    fn push_out(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Some(o) = self.observer.as_mut() {
            o.on_output(&self.buf);
        }
        let room = self.limit.saturating_sub(self.written);
        let n = usize::try_from(room)
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        let res = self.out.write_all(&self.buf[..n]);
        self.written += n as u64;
        if n < self.buf.len() {
            self.stats
                .dropped_bytes
                .fetch_add((self.buf.len() - n) as u64, Ordering::Relaxed);
            if !self.cut {
                self.cut = true;
                let _ = self.out.write_all(CUT_NOTICE);
            }
        }
        self.buf.clear();
        res.and_then(|_| self.out.flush())
    }

    /// Writes out any partial line (at VM exit).
    pub fn finish(&mut self) -> io::Result<()> {
        self.push_out()
    }
}

impl Write for BoundedSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.first_byte.is_none() && !data.is_empty() {
            self.first_byte = Some(Instant::now());
        }
        self.stats
            .guest_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        for &b in data {
            self.buf.push(b);
            if b == b'\n' || self.buf.len() >= LINE_CAP {
                self.push_out()?;
            }
        }
        Ok(data.len())
    }

    /// The UART flushes after every byte; we only write out on line ends
    /// (see [`BoundedSink::finish`]).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for BoundedSink {
    fn drop(&mut self) {
        let _ = self.push_out();
    }
}

/// Saved UART registers (mirror of `vm_superio::SerialState`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialState {
    /// Divisor latch low/high, IER, IIR, LCR, LSR, MCR, MSR, scratch.
    pub regs: [u8; 9],
    /// Pending input bytes.
    pub in_buffer: Vec<u8>,
}

/// What restoring a UART needs besides its registers.
pub struct SerialArgs {
    /// The interrupt it raises.
    pub irq: IrqLine,
    /// Where its output goes.
    pub sink: BoundedSink,
}

/// Why a UART could not be restored.
#[derive(Debug, thiserror::Error)]
#[error("cannot restore serial device: {0}")]
pub struct SerialRestoreError(String);

/// COM1 on the port bus.
pub struct Serial {
    inner: vm_superio::Serial<IrqLine, vm_superio::serial::NoEvents, BoundedSink>,
}

impl Serial {
    /// A UART raising `irq` and writing to `sink`.
    pub fn new(irq: IrqLine, sink: BoundedSink) -> Self {
        Self {
            inner: vm_superio::Serial::new(irq, sink),
        }
    }

    /// The output sink.
    pub fn sink_mut(&mut self) -> &mut BoundedSink {
        self.inner.writer_mut()
    }
}

impl Persist for Serial {
    type State = SerialState;
    type ConstructorArgs = SerialArgs;
    type Error = SerialRestoreError;

    /// Captures the registers.
    fn save(&self) -> Result<SerialState, SerialRestoreError> {
        let s = self.inner.state();
        Ok(SerialState {
            regs: [
                s.baud_divisor_low,
                s.baud_divisor_high,
                s.interrupt_enable,
                s.interrupt_identification,
                s.line_control,
                s.line_status,
                s.modem_control,
                s.modem_status,
                s.scratch,
            ],
            in_buffer: s.in_buffer,
        })
    }

    /// A UART with saved registers (the FIFO size is checked).
    fn restore(args: SerialArgs, s: &SerialState) -> Result<Self, SerialRestoreError> {
        let SerialArgs { irq, sink } = args;
        let r = s.regs;
        let state = vm_superio::SerialState {
            baud_divisor_low: r[0],
            baud_divisor_high: r[1],
            interrupt_enable: r[2],
            interrupt_identification: r[3],
            line_control: r[4],
            line_status: r[5],
            modem_control: r[6],
            modem_status: r[7],
            scratch: r[8],
            in_buffer: s.in_buffer.clone(),
        };
        let inner = vm_superio::Serial::from_state(&state, irq, vm_superio::serial::NoEvents, sink)
            .map_err(|e| SerialRestoreError(format!("{e:?}")))?;
        Ok(Self { inner })
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if let (Some(b), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *b = self.inner.read(off);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&b), Ok(off)) = (data.first(), u8::try_from(offset)) {
            // Output errors (a closed stdout) must not stop the guest.
            let _ = self.inner.write(off, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, d: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(d);
            Ok(d.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn output_is_capped_and_noted_once() {
        let out = Shared::default();
        let mut s = BoundedSink::new(Box::new(out.clone()), 10);
        for _ in 0..1000 {
            s.write_all(b"hello world\n").unwrap();
        }
        s.finish().unwrap();
        let got = out.0.lock().unwrap().clone();
        assert_eq!(got.len(), 10 + CUT_NOTICE.len());
        assert!(got.starts_with(b"hello worl"));
        assert_eq!(s.stats().guest_bytes.load(Ordering::Relaxed), 12000);
        assert_eq!(s.stats().dropped_bytes.load(Ordering::Relaxed), 11990);
    }

    #[test]
    fn endless_line_does_not_grow_buffer() {
        let out = Shared::default();
        let mut s = BoundedSink::new(Box::new(out.clone()), 1 << 20);
        for _ in 0..100_000 {
            s.write_all(b"x").unwrap();
        }
        assert!(s.buf.capacity() <= 2 * LINE_CAP);
        assert!(out.0.lock().unwrap().len() >= 100_000 - LINE_CAP);
    }

    #[test]
    fn state_round_trip() {
        let out = Shared::default();
        let mut uart = Serial::new(
            IrqLine::new(4).unwrap(),
            BoundedSink::new(Box::new(out.clone()), 100),
        );
        uart.write(3, &[0x83]); // LCR with DLAB
        uart.write(0, &[0x0c]); // divisor low
        uart.write(3, &[0x03]);
        uart.write(7, &[0x5a]); // scratch
        let saved = uart.save().unwrap();
        let args = |out: &Shared| SerialArgs {
            irq: IrqLine::new(4).unwrap(),
            sink: BoundedSink::new(Box::new(out.clone()), 100),
        };
        let mut back = Serial::restore(args(&out), &saved).unwrap();
        assert_eq!(back.save().unwrap(), saved);
        // Through the snapshot container and back.
        let mut file = Vec::new();
        snapshot::write_to(&mut file, &saved).unwrap();
        let read: SerialState =
            snapshot::read_from(&mut file.as_slice(), std::path::Path::new("s")).unwrap();
        assert_eq!(read, saved);
        let mut b = [0u8];
        back.read(7, &mut b);
        assert_eq!(b[0], 0x5a);
        let mut bad = saved.clone();
        bad.in_buffer = vec![0; 1 << 20];
        assert!(Serial::restore(args(&out), &bad).is_err());
    }

    #[test]
    fn uart_writes_reach_sink() {
        let out = Shared::default();
        let irq = IrqLine::new(4).unwrap();
        let mut uart = Serial::new(irq, BoundedSink::new(Box::new(out.clone()), 100));
        for b in b"hi\n" {
            uart.write(0, &[*b]);
        }
        assert_eq!(&*out.0.lock().unwrap(), b"hi\n");
    }
}
