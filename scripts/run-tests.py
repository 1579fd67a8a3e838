#!/usr/bin/env python3
"""scripts/run-tests.py [--lanes N] [--skip NAME ...] [--more-lanes-after FILE ...] [-p PKG ...]

Runs every test binary of the workspace (what `cargo test --workspace`
runs: lib, bin and integration tests, then the doc tests) in N lanes at
once, longest first, and prints each binary's result as it ends, with its
wall time. Unlike `cargo test`, a failing binary does not stop the others:
every failure is listed at the end, and the exit status is 1 if any failed.

Why lanes: most KVM tests wait on one emulated guest vCPU at a time, and
many binaries hold one or two long tests, so one binary at a time leaves a
core idle for much of the run. Each binary still runs its own tests on
libtest's threads. With --more-lanes-after, the lanes after the first wait
for those files (scripts/test.sh: until the Python suites beside it end),
so the host's cores are not shared by more guests than the tests' timing
was made for.

The order comes from the last run's wall times (target/test-times.json),
else from the table below (seconds measured in a full CI run on a 2-core
PVM host); binaries in neither come after those in either.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

# Wall seconds of the long binaries in a full run (CI, 2-core PVM host).
KNOWN_SECS = {
    "commands": 188, "fncall": 154, "net_daemon": 134, "net_flood": 120, "balloon_guest": 119,
    "daemon": 79, "hostile_agent": 64, "evict_daemon": 60, "slots": 55,
    "sandbox": 51, "snapshot_small": 49, "containers": 48, "evict_guest": 47,
    "net_guest": 38, "vsock_guest_flood": 34, "pmem": 31, "fork": 31,
    "fake_daemon": 26, "lang_layers": 25, "jail": 18, "vm_qemu_guest": 16,
    "seccomp": 16, "agent": 14, "vm_daemon": 300, "vm_disk": 60, "vsock_limits": 13,
    "cpu_class": 13, "linux_boot": 12, "fncall_cost": 12,
}

TIMES = "target/test-times.json"

# Binaries that set up host networking (network namespaces, veths, TAPs,
# nftables tables, NAT): run one after another in one lane, never beside
# each other. (package folder, target name)
NETWORK = {
    ("tests", "net_daemon"), ("tests", "net_guest"), ("tests", "net_pool"), ("tests", "net_flood"),
    ("tests", "jail"), ("tests", "vm_net_daemon"),
    ("hostnet", "slots"), ("hostnet", "slot_prepare"), ("hostnet", "dns"), ("devices", "net"), ("guest-agent", "net"),
    ("guest-agent", "tcp_forward"), ("jailer", "jail"),
}


def build(root, packages):
    """Builds the test binaries; returns the jobs that run them."""
    scope = [a for p in packages for a in ("-p", p)] or ["--workspace"]
    cmd = ["cargo", "test", *scope, "--no-run", "--message-format=json-render-diagnostics"]
    p = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, text=True)
    jobs = []
    for line in p.stdout:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if not m["profile"]["test"]:
            continue
        t = m["target"]
        pkg_dir = os.path.dirname(m["manifest_path"])
        pkg = os.path.basename(pkg_dir)
        kind = t["kind"][0]
        label = f"{pkg}: {kind} {t['name']}" if kind != "test" else f"{pkg}: tests/{t['name']}"
        known = KNOWN_SECS.get(t["name"], 5) if kind == "test" else 5
        step = {"label": label, "exe": m["executable"], "dir": pkg_dir, "known": known}
        jobs.append({"label": label, "steps": [step], "net": (pkg, t["name"]) in NETWORK})
    if p.wait() != 0:
        sys.exit(f"run-tests: `{' '.join(cmd)}` failed (exit {p.returncode})")
    net = [s for j in jobs if j["net"] for s in j["steps"]]
    jobs = [j for j in jobs if not j["net"]]
    if net:
        jobs.append({"label": "the network binaries, one at a time", "steps": net})
    doc = {"label": "doc tests", "exe": None, "dir": root, "known": 5, "scope": scope}
    jobs.append({"label": "doc tests", "steps": [doc]})
    return jobs


def expected(job, last):
    return sum(last.get(s["label"], s["known"]) for s in job["steps"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--skip", action="append", default=[], help="a test name filter to skip (libtest --skip)")
    ap.add_argument("--more-lanes-after", action="append", default=[], metavar="FILE",
                    help="lanes after the first start only once FILE exists (repeatable: all of them)")
    ap.add_argument("-p", "--package", action="append", default=[], help="only this package (default: all)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    t0 = time.monotonic()
    jobs = build(root, args.package)
    print(f"== run-tests: {sum(len(j['steps']) for j in jobs)} test binaries built in {time.monotonic() - t0:.0f} s; "
          f"{args.lanes} lanes", file=sys.stderr, flush=True)
    try:
        with open(os.path.join(root, TIMES)) as f:
            last = json.load(f)
    except (OSError, ValueError):
        last = {}
    jobs.sort(key=lambda j: -expected(j, last))

    skip = []
    for s in args.skip:
        skip += ["--skip", s]
    lock = threading.Lock()
    results = {}
    pending = list(jobs)

    def lane(n):
        if n > 1 and args.more_lanes_after:
            while not all(os.path.exists(f) for f in args.more_lanes_after):
                with lock:
                    if not pending:
                        return
                time.sleep(2)
            with lock:
                print(f"== [{time.monotonic() - t0:.0f} s] lane {n} starts", file=sys.stderr, flush=True)
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
            for step in job["steps"]:
                run_step(n, step)

    def run_step(n, step):
        start = time.monotonic()
        if step["exe"] is None:
            cmd = ["cargo", "test", *step["scope"], "--doc", "-q"]
        else:
            cmd = [step["exe"], *skip]
        env = dict(os.environ, CARGO_MANIFEST_DIR=step["dir"])
        r = subprocess.run(cmd, cwd=step["dir"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace")
        secs = time.monotonic() - start
        ok = r.returncode == 0
        summary = [line for line in r.stdout.splitlines() if line.startswith("test result:")]
        with lock:
            results[step["label"]] = (ok, secs)
            at = time.monotonic() - t0
            print(f"== [{at:.0f} s] lane {n}: {step['label']}: {'ok' if ok else 'FAILED'} "
                  f"in {secs:.1f} s", file=sys.stderr, flush=True)
            if ok:
                for line in summary:
                    print(f"   {line}", file=sys.stderr)
            else:
                print(r.stdout, file=sys.stderr, flush=True)

    threads = [threading.Thread(target=lane, args=(i + 1,)) for i in range(args.lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    times = dict(last)
    times.update({label: round(secs, 1) for label, (_, secs) in results.items()})
    try:
        with open(os.path.join(root, TIMES), "w") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError as e:
        print(f"run-tests: could not save {TIMES}: {e}", file=sys.stderr)

    failed = [label for label, (ok, _) in results.items() if not ok]
    slow = sorted(results.items(), key=lambda kv: -kv[1][1])[:10]
    print("== run-tests: slowest: " + ", ".join(f"{label} {secs:.0f} s" for label, (_, secs) in slow),
          file=sys.stderr)
    if failed:
        print(f"== run-tests: {len(failed)} of {len(results)} FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    print(f"== run-tests: all {len(results)} passed in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
