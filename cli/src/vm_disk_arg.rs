//! `shoal template create --kind vm --disk PATH [--disk-format ..]
//! [--disk-kernel ..] [--disk-root ..] [--disk-init ..]`: a vm template
//! booted from the caller's own disk instead of an image. The daemon
//! checks the disk (under its layers directory, raw or qcow2, no backing
//! file) and never writes it: each sandbox gets a qcow2 overlay.

use anyhow::{Context, Result};
use shoal_client::api::CreateTemplate;

/// The `--disk*` flags of `shoal template create`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct VmDiskArgs {
    /// With `--kind vm`: boot this disk image (raw or qcow2, a file under
    /// the daemon's layers directory; a relative path is made absolute
    /// here) instead of an image.
    #[arg(long, value_name = "PATH")]
    pub disk: Option<String>,
    /// The disk's format (default: what `qemu-img info` finds; given, it
    /// must agree).
    #[arg(long, value_parser = ["raw", "qcow2"], requires = "disk")]
    pub disk_format: Option<String>,
    /// How it boots: shoal (Shoal's kernel, the disk's file system as the
    /// root; needed on PVM hosts) or none (the firmware boots the disk's
    /// own bootloader; hardware KVM).
    #[arg(long, value_parser = ["shoal", "none"], requires = "disk")]
    pub disk_kernel: Option<String>,
    /// With `--disk-kernel shoal`: the root device (default /dev/vda; a
    /// partition: /dev/vda1).
    #[arg(long, value_name = "DEV", requires = "disk")]
    pub disk_root: Option<String>,
    /// With `--disk-kernel shoal`: Shoal's agent inside the disk, run as
    /// init (default /usr/local/sbin/shoal-agent).
    #[arg(long, value_name = "PATH", requires = "disk")]
    pub disk_init: Option<String>,
}

impl VmDiskArgs {
    /// Puts the flags into `req` (the daemon refuses them for a kind other
    /// than vm, with its reason).
    pub fn apply(&self, req: &mut CreateTemplate) -> Result<()> {
        let Some(disk) = &self.disk else {
            return Ok(());
        };
        let abs = std::path::absolute(disk).with_context(|| format!("--disk {disk}"))?;
        req.disk = Some(abs.to_string_lossy().into_owned());
        req.disk_format.clone_from(&self.disk_format);
        req.disk_kernel.clone_from(&self.disk_kernel);
        req.disk_root.clone_from(&self.disk_root);
        req.disk_init.clone_from(&self.disk_init);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cli, Cmd, TemplateCmd};
    use clap::Parser;
    use shoal_client::api::CreateTemplate;

    fn disk_of(args: &[&str]) -> CreateTemplate {
        let cli = Cli::try_parse_from(args).unwrap();
        let Cmd::Template {
            op: TemplateCmd::Create { disk, .. },
        } = cli.cmd
        else {
            panic!("not template create");
        };
        let mut req = CreateTemplate::new("t", "tiny");
        disk.apply(&mut req).unwrap();
        req
    }

    #[test]
    fn disk_flags_reach_the_request_with_an_absolute_path() {
        let r = disk_of(&[
            "shoal",
            "template",
            "create",
            "desk",
            "--kind",
            "vm",
            "--disk",
            "d.qcow2",
            "--disk-format",
            "qcow2",
            "--disk-kernel",
            "shoal",
            "--disk-root",
            "/dev/vda1",
            "--disk-init",
            "/sbin/agent",
        ]);
        let want = std::env::current_dir().unwrap().join("d.qcow2");
        assert_eq!(r.disk.as_deref(), Some(want.to_str().unwrap()));
        assert_eq!(r.disk_format.as_deref(), Some("qcow2"));
        assert_eq!(r.disk_kernel.as_deref(), Some("shoal"));
        assert_eq!(r.disk_root.as_deref(), Some("/dev/vda1"));
        assert_eq!(r.disk_init.as_deref(), Some("/sbin/agent"));
        let r = disk_of(&["shoal", "template", "create", "t", "--kind", "vm"]);
        assert_eq!(r.disk, None);
    }

    #[test]
    fn disk_details_without_a_disk_or_bad_values_are_refused() {
        for bad in [
            &["shoal", "template", "create", "t", "--disk-format", "raw"][..],
            &[
                "shoal",
                "template",
                "create",
                "t",
                "--disk",
                "/x",
                "--disk-format",
                "vmdk",
            ],
            &[
                "shoal",
                "template",
                "create",
                "t",
                "--disk",
                "/x",
                "--disk-kernel",
                "grub",
            ],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
