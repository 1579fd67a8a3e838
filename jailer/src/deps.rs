//! The files a dynamically linked program needs to start: its ELF
//! interpreter and the shared libraries it loads, as `ldd` resolves them
//! on this host. A jail binds exactly these read-only (at the paths the
//! loader looks them up at), rather than the host's library directories.

use std::path::{Path, PathBuf};

/// Why the dependencies are unknown.
#[derive(Debug, thiserror::Error)]
pub enum DepsError {
    /// `ldd` could not be run.
    #[error("ldd {0}: {1}")]
    Run(PathBuf, std::io::Error),
    /// `ldd` named a library it could not find.
    #[error("{program}: {lib} not found")]
    NotFound {
        /// The program.
        program: PathBuf,
        /// The library.
        lib: String,
    },
}

/// The absolute paths in `ldd` output `out` (a static program has none).
pub fn parse_ldd(program: &Path, out: &str) -> Result<Vec<PathBuf>, DepsError> {
    let mut v = vec![];
    for l in out.lines() {
        let l = l.trim();
        let path = match l.split_once("=>") {
            Some((lib, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(DepsError::NotFound {
                        program: program.into(),
                        lib: lib.trim().into(),
                    });
                }
                rest.split_whitespace().next().unwrap_or("")
            }
            None => l.split_whitespace().next().unwrap_or(""),
        };
        // linux-vdso.so.1 is in the kernel, not a file.
        if path.starts_with('/') && !v.iter().any(|p: &PathBuf| p == Path::new(path)) {
            v.push(PathBuf::from(path));
        }
    }
    Ok(v)
}

/// The interpreter and libraries of `program` (empty for a static one).
pub fn of(program: &Path) -> Result<Vec<PathBuf>, DepsError> {
    let out = std::process::Command::new("ldd")
        .arg(program)
        .env_clear()
        .output()
        .map_err(|e| DepsError::Run(program.into(), e))?;
    // ldd exits 1 for "not a dynamic executable".
    parse_ldd(program, &String::from_utf8_lossy(&out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_interpreter_and_libraries() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x7f56)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f56)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x7f56)\n";
        let p = Path::new("/x");
        assert_eq!(
            parse_ldd(p, out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd(p, "\tnot a dynamic executable\n")
            .unwrap()
            .is_empty());
        let e = parse_ldd(p, "\tlibfoo.so => not found\n").unwrap_err();
        assert!(e.to_string().contains("libfoo.so not found"), "{e}");
        // On this host: ls is dynamic, its loader is among its files.
        let ls = of(Path::new("/bin/ls")).unwrap();
        assert!(
            ls.iter().any(|p| p.to_string_lossy().contains("ld-linux")),
            "{ls:?}"
        );
    }
}
