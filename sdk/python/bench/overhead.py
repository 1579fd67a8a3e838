#!/usr/bin/env python3
"""SDK overhead: a pooled create + exec + remove through the async SDK
against the same three requests through raw HTTP (httpx, no SDK), in the
same run, interleaved (the order alternates every round), on one daemon
with a warm pool. Also a call that never reaches a guest
(``GET /v1/sandboxes/{id}``), which shows the SDK's own cost alone.

    target/pyenv/bin/python sdk/python/bench/overhead.py [-n 60] [--out DIR]
        [--daemon SOCK]   # default: start a private shoald (target/release)

Writes DIR/sdk-overhead.json (the ``shoal bench plot`` document: CDFs per
system, latency per round, p50/p90 bars) and DIR/sdk-overhead-summary.json
(p50, p90, ratios, pool hits), then draws the PNGs with
``target/release/shoal bench plot``. Goal: the SDK at most 10% slower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

import shoal
from shoal._core import socket_answers

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE = "bench-tiny"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def start_daemon(bins: Path, artifacts: str | None) -> tuple[subprocess.Popen, str, str]:
    tmp = tempfile.mkdtemp(prefix="shoal-bench-")
    sock = os.path.join(tmp, "shoald.sock")
    env = dict(os.environ)
    env.setdefault("SHOAL_VMM", str(bins / "shoal-vmm"))
    env.setdefault("SHOAL_JAILER", str(bins / "shoal-jailer"))
    args = [str(bins / "shoald"), "--state-dir", tmp]
    if artifacts:
        args += ["--artifacts", artifacts]
    log = open(os.path.join(tmp, "shoald.log"), "ab")
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    end = time.monotonic() + 30
    while not socket_answers(sock):
        if p.poll() is not None or time.monotonic() > end:
            sys.exit(f"shoald did not start; see {tmp}/shoald.log")
        time.sleep(0.02)
    return p, tmp, sock


def stop_daemon(p: subprocess.Popen, tmp: str) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if tmp.encode() in (d / "cmdline").read_bytes():
                    os.kill(int(d.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
    shutil.rmtree(tmp, ignore_errors=True)


async def sdk_round(c: shoal.AsyncShoal) -> tuple[float, bool]:
    t0 = time.perf_counter()
    sb = await c.create(template=TEMPLATE)
    r = await sb.exec(["true"])
    await sb.kill()
    dt = time.perf_counter() - t0
    assert r.exit_code == 0
    return dt, bool(sb.info.from_pool)


async def raw_round(h: httpx.AsyncClient) -> tuple[float, bool]:
    t0 = time.perf_counter()
    r = await h.post("/v1/sandboxes", json={"template": TEMPLATE})
    r.raise_for_status()
    v = r.json()
    e = await h.post(f"/v1/sandboxes/{v['id']}/exec", json={"cmd": ["true"]})
    e.raise_for_status()
    d = await h.delete(f"/v1/sandboxes/{v['id']}")
    d.raise_for_status()
    dt = time.perf_counter() - t0
    assert e.json()["exit_code"] == 0
    return dt, bool(v.get("from_pool"))


async def wait_pool(c: shoal.AsyncShoal, ready: int) -> None:
    await c.wait_pool(TEMPLATE, ready, timeout=600)


async def run(sock: str, n: int, pool: int, calls: int) -> dict:
    async with shoal.AsyncShoal(sock, autostart=False) as c:
        try:
            await c.get_template(TEMPLATE)
        except shoal.TemplateNotFound:
            await c.create_template(TEMPLATE, "tiny", timeout=600)
        await c.set_pool(TEMPLATE, pool)
        await wait_pool(c, pool)
        transport = httpx.AsyncHTTPTransport(uds=sock)
        async with httpx.AsyncClient(base_url="http://shoald", transport=transport, timeout=300) as h:
            # Warm both paths once (connections, imports).
            await sdk_round(c)
            await raw_round(h)
            res: dict[str, list[float]] = {"sdk": [], "raw": []}
            hits = {"sdk": 0, "raw": 0}
            for i in range(n):
                order = ("sdk", "raw") if i % 2 == 0 else ("raw", "sdk")
                for who in order:
                    await wait_pool(c, pool)  # both start from a full pool
                    dt, hit = await (sdk_round(c) if who == "sdk" else raw_round(h))
                    res[who].append(dt * 1000)
                    hits[who] += hit
            # The SDK's own cost: a call that never reaches a guest.
            sb = await c.create(template=TEMPLATE)
            info = {"sdk": [], "raw": []}
            for i in range(calls):
                for who in (("sdk", "raw") if i % 2 == 0 else ("raw", "sdk")):
                    t0 = time.perf_counter()
                    if who == "sdk":
                        await sb.refresh()
                    else:
                        (await h.get(f"/v1/sandboxes/{sb.id}")).raise_for_status()
                    info[who].append((time.perf_counter() - t0) * 1000)
            await sb.kill()
        await c.set_pool(TEMPLATE, 0)
    return {"rounds": res, "pool_hits": hits, "info": info}


def summarize(r: dict, n: int) -> dict:
    out: dict = {"n": n, "pool_hits": r["pool_hits"]}
    for key in ("rounds", "info"):
        s, w = r[key]["sdk"], r[key]["raw"]
        out[key] = {
            "sdk_p50_ms": pct(s, 0.5),
            "sdk_p90_ms": pct(s, 0.9),
            "raw_p50_ms": pct(w, 0.5),
            "raw_p90_ms": pct(w, 0.9),
            "ratio_p50": pct(s, 0.5) / pct(w, 0.5),
            "ratio_p90": pct(s, 0.9) / pct(w, 0.9),
            "sdk_mean_ms": statistics.fmean(s),
            "raw_mean_ms": statistics.fmean(w),
            "samples": len(s),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=60, help="rounds per system (>= 50)")
    ap.add_argument("--pool", type=int, default=4, help="warm pool size")
    ap.add_argument("--calls", type=int, default=500, help="GET calls per system")
    ap.add_argument("--out", default=str(ROOT / "target" / "bench"), help="output directory")
    ap.add_argument("--daemon", help="a running daemon's socket (default: start one)")
    ap.add_argument("--bins", default=str(ROOT / "target" / "release"))
    ap.add_argument("--artifacts", default=os.environ.get("SHOAL_ARTIFACTS"))
    a = ap.parse_args()
    if a.n < 50:
        sys.exit("-n: at least 50 rounds")
    bins = Path(a.bins)
    proc = tmp = None
    sock = a.daemon
    if sock is None:
        proc, tmp, sock = start_daemon(bins, a.artifacts)
    try:
        r = asyncio.run(run(sock, a.n, a.pool, a.calls))
    finally:
        if proc is not None:
            stop_daemon(proc, tmp)
    s = summarize(r, a.n)
    ro, io_ = s["rounds"], s["info"]
    sub = (
        f"N={a.n} rounds each, interleaved; SDK/raw p50 {ro['ratio_p50']:.3f},"
        f" p90 {ro['ratio_p90']:.3f}; GET p50 {io_['sdk_p50_ms']:.2f} vs {io_['raw_p50_ms']:.2f} ms"
    )
    doc = {
        "title": "Python SDK overhead: async SDK vs raw HTTP (httpx)",
        "subtitle": sub,
        "unit": "ms",
        "series": [
            {"label": "async SDK", "samples": r["rounds"]["sdk"]},
            {"label": "raw HTTP", "samples": r["rounds"]["raw"]},
        ],
        "xy": {
            "title": "Each round in order (interleaved)",
            "x_label": "round",
            "y_label": "create + exec + remove (ms)",
            "series": [
                {"label": "async SDK", "points": [[i, v] for i, v in enumerate(r["rounds"]["sdk"])]},
                {"label": "raw HTTP", "points": [[i, v] for i, v in enumerate(r["rounds"]["raw"])]},
            ],
        },
        "bars": {
            "title": "p50 and p90",
            "y_label": "create + exec + remove (ms)",
            "bars": [
                {"label": "SDK p50", "value": ro["sdk_p50_ms"]},
                {"label": "raw p50", "value": ro["raw_p50_ms"]},
                {"label": "SDK p90", "value": ro["sdk_p90_ms"]},
                {"label": "raw p90", "value": ro["raw_p90_ms"]},
            ],
        },
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sdk-overhead.json").write_text(json.dumps(doc, allow_nan=False, indent=1))
    s["goal"] = "SDK p50 at most 10% slower than raw HTTP"
    s["goal_met"] = ro["ratio_p50"] <= 1.10
    (out / "sdk-overhead-summary.json").write_text(json.dumps(s, indent=1))
    print(json.dumps(s, indent=1))
    cli = bins / "shoal"
    if cli.is_file():
        subprocess.run([str(cli), "bench", "plot", str(out / "sdk-overhead.json"), "--plot", str(out)], check=True)
    else:
        print(f"{cli} missing: no PNG (cargo build --release -p shoal-cli)", file=sys.stderr)


if __name__ == "__main__":
    main()
