//! The built-in language layers (`shoal_images::lang_layers`: Debian
//! packages over `base`, built by `deb_layer` from this checkout, cached)
//! in a real guest: one template of `base` with all four layers stacked
//! (`/dev/pmem1..4`), one sandbox restored from it.
//!
//! Each layer is checked twice: alone over the base image, and in the
//! stack. Alone: in the guest, the layer's own device is mounted and
//! overlaid on the base image only (`/run/shoal/image`), and the check runs
//! in a chroot of that overlay, so no other layer can supply a file the
//! layer lacks. Stacked: the sandbox's own root (every layer over base)
//! runs each tool too, so layers made over the same base do not hide each
//! other's files.
//!
//! One template boot for the binary (PVM: ~10 s boot, then the checks: a
//! g++ compile and the pandas/matplotlib import take tens of seconds).
//! Building the layers the first time takes minutes (apt downloads; needs
//! root and a Debian mirror).

use agent_client::{Client, ExitStatus};
use shoal_runtime::sandbox::{self, TemplateSpec};
use shoal_test_support::{image, require_kvm, require_root, sh, RunningSandbox};
use std::time::Instant;

/// The layers, lowest first (`/dev/pmem1` is the first).
const LAYERS: [&str; 4] = [
    "fncall-python",
    "fncall-cpp",
    "fncall-nodejs",
    "code-interpreter",
];

const PYTHON: &str = "python3 -c 'import numpy; print(\"numpy\", numpy.arange(10).sum())'";

const CPP: &str = r#"cat > /tmp/hello.cpp <<'EOF'
#include <iostream>
#include <map>
#include <optional>
#include <string>
int main() {
    std::map<std::string, int> m{{"cpp", 17}};
    for (const auto& [k, v] : m) std::cout << k << v << "\n";
    std::optional<int> o = m.at("cpp");
    return *o == 17 ? 0 : 1;
}
EOF
g++ -std=c++17 -o /tmp/hello /tmp/hello.cpp && /tmp/hello"#;

const NODE: &str = "node -e 'console.log(\"node\", [1, 2, 3].map(x => x * 2).join(\",\"))'";

const INTERP: &str = r#"python3 -c '
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt, numpy, pandas
df = pandas.DataFrame({"x": [1, 2, 3]})
plt.plot(df.x, numpy.square(df.x))
plt.savefig("/tmp/plot.png")
print("pandas", df.x.sum(), open("/tmp/plot.png", "rb").read(4)[1:].decode())
'"#;

/// The check of each layer and what its output must be.
fn checks() -> [(&'static str, &'static str, &'static str); 4] {
    [
        ("fncall-python", PYTHON, "numpy 45\n"),
        ("fncall-cpp", CPP, "cpp17\n"),
        ("fncall-nodejs", NODE, "node 2,4,6\n"),
        ("code-interpreter", INTERP, "pandas 6 PNG\n"),
    ]
}

/// Runs `script` in a chroot of layer `n` (1-based: `/dev/pmemN`) alone
/// over the base image, with its own `/proc`, `/dev` and `/tmp`, after a
/// first line listing `packages` as the layer's dpkg database has them
/// (`NAME=STATUS;` each).
fn in_layer_alone(
    c: &Client,
    n: usize,
    packages: &[&str],
    script: &str,
) -> (String, String, ExitStatus) {
    let quoted = script.replace('\'', r"'\''");
    let full = format!(
        "set -e; l=/run/lang/l{n}; o=/run/lang/o{n}
         mkdir -p $l $o
         mount -t erofs -o ro /dev/pmem{n} $l
         mount -t overlay overlay -o lowerdir=$l:/run/shoal/image $o
         mount -t proc proc $o/proc
         mount --bind /dev $o/dev
         mount -t tmpfs tmpfs $o/tmp
         chroot $o dpkg-query -W -f '${{Package}}=${{Status}};' {}; echo
         exec chroot $o /bin/sh -c '{quoted}'",
        packages.join(" ")
    );
    sh(c, &full)
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    r
}

#[test]
fn each_language_layer_works_over_base_alone_and_stacked() {
    require_kvm();
    require_root("building the layers mounts the base image and runs apt-get in a chroot");
    let layers = timed("the layers (built or cached)", || {
        LAYERS
            .iter()
            .map(|l| image(&format!("{l}_erofs")))
            .collect()
    });
    let spec = TemplateSpec {
        layers,
        ..TemplateSpec::new("base", 1, 512)
    };
    let t = timed("the template", || {
        sandbox::template(&spec, &mut |l| eprintln!("{l}"))
            .unwrap_or_else(|e| panic!("the base template with the language layers: {e}"))
    });
    let (_r, c) = timed("restore", || RunningSandbox::start(&t));

    for (layer, script, want) in checks() {
        // Alone over base: the layer's dpkg database lists base's packages
        // and its own, and its tool works.
        let n = LAYERS.iter().position(|l| *l == layer).unwrap() + 1;
        let r = shoal_images::lang_layers::recipe(layer).expect("a built-in layer");
        let mut pkgs = vec!["python3", "bash"];
        pkgs.extend(r.packages);
        let (out, err, st) = timed(&format!("{layer} alone"), || {
            in_layer_alone(&c, n, &pkgs, script)
        });
        let (dpkg, tool) = out.split_once('\n').unwrap_or((&out, ""));
        for p in &pkgs {
            assert!(
                dpkg.contains(&format!("{p}=install ok installed;")),
                "{layer} alone over base: {p} not installed: {dpkg} {err}"
            );
        }
        assert_eq!(
            (tool, st),
            (want, ExitStatus::Exited(0)),
            "{layer} alone over base: {err}"
        );
        // In the sandbox's own root: every layer stacked over base.
        let (out, err, st) = timed(&format!("{layer} stacked"), || sh(&c, script));
        assert_eq!(
            (out.as_str(), st),
            (want, ExitStatus::Exited(0)),
            "{layer} in the stack: {err}"
        );
    }
    // Base alone has no compiler and no node (the checks mean something).
    let (out, err, st) = sh(
        &c,
        "ls /run/shoal/image/usr/bin/g++ /run/shoal/image/usr/bin/node 2>&1; \
         ls /run/lang/o2/usr/bin/g++ /run/lang/o3/usr/bin/node",
    );
    assert_eq!(st, ExitStatus::Exited(0), "{out}{err}");
    assert_eq!(
        out.matches("No such file or directory").count(),
        2,
        "{out}{err}"
    );
}
