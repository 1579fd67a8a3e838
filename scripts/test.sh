#!/usr/bin/env bash
# scripts/test.sh [unit]
#
# With no argument: builds whatever is missing (guest kernel, guest images)
# and runs every test. Integration tests boot real guests on /dev/kvm and
# fail (never skip) without it.
#
# `unit`: format, lints, the structure check (scripts/check-structure.py:
# no file over 800 lines, no import circle) and every test that needs no
# KVM and no guest artifacts: every test of every crate but the KVM
# targets — the unit tests, guest-agent's tests (the agent as a host
# process), the devices driven from a simulated guest, the VMM control
# protocol over real sockets, and shoald's logic against the fake backend
# (host-daemon/tests/fake_daemon.rs). Not tests/tests/*.rs (shoal-tests)
# nor vmm/tests/*.rs (they boot guests or open /dev/kvm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${1:-}" == "unit" ]]; then
    t0=$SECONDS
    echo "== format, lints and structure" >&2
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy -p guest-agent --target x86_64-unknown-linux-musl -- -D warnings
    python3 scripts/check-structure.py
    echo "== unit tests (no KVM)" >&2
    cargo test --workspace --exclude shoal-tests --exclude vmm
    cargo test -p vmm --lib --bins
    echo "== unit tier passed in $((SECONDS - t0)) s" >&2
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: scripts/test.sh [unit]" >&2
    exit 2
fi

echo "== guest kernel" >&2
scripts/build-kernel.sh >/dev/null
echo "== guest images" >&2
scripts/build-images.sh all >/dev/null
echo "== built-in layers (Debian packages over base; cached; installed for test daemons)" >&2
cargo build --release -q -p shoald --bin shoald -p shoal-cli --bin shoal
target/release/shoal artifacts build tiny base layers >/dev/null
echo "== format and lints" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p guest-agent --target x86_64-unknown-linux-musl -- -D warnings
python3 scripts/check-structure.py
echo "== tests" >&2
# Sandboxes in the integration tests run the optimised VMM (as users do).
# Daemons started as root jail every VMM through the static shoal-jailer,
# as ./shoal builds it.
cargo build --release -p vmm --bin shoal-vmm -p shoal-jailer --bin shoal-jailer
cargo build --release --target x86_64-unknown-linux-musl -p shoal-jailer --bin shoal-jailer
export SHOAL_VMM="$PWD/target/release/shoal-vmm"
export SHOAL_JAILER="$PWD/target/x86_64-unknown-linux-musl/release/shoal-jailer"
cargo test --workspace
echo "== Python SDK (sdk/python: pytest against a real shoald and real guests)" >&2
# The daemon and CLI the SDK tests drive, the guest artifacts they read
# (~/.cache/shoal/artifacts), and a venv of their own under target/.
cargo build --release -p shoald --bin shoald -p shoal-cli --bin shoal
target/release/shoal artifacts build tiny base >/dev/null
[[ -x target/pyenv/bin/python ]] || python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check "httpx>=0.25,<1" "pytest>=7.4" "pytest-asyncio>=0.23" "sandbox-fusion==0.3.7"
target/pyenv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall ./sdk/python
bins="$PWD/target/release"
(cd sdk/python && SHOAL_BIN_DIR="$bins" ../../target/pyenv/bin/python -m pytest -q tests)
echo "== E2B drop-in (sdk/python/e2b_tests: the stock e2b SDKs from PyPI, pinned, against a real shoald)" >&2
# The base image (E2B's default template) and one venv per pinned SDK.
target/release/shoal artifacts build base >/dev/null
SHOAL_BIN_DIR="$bins" scripts/e2b-tests.sh
