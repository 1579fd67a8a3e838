#!/usr/bin/env bash
# The E2B drop-in tests (sdk/python/e2b_tests): the stock SDKs from PyPI,
# pinned, one venv each under target/e2b-venvs/, against a real shoald on
# TCP and real guests. e2b 2.63.0 with e2b-code-interpreter 2.11.5 runs
# every test; e2b 2.50.0 (the v1 create route) and 2.20.0 run the control
# plane's tests and the data plane's two sync ones (commands, files): the
# rest (async, pty, pause on use) speak the same envd protocol 2.63 checks.
#
# Needs the release binaries (shoald, shoal-vmm, shoal-jailer) and the
# guest artifacts, as scripts/test.sh builds them. E2B_VENV=DIR runs one
# venv only (made beforehand).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pins=("2.63:e2b==2.63.0 e2b-code-interpreter==2.11.5" "2.50:e2b==2.50.0" "2.20:e2b==2.20.0")
run() {
    local venv=$1 marks=$2
    shift 2
    echo "== E2B SDK tests with $("$venv/bin/python" -c 'import e2b, importlib.metadata as m; print("e2b", m.version("e2b"))')" >&2
    (cd sdk/python/e2b_tests && SHOAL_BIN_DIR="${SHOAL_BIN_DIR:-$root/target/release}" \
        "$root/$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=10 -m "$marks" "${@:-.}")
}
older=(test_control.py test_data.py::test_commands test_data.py::test_files)
if [[ -n "${E2B_VENV:-}" ]]; then
    marks="not code_interpreter"
    "$E2B_VENV/bin/python" -c 'import e2b_code_interpreter' 2>/dev/null && marks=""
    run "$E2B_VENV" "$marks"
    exit 0
fi
# Every pin runs, whatever an earlier one gave; the status is the worst.
rc=0
for p in "${pins[@]}"; do
    v=${p%%:*}
    venv=target/e2b-venvs/e2b-$v
    [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
    # shellcheck disable=SC2086 # the pins are words
    "$venv/bin/pip" install -q --disable-pip-version-check ${p#*:} "pytest>=7.4" "pytest-asyncio>=0.23"
    if [[ $v == 2.63 ]]; then
        run "$venv" "" || rc=1
    else
        run "$venv" "not code_interpreter" "${older[@]}" || rc=1
    fi
done
exit $rc
