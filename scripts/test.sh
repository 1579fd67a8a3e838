#!/usr/bin/env bash
# Builds whatever is missing (guest kernel, guest images) and runs every test.
# Integration tests boot real guests on /dev/kvm and fail (never skip)
# without it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== guest kernel" >&2
scripts/build-kernel.sh >/dev/null
echo "== guest images" >&2
scripts/build-images.sh all >/dev/null
echo "== format and lints" >&2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p guest-agent --target x86_64-unknown-linux-musl -- -D warnings
echo "== tests" >&2
# Sandboxes in the integration tests run the optimised VMM (as users do).
cargo build --release -p vmm --bin shoal-vmm
export SHOAL_VMM="$PWD/target/release/shoal-vmm"
cargo test --workspace
