//! Finding the command in init's argv.
//!
//! The kernel hands init, as argv[1..], first every bare word of its command
//! line it did not recognise (`nowatchdog` on a kernel without a watchdog,
//! ...), then the words after ` -- `. Only the latter are our command, so we
//! count them in /proc/cmdline with the kernel's own splitting rules
//! (`next_arg()`: whitespace-separated, double quotes group) and take that
//! many from the end of argv.

use std::ffi::c_int;

/// Big enough for x86's COMMAND_LINE_SIZE (2048).
const CMDLINE_MAX: usize = 4096;

/// Index in argv (of `argc` entries, `argc` > 1) where the command starts,
/// given the kernel command line (`None` if unreadable): `argc` if it has a
/// ` -- ` with nothing after it, 1 (all of argv[1..]) if it has no ` -- ` or
/// could not be read.
pub fn command_start(argc: usize, cmdline: Option<&[u8]>) -> usize {
    match cmdline.map(args_after_dashes) {
        Some(Some(n)) => argc - n.min(argc.saturating_sub(1)),
        _ => 1,
    }
}

/// The kernel command line, from /proc (mounted by then): 3 syscalls. Read
/// once at start; the command and the overlay options come from it.
pub fn read_cmdline() -> Option<Vec<u8>> {
    let mut buf = [0u8; CMDLINE_MAX];
    // SAFETY: the path is a NUL-terminated static string.
    let fd: c_int =
        unsafe { libc::open(c"/proc/cmdline".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: buf is a writable buffer of buf.len() bytes; fd is open.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: fd was opened above and is closed once.
    unsafe { libc::close(fd) };
    let n = usize::try_from(n).ok()?;
    buf.get(..n).map(<[u8]>::to_vec)
}

/// Number of arguments the kernel passes to init from after the first `--`
/// word (up to a second `--`, where the kernel stops too); None without `--`.
pub fn args_after_dashes(cmdline: &[u8]) -> Option<usize> {
    let mut rest = skip_spaces(cmdline);
    while !rest.is_empty() {
        let (word, next) = next_arg(rest);
        rest = next;
        if word == b"--" {
            let mut count = 0;
            while !rest.is_empty() {
                let (word, next) = next_arg(rest);
                if word == b"--" {
                    break;
                }
                count += 1;
                rest = next;
            }
            return Some(count);
        }
    }
    None
}

/// Free page reporting's order when the kernel command line does not say
/// (`shoal.fpr_order=N`): 9, 2 MiB blocks (DSec's choice). Linux 6.1 sets
/// `pageblock_order` when the balloon driver registers, which without
/// hugetlb is 10: 4 MiB blocks, and the zone must then hold 128 MiB
/// beyond its low watermark before anything is reported, so a 128 MiB
/// guest never reports and a larger one rarely after its boot.
pub const FPR_ORDER_DEFAULT: u8 = 9;

/// The free page reporting order asked for with `shoal.fpr_order=N` (the
/// last one; N from 0 to 10, else ignored) before any ` -- `, else
/// [`FPR_ORDER_DEFAULT`].
pub fn fpr_order(cmdline: &[u8]) -> u8 {
    let mut order = FPR_ORDER_DEFAULT;
    let mut rest = skip_spaces(cmdline);
    while !rest.is_empty() {
        let (word, next) = next_arg(rest);
        rest = next;
        if word == b"--" {
            break;
        }
        if let Some(v) = word.strip_prefix(b"shoal.fpr_order=") {
            if let Some(n) = std::str::from_utf8(v)
                .ok()
                .and_then(|v| v.parse::<u8>().ok())
                .filter(|n| *n <= 10)
            {
                order = n;
            }
        }
    }
    order
}

/// The kernel's isspace() (ASCII whitespace incl. \v).
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

fn skip_spaces(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&c| !is_space(c)).unwrap_or(s.len());
    s.get(start..).unwrap_or_default()
}

/// One word as the kernel's next_arg() splits it (an opening double quote
/// and its closing one are dropped from a quoted word); returns the word and
/// the rest with leading spaces skipped.
fn next_arg(s: &[u8]) -> (&[u8], &[u8]) {
    let quoted = s.first() == Some(&b'"');
    let start = usize::from(quoted);
    let mut in_quote = quoted;
    let mut end = s.len();
    for (i, &c) in s.iter().enumerate().skip(start) {
        if is_space(c) && !in_quote {
            end = i;
            break;
        }
        if c == b'"' {
            in_quote = !in_quote;
        }
    }
    let mut word = s.get(start..end).unwrap_or_default();
    if quoted {
        if let Some(w) = word.strip_suffix(b"\"") {
            word = w;
        }
    }
    (word, skip_spaces(s.get(end..).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::{args_after_dashes, fpr_order, FPR_ORDER_DEFAULT};

    #[test]
    fn the_reporting_order_comes_from_the_command_line_or_defaults() {
        assert_eq!(fpr_order(b"console=ttyS0\n"), FPR_ORDER_DEFAULT);
        assert_eq!(fpr_order(b"a shoal.fpr_order=5 b\n"), 5);
        assert_eq!(fpr_order(b"shoal.fpr_order=5 shoal.fpr_order=10"), 10);
        // Out of range or not a number: ignored.
        assert_eq!(fpr_order(b"shoal.fpr_order=11"), FPR_ORDER_DEFAULT);
        assert_eq!(fpr_order(b"shoal.fpr_order=-1"), FPR_ORDER_DEFAULT);
        assert_eq!(fpr_order(b"shoal.fpr_order="), FPR_ORDER_DEFAULT);
        // The command's words are not the kernel's.
        assert_eq!(fpr_order(b"x -- echo shoal.fpr_order=3"), FPR_ORDER_DEFAULT);
    }

    #[test]
    fn counts_words_after_dashes() {
        assert_eq!(args_after_dashes(b"console=ttyS0 nowatchdog\n"), None);
        assert_eq!(args_after_dashes(b"a b --\n"), Some(0));
        assert_eq!(
            args_after_dashes(b"a nowatchdog -- /bin/echo hi\n"),
            Some(2)
        );
        assert_eq!(
            args_after_dashes(b"x -- /bin/bash -c \"echo a  b\" z=1\n"),
            Some(4)
        );
        assert_eq!(args_after_dashes(b"x=\"a -- b\" -- ls\n"), Some(1));
        assert_eq!(args_after_dashes(b"-- git log -- f\n"), Some(2));
        assert_eq!(args_after_dashes(b"\"--\" ls"), Some(1));
    }
}
