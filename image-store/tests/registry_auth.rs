//! Registry auth against the real registry behind a small proxy in this
//! test (`common`), which asks for Basic auth, or for a Bearer token it
//! issues itself at `/token` (Debian's docker-registry 2.8 takes only
//! bcrypt htpasswd files and a token service of its own for these; the
//! proxy lets the test see every request, challenge and token query):
//! credentials come from a Docker `config.json`.

mod common;

use common::{Mode, Proxy, SERVICE, TOKEN};
use image_store::registry::{pull, PullOptions};
use image_store::Store;
use shoal_test_support::registry::{push, tar_of, write_layout, Entry, Registry};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// A registry with `test/app:v1` (three gzip layers) pushed.
fn registry(dir: &Path) -> Registry {
    let reg = Registry::start(dir);
    let layout = dir.join("layout");
    let layers: Vec<(Vec<u8>, bool)> = (0..3)
        .map(|i| {
            let name = format!("f{i}");
            (tar_of(&[Entry::File(&name, 0o644, name.as_bytes())]), true)
        })
        .collect();
    write_layout(&layout, "v1", &layers, serde_json::json!({"Env": ["A=1"]}));
    push(dir, &layout, "v1", &reg.reference("test/app:v1"));
    reg
}

/// A config.json with `user:pass` for `host`.
fn auth_file(dir: &Path, name: &str, host: &str, user_pass: &str) -> PathBuf {
    use base64::Engine;
    let p = dir.join(name);
    let auth = base64::engine::general_purpose::STANDARD.encode(user_pass);
    std::fs::write(
        &p,
        serde_json::to_vec(&serde_json::json!({"auths": {host: {"auth": auth}}})).unwrap(),
    )
    .unwrap();
    p
}

fn opts(file: &Path) -> PullOptions {
    PullOptions {
        auth_file: Some(file.to_path_buf()),
        ..Default::default()
    }
}

fn layers_left(store: &Store) -> usize {
    std::fs::read_dir(store.dir().join("layers")).map_or(0, |r| r.count())
}

#[test]
fn basic_auth_from_a_docker_config_json() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let proxy = Proxy::start(reg.port, Mode::Basic("alice".into(), "s3cret".into()));
    let host = format!("127.0.0.1:{}", proxy.port);
    let r = proxy.reference("test/app:v1");
    let store = Store::new(&dir.path().join("store"));

    let none = auth_file(dir.path(), "none.json", "127.0.0.1:1", "x:y");
    let e = pull(&store, &r, &opts(&none)).unwrap_err().to_string();
    assert!(
        e.contains("asks for Basic auth") && e.contains("has no credentials for"),
        "{e}"
    );
    let wrong = auth_file(dir.path(), "wrong.json", &host, "alice:nope");
    let e = pull(&store, &r, &opts(&wrong)).unwrap_err().to_string();
    assert!(e.contains("401") && e.contains("were refused"), "{e}");
    assert_eq!(layers_left(&store), 0);

    let good = auth_file(
        dir.path(),
        "good.json",
        &format!("https://{host}"),
        "alice:s3cret",
    );
    let start = proxy.state.log.lock().unwrap().len();
    let img = pull(&store, &r, &opts(&good)).unwrap();
    assert_eq!(img.image.layers.len(), 3);
    assert_eq!(img.image.config.env, vec!["A=1"]);
    // One challenge, then every request carries the credentials.
    let log = proxy.state.log.lock().unwrap()[start..].to_vec();
    assert!(
        log[0].ends_with("/manifests/v1 "),
        "anonymous first: {log:#?}"
    );
    let after = &log[1..];
    assert!(
        after.iter().all(|l| l.ends_with("Basic YWxpY2U6czNjcmV0")),
        "{after:#?}"
    );
    assert_eq!(
        after.iter().filter(|l| l.contains("/blobs/")).count(),
        4,
        "config + 3 layers"
    );
}

#[test]
fn a_bearer_token_is_fetched_once_with_the_scope_and_reused_for_every_blob() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(dir.path());
    let proxy = Proxy::start(reg.port, Mode::Bearer(Some(("bob".into(), "pw".into()))));
    let host = format!("127.0.0.1:{}", proxy.port);
    let r = proxy.reference("test/app:v1");
    let store = Store::new(&dir.path().join("store"));

    // The token endpoint wants credentials the file lacks.
    let none = auth_file(dir.path(), "none.json", "127.0.0.1:1", "x:y");
    let e = pull(&store, &r, &opts(&none)).unwrap_err().to_string();
    assert!(
        e.contains("token from http://127.0.0.1") && e.contains("has no credentials"),
        "{e}"
    );
    assert!(proxy.state.tokens.lock().unwrap().is_empty());

    let good = auth_file(dir.path(), "good.json", &host, "bob:pw");
    let before = proxy.state.unauthorized.load(Ordering::SeqCst);
    let img = pull(&store, &r, &opts(&good)).unwrap();
    assert_eq!(img.image.layers.len(), 3);
    let tokens = proxy.state.tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 1, "one token for the whole pull: {tokens:?}");
    assert!(
        tokens[0].contains(&format!("service={SERVICE}")),
        "{tokens:?}"
    );
    assert!(
        tokens[0].contains("scope=repository%3Atest%2Fapp%3Apull"),
        "{tokens:?}"
    );
    assert_eq!(
        proxy.state.unauthorized.load(Ordering::SeqCst) - before,
        1,
        "one challenge (the manifest's), none for the blobs"
    );
    let log = proxy.state.log.lock().unwrap().clone();
    let blobs: Vec<&String> = log.iter().filter(|l| l.contains("/blobs/")).collect();
    assert_eq!(blobs.len(), 4, "config + 3 layers: {log:#?}");
    assert!(
        blobs
            .iter()
            .all(|l| l.ends_with(&format!("Bearer {TOKEN}"))),
        "{blobs:#?}"
    );
}
