//! What this host offers the `vm` kind: QEMU, qemu-img and UEFI firmware
//! (OVMF), for `shoal doctor` and for the daemon's start-up.

use super::qemu_launch::Firmware;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where Debian's `ovmf` package puts its firmware (code, vars), newest
/// layout first.
pub const OVMF_PAIRS: [(&str, &str); 2] = [
    (
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_VARS_4M.fd",
    ),
    (
        "/usr/share/OVMF/OVMF_CODE.fd",
        "/usr/share/OVMF/OVMF_VARS.fd",
    ),
];

/// The `vm` kind's host programs and firmware, as found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VmHost {
    /// `qemu-system-x86_64 --version`'s first line, if it runs.
    pub qemu: Option<String>,
    /// Whether `qemu-img --version` runs.
    pub qemu_img: bool,
    /// OVMF code and vars files, if installed.
    pub ovmf: Option<(PathBuf, PathBuf)>,
}

impl VmHost {
    /// UEFI firmware for VMs that ask for it, if installed.
    pub fn uefi(&self) -> Option<Firmware> {
        self.ovmf
            .clone()
            .map(|(code, vars)| Firmware::Uefi { code, vars })
    }

    /// Lines for `shoal doctor` (each says what was found, or what is
    /// missing and which Debian package has it).
    pub fn text(&self) -> String {
        let mut s = String::from(
            "Full VMs on QEMU (the vm kind; shoald runs it where these and the kernel and tiny image are present):\n",
        );
        match &self.qemu {
            Some(v) => s += &format!("  QEMU: {v}\n"),
            None => s += "  QEMU: qemu-system-x86_64 not found (Debian package qemu-system-x86)\n",
        }
        s += if self.qemu_img {
            "  qemu-img: present\n"
        } else {
            "  qemu-img: not found (Debian package qemu-utils): vm sandboxes cannot be created\n"
        };
        match &self.ovmf {
            Some((c, _)) => s += &format!("  UEFI firmware (OVMF): {}\n", c.display()),
            None => {
                s += "  UEFI firmware (OVMF): not found (Debian package ovmf): BIOS (SeaBIOS) guests only\n"
            }
        }
        s
    }
}

fn first_line(cmd: &Path) -> Option<String> {
    let out = Command::new(cmd)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines()
        .next()
        .map(|l| l.trim().chars().take(200).collect())
}

/// Looks for `qemu` and `qemu_img` (run with `--version`) and OVMF.
pub fn probe(qemu: &Path, qemu_img: &Path) -> VmHost {
    VmHost {
        qemu: first_line(qemu),
        qemu_img: first_line(qemu_img).is_some(),
        ovmf: OVMF_PAIRS
            .iter()
            .map(|(c, v)| (PathBuf::from(c), PathBuf::from(v)))
            .find(|(c, v)| c.is_file() && v.is_file()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_is_reported_missing_with_its_package() {
        let h = probe(
            Path::new("/nonexistent/qemu"),
            Path::new("/nonexistent/qemu-img"),
        );
        assert_eq!(h.qemu, None);
        assert!(!h.qemu_img);
        let t = h.text();
        assert!(t.contains("qemu-system-x86"), "{t}");
        assert!(t.contains("qemu-utils"), "{t}");
        // What the test host has is reported as it is.
        let here = probe(Path::new("qemu-system-x86_64"), Path::new("qemu-img"));
        assert_eq!(
            here.ovmf.is_some(),
            Path::new("/usr/share/OVMF/OVMF_CODE.fd").is_file()
                || Path::new("/usr/share/OVMF/OVMF_CODE_4M.fd").is_file()
        );
    }
}
