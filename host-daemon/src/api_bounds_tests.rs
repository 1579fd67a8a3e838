//! The bounds the OpenAPI document states are the daemon's.

use super::*;

#[test]
fn layer_limits_are_the_daemons() {
    let s = &document_json()["components"]["schemas"];
    for name in ["CreateSandbox", "CreateTemplate"] {
        let p = &s[name]["properties"];
        assert_eq!(p["layers"]["maxItems"], layers::MAX_LAYERS, "{name}");
        assert_eq!(
            p["upper_size_mib"]["minimum"],
            layers::MIN_UPPER_SIZE_MIB,
            "{name}"
        );
        assert_eq!(
            p["upper_disk_mib"]["minimum"],
            layers::MIN_UPPER_DISK_MIB,
            "{name}"
        );
        assert_eq!(
            p["upper_disk_mib"]["maximum"],
            layers::MAX_UPPER_DISK_MIB,
            "{name}"
        );
    }
    assert_eq!(
        s["Template"]["properties"]["layers"]["maxItems"],
        layers::MAX_LAYERS
    );
    // The bounds of metadata and env are the ones the daemon checks.
    let p = &s["CreateSandbox"]["properties"];
    for (k, b, what) in [
        ("metadata", crate::inputs::METADATA, "keys"),
        ("env", crate::inputs::ENV, "names"),
    ] {
        let d = p[k]["description"]
            .as_str()
            .unwrap_or("")
            .replace('\n', " ");
        let want = format!("at most {} {what} of at most {} bytes", b.keys, b.key_bytes);
        assert!(d.contains(&want), "{k}: {want:?} not in {d:?}");
        assert!(
            d.contains(&format!("{} KiB in all", b.total_bytes >> 10)),
            "{k}: {d}"
        );
    }
    assert_eq!(
        s["SetPool"]["properties"]["target"]["description"]
            .as_str()
            .map(|d| d.contains(&crate::templates::MAX_POOL.to_string())),
        Some(true)
    );
}
