#!/bin/bash
# Daemon-level create latency as an API client sees it (curl over the Unix
# socket), with and without the VMM stock, jailed and not: one shoald per
# mode (as root), `--vmm-stock 0` then `--vmm-stock 1`, each with
# `SHOAL_JAIL=0` (unjailed VMMs) and jailed; N creates from the image
# `tiny` 250 ms apart (each deleted at once), after one create that boots
# the template. Prints p50/p90/min and the stock's counters per mode.
# Usage: sudo scripts/bench-stock-create.sh [N]   (release builds of
# shoald, shoal-vmm and the static shoal-jailer first)
set -eu
n=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
export SHOAL_VMM=${SHOAL_VMM:-$root/target/release/shoal-vmm}
export SHOAL_JAILER=${SHOAL_JAILER:-$root/target/x86_64-unknown-linux-musl/release/shoal-jailer}
work=$(mktemp -d /tmp/shoal-stock-bench.XXXXXX)
for mode in 0:0 1:0 0:1 1:1; do
  stock=${mode%%:*} jail=${mode#*:}
  sd=$work/state-$stock-$jail
  mkdir -p "$sd"
  SHOAL_JAIL=$jail "$root/target/release/shoald" --state-dir "$sd" --vmm-stock $stock --no-pools >"$sd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -S "$sd/shoald.sock" ] && break; sleep 0.1; done
  c() { curl -s --unix-socket "$sd/shoald.sock" "$@"; }
  idof() { python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
  new() { c -X POST http://d/v1/sandboxes -H 'content-type: application/json' -d '{"image":"tiny"}' "$@"; }
  id=$(new | idof)
  c -X DELETE "http://d/v1/sandboxes/$id" >/dev/null
  sleep 1
  : >"$sd.times"
  for _ in $(seq "$n"); do
    out=$(new -w '\n%{time_total}')
    echo "$out" | tail -1 >>"$sd.times"
    id=$(echo "$out" | head -1 | idof)
    c -X DELETE "http://d/v1/sandboxes/$id" >/dev/null
    sleep 0.25
  done
  counters=$(c http://d/metrics | grep -E '^shoal_vmm_stock' | tr '\n' ' ')
  python3 - "$sd.times" "$stock" "$counters" "$jail" <<'PY'
import statistics, sys
v = sorted(float(x) * 1e3 for x in open(sys.argv[1]))
jail = "jailed" if sys.argv[4] == "1" else "unjailed"
print(f"--vmm-stock {sys.argv[2]} {jail}: n={len(v)} create p50 {statistics.median(v):.2f} "
      f"p90 {v[int(len(v) * 0.9)]:.2f} min {v[0]:.2f} ms | {sys.argv[3]}")
PY
  kill -TERM $pid
  wait $pid || true
done
rm -rf "$work"
