//! The languages FnCall runs: one declarative entry each ([`LANGUAGES`]).
//!
//! An entry names the image and layers its template is made from, the
//! guest's shape, the file the code is written to, how it is compiled (if
//! at all) and run, and whether it has a warm mode: a runner script
//! started once in the template and snapshotted while it waits for a call
//! ([`Warm`]). Adding a language is adding an entry here (and, if it
//! needs packages the `base` image lacks, a layer image; see README,
//! "FnCall").
//!
//! In `compile` and `run`, `{src}` is the source file's path and `{bin}`
//! the compiled program's; both are in the call's working directory
//! ([`WORKDIR`]).

/// The working directory of every call: the code's file, uploaded
/// `files` with relative paths and the compiled program live here.
pub const WORKDIR: &str = "/tmp/fncall";

/// A layer of a language's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRef {
    /// A built-in layer image name (as `layers` in a create takes it).
    pub name: &'static str,
    /// Used when this build has it; the language works without it (with
    /// less: python without numpy).
    pub optional: bool,
}

/// A warm mode: `start` runs `script` (written to `script_path` before
/// the snapshot), which prints [`READY`] on stdout once it waits for its
/// call on stdin (see `runner.py` for the framing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Warm {
    /// Where the runner is written in the template.
    pub script_path: &'static str,
    /// The runner's source.
    pub script: &'static str,
    /// Its command line.
    pub start: &'static [&'static str],
}

/// What a warm runner prints on stdout once it is ready to be
/// snapshotted.
pub const READY: &[u8] = b"\0SHOAL-FNCALL-READY\n";

/// One language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// Its name in requests.
    pub name: &'static str,
    /// The image its template boots.
    pub image: &'static str,
    /// Layers over the image, lowest first.
    pub layers: &'static [LayerRef],
    /// Guest RAM of its template, MiB (a call's `memory_mib` is capped by
    /// what that leaves the user cgroup: RAM − 24 MiB).
    pub memory_mib: u32,
    /// The file the code is written to, in [`WORKDIR`].
    pub source_file: &'static str,
    /// The compiler's argv, for compiled languages.
    pub compile: Option<&'static [&'static str]>,
    /// The program's argv (the call's `args` follow); unused in warm mode.
    pub run: &'static [&'static str],
    /// Its warm mode, if it has one.
    pub warm: Option<Warm>,
}

/// The python runner (see its header comment).
pub const PYTHON_RUNNER: &str = include_str!("runner.py");

/// Every language.
pub const LANGUAGES: &[Spec] = &[
    Spec {
        name: "python",
        image: "base",
        layers: &[LayerRef {
            name: "fncall-python",
            optional: true,
        }],
        memory_mib: 256,
        source_file: "main.py",
        compile: None,
        run: &["python3", "{src}"],
        warm: Some(Warm {
            script_path: "/opt/shoal-fncall/runner.py",
            script: PYTHON_RUNNER,
            start: &["python3", "/opt/shoal-fncall/runner.py"],
        }),
    },
    Spec {
        name: "bash",
        image: "base",
        layers: &[],
        memory_mib: 256,
        source_file: "main.sh",
        compile: None,
        run: &["bash", "{src}"],
        warm: None,
    },
    Spec {
        name: "cpp",
        image: "base",
        layers: &[LayerRef {
            name: "fncall-cpp",
            optional: false,
        }],
        memory_mib: 1024,
        source_file: "main.cpp",
        compile: Some(&["g++", "-O2", "-std=c++17", "-o", "{bin}", "{src}"]),
        run: &["{bin}"],
        warm: None,
    },
    Spec {
        name: "nodejs",
        image: "base",
        layers: &[LayerRef {
            name: "fncall-nodejs",
            optional: false,
        }],
        memory_mib: 512,
        source_file: "main.js",
        compile: None,
        run: &["node", "{src}"],
        warm: None,
    },
];

/// The compiled program's file name in [`WORKDIR`].
pub const BIN_FILE: &str = "main";

/// The language named `name`.
pub fn find(name: &str) -> Option<&'static Spec> {
    LANGUAGES.iter().find(|s| s.name == name)
}

/// The images and built-in layers this build knows
/// ([`shoal_images::artifacts::is_named_layer`]; built-in layers are
/// [`shoal_images::lang_layers::LAYERS`]).
pub fn known_image(name: &str) -> bool {
    shoal_images::artifacts::is_named_layer(name)
}

impl Spec {
    /// The layers its template uses here: optional ones this build lacks
    /// left out; a required one it lacks is the error (a clear message).
    pub fn layers_here(&self) -> Result<Vec<String>, String> {
        let mut v = Vec::new();
        for l in self.layers {
            if known_image(l.name) {
                v.push(l.name.to_string());
            } else if !l.optional {
                return Err(format!(
                    "language '{}' needs the layer image '{}', which this build of shoal does \
                     not have (build it with scripts/build-images.sh; see README, FnCall)",
                    self.name, l.name
                ));
            }
        }
        Ok(v)
    }

    /// `argv` with `{src}` and `{bin}` filled in.
    pub fn fill(&self, argv: &[&str]) -> Vec<String> {
        argv.iter()
            .map(|a| {
                a.replace("{src}", &format!("{WORKDIR}/{}", self.source_file))
                    .replace("{bin}", &format!("{WORKDIR}/{BIN_FILE}"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_entries_sane() {
        for (i, s) in LANGUAGES.iter().enumerate() {
            assert!(
                LANGUAGES[..i].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
            assert!(known_image(s.image), "{}: image {}", s.name, s.image);
            assert!(s.memory_mib >= 128, "{}", s.name);
            assert!(!s.run.is_empty(), "{}", s.name);
            if s.compile.is_some() {
                assert!(s.run.contains(&"{bin}"), "{} runs what it compiled", s.name);
            }
        }
        assert_eq!(find("python").map(|s| s.warm.is_some()), Some(true));
        assert!(find("cobol").is_none());
    }

    #[test]
    fn placeholders_are_filled() {
        let cpp = find("cpp").unwrap();
        assert_eq!(
            cpp.fill(cpp.compile.unwrap()),
            [
                "g++",
                "-O2",
                "-std=c++17",
                "-o",
                "/tmp/fncall/main",
                "/tmp/fncall/main.cpp"
            ]
        );
        assert_eq!(cpp.fill(cpp.run), ["/tmp/fncall/main"]);
    }

    #[test]
    fn a_missing_required_layer_is_a_clear_error() {
        let py = find("python").unwrap();
        assert!(py.layers_here().is_ok(), "python's layer is optional");
        let cpp = find("cpp").unwrap();
        match cpp.layers_here() {
            Ok(l) => assert_eq!(l, ["fncall-cpp"]),
            Err(e) => assert!(e.contains("needs the layer image 'fncall-cpp'"), "{e}"),
        }
    }
}
