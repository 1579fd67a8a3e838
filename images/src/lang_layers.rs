//! The built-in layers: named read-only layers of Debian packages over the
//! `base` image, which API callers and the CLI name like images
//! (`"layers": ["fncall-cpp"]`, `shoal run --image base --layer
//! fncall-cpp -- g++ --version`). [`LAYERS`] is the one list of them;
//! adding a layer is one entry there (a name and its packages), and
//! every place that takes image names takes it (see
//! `shoal_images::artifacts::is_named_layer`).
//!
//! Each is built by [`crate::deb_layer`] over the base image the checkout
//! builds, and cached by content ([`crate::layer_cache`]) under
//! `${SHOAL_CACHE:-~/.cache/shoal}/images/layer-NAME-KEY/NAME.erofs`,
//! `KEY` = a hash of the builder's revision, the package list, the
//! mirror override and the base image's identity (its size and erofs
//! superblock, which holds the build's UUID and time): a rebuilt base
//! makes new layers, an unchanged one finds them at once. Cached layers
//! unused for a day are pruned when another of the same name is built.

/// A built-in layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recipe {
    /// Its name (an image name: lower case, digits, `-`).
    pub name: &'static str,
    /// The Debian packages installed over `base` (with their
    /// dependencies, without recommends).
    pub packages: &'static [&'static str],
    /// What it is for.
    pub about: &'static str,
}

/// Every built-in layer, each over `base`.
pub const LAYERS: &[Recipe] = &[
    Recipe {
        name: "fncall-python",
        packages: &["python3-numpy"],
        about: "numpy for FnCall's python (base has python3 and bash)",
    },
    Recipe {
        name: "fncall-cpp",
        packages: &["g++"],
        about: "g++ 12 (C++17 and later), binutils and the libc/libstdc++ headers for FnCall's cpp",
    },
    Recipe {
        name: "fncall-nodejs",
        packages: &["nodejs"],
        about: "Node.js 18 for FnCall's nodejs",
    },
    Recipe {
        name: "code-interpreter",
        // python3-munkres: the lighter alternative of python3-fonttools's
        // `python3-scipy | python3-munkres` (matplotlib needs fonttools);
        // apt would take scipy, whose hard dependency on pythran brings
        // g++, boost and the BLAS headers: a 1.1 GB layer instead of ~0.4.
        packages: &[
            "python3-numpy",
            "python3-pandas",
            "python3-matplotlib",
            "python3-munkres",
        ],
        about:
            "the scientific Python stack of the E2B code interpreter (numpy, pandas, matplotlib)",
    },
];

/// The built-in layers' names.
pub fn names() -> Vec<&'static str> {
    LAYERS.iter().map(|r| r.name).collect()
}

/// The recipe of a built-in layer.
pub fn recipe(name: &str) -> Option<&'static Recipe> {
    LAYERS.iter().find(|r| r.name == name)
}

impl Recipe {
    /// The package list as the builder takes it.
    pub fn package_list(&self) -> Vec<String> {
        self.packages.iter().map(|p| p.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_are_valid_and_named_once() {
        let mut seen = std::collections::BTreeSet::new();
        for r in LAYERS {
            assert!(seen.insert(r.name), "{} listed twice", r.name);
            assert!(
                r.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{}",
                r.name
            );
            assert!(!r.packages.is_empty() && !r.about.is_empty(), "{}", r.name);
        }
        // The names other helpers (FnCall, the E2B code interpreter) use.
        for n in [
            "fncall-python",
            "fncall-cpp",
            "fncall-nodejs",
            "code-interpreter",
        ] {
            assert!(recipe(n).is_some(), "{n}");
        }
        assert!(recipe("base").is_none());
    }
}
