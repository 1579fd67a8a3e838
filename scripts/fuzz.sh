#!/usr/bin/env bash
# scripts/fuzz.sh [TARGET] [SECONDS]
#
# Runs the fuzz targets of fuzz/ (crate shoal-fuzz) for longer than the 1 s
# each gets in `cargo test`. TARGET is a module of fuzz/tests/targets
# (mmio, blk, pmem, vsock, agent_frames, agent_messages, snapshot_state,
# api) or `all` (the default); SECONDS per target, default 60.
#
# With cargo-bolero and a nightly toolchain installed
# (`cargo install cargo-bolero`), a target runs under libFuzzer with
# AddressSanitizer, coverage-guided: new inputs go to
# fuzz/tests/targets/__fuzz__/<target>/corpus and failing ones to .../crashes;
# `cargo test` replays both directories, so commit what it finds (after the
# fix) as regression cases. Without them (or with SHOAL_FUZZ_ENGINE=random)
# the same targets run on the stable toolchain with random inputs for
# SECONDS each; a failure then prints the input and a BOLERO_RANDOM_SEED
# that reproduces it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="${1:-all}"
secs="${2:-60}"
declare -A tests=(
    [mmio]=mmio::mmio_registers
    [blk]=blk::blk_queue
    [pmem]=pmem::pmem_queue
    [vsock]=vsock::vsock_packets
    [agent_frames]=agent_frames::agent_frame_decoder
    [agent_messages]=agent_messages::agent_messages
    [snapshot_state]=snapshot_state::snapshot_state
    [api]=api::api_bodies
)
if [[ "$target" == all ]]; then
    names=(mmio blk pmem vsock agent_frames agent_messages snapshot_state api)
elif [[ -n "${tests[$target]:-}" ]]; then
    names=("$target")
else
    echo "usage: scripts/fuzz.sh [${!tests[*]}|all] [SECONDS]" >&2
    exit 2
fi
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number" >&2; exit 2; }

engine="${SHOAL_FUZZ_ENGINE:-}"
if [[ -z "$engine" ]]; then
    if cargo bolero --version >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
        engine=libfuzzer
    else
        engine=random
    fi
fi

for n in "${names[@]}"; do
    t="targets::${tests[$n]}"
    echo "== $n ($engine, ${secs}s)" >&2
    if [[ "$engine" == libfuzzer ]]; then
        cargo +nightly bolero test -p shoal-fuzz "$t" -T "${secs}s" \
            --target-dir target/fuzz
    else
        SHOAL_FUZZ_MS=$((secs * 1000)) cargo test -p shoal-fuzz --test fuzz -- --exact "$t"
    fi
done
