//! The kernel command line given to `shoal-vmm --cmdline`: the words after
//! the first ` -- ` are the init's arguments, so the VMM inserts the words
//! it adds (virtio devices, CPU profile) before them. Launchers of other
//! monitors (the QEMU peer of the benchmarks) follow the same convention.

/// Inserts `extra` words into `cmdline` before the ` -- ` that starts the
/// init's own arguments (or at the end if there is none).
pub fn insert_kernel_args(cmdline: &str, extra: &str) -> String {
    if extra.is_empty() {
        return cmdline.to_string();
    }
    // The init's arguments start at the first " -- " (or a final " --",
    // or a leading "-- "); kernel words must go before it.
    let split = cmdline
        .find(" -- ")
        .or_else(|| cmdline.ends_with(" --").then(|| cmdline.len() - 3))
        .or_else(|| (cmdline.starts_with("-- ") || cmdline == "--").then_some(0));
    let (head, tail) = match split {
        Some(i) => cmdline.split_at(i),
        None => (cmdline, ""),
    };
    let head = head.trim_end();
    let sep = if head.is_empty() { "" } else { " " };
    let tail = tail.trim_start();
    if tail.is_empty() {
        format!("{head}{sep}{extra}")
    } else {
        format!("{head}{sep}{extra} {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_args_go_before_init_args() {
        assert_eq!(
            insert_kernel_args("console=ttyS0", "a=1"),
            "console=ttyS0 a=1"
        );
        assert_eq!(
            insert_kernel_args("console=ttyS0 -- /bin/sh -c 'x -- y'", "a=1"),
            "console=ttyS0 a=1 -- /bin/sh -c 'x -- y'"
        );
        assert_eq!(insert_kernel_args("-- echo", "a=1"), "a=1 -- echo");
        assert_eq!(insert_kernel_args("x", ""), "x");
        // A bare trailing "--" (init with no command) stays last.
        assert_eq!(
            insert_kernel_args("console=ttyS0 --", "a=1"),
            "console=ttyS0 a=1 --"
        );
        assert_eq!(insert_kernel_args("--", "a=1"), "a=1 --");
    }
}
