#!/usr/bin/env python3
"""Makes the sync client from the asyncio one: ``src/shoal/_async_X.py``
-> ``src/shoal/_sync_X.py``, by rewriting tokens (``async def`` -> ``def``,
``await x`` -> ``x``, ``AsyncSandbox`` -> ``Sandbox``, ``aiter_bytes`` ->
``iter_bytes``, ``_aio`` -> ``_sio``, ...). The two clients so have one
implementation and the same docstrings.

    python3 tools/gen_sync.py          # rewrite the sync files
    python3 tools/gen_sync.py --check  # exit 1 if any is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "src" / "shoal"
MODULES = ["client", "sandbox", "files"]
TESTS = Path(__file__).resolve().parent.parent / "tests"

# Applied in order, as regular expressions.
RULES: list[tuple[str, str]] = [
    (r"``_sync_(\w+)\.py``\s+is\s+made\s+from\s+this\s+file\s+by\s+``tools/gen_sync.py``"
     r"\s+\(never\s+edit\s+it\s+by\s+hand\)",
     r"Made from ``@ASYNC@\1.py`` by ``tools/gen_sync.py``: do not edit"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\bcontextlib\.asynccontextmanager\b", "contextlib.contextmanager"),
    (r"\bhttpx\.AsyncHTTPTransport\b", "httpx.HTTPTransport"),
    (r"\bhttpx\.AsyncClient\b", "httpx.Client"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsync(Shoal|Sandbox|Command|Files)\b", r"\1"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baiter_(lines|bytes)\b", r"iter_\1"),
    (r"\baread\b", "read"),
    (r"\baclose\b", "close"),
    (r"\b_aio\b", "_sio"),
    (r"\b_async_(\w+)\b", r"_sync_\1"),
    (r" \(sync or async\)", ""),
    (r"; sync or async\)", ")"),
    (r" \(may be async\)", ""),
    (r"\basyncio client\b", "sync client"),
    (r"@ASYNC@", "_async_"),
]
# And for the tests: their fixtures.
TEST_RULES: list[tuple[str, str]] = [
    (r'\A"""[^"]*"""',
     '"""Every call of the client against the real daemon, through the sync\n'
     'client (made from ``test_async_api.py`` by ``tools/gen_sync.py``: do not\n'
     'edit)."""'),
    (r"\baclient\b", "client"),
    (r"\basandbox\b", "sandbox"),
]


def convert(src: str, rules: list[tuple[str, str]] = RULES) -> str:
    for pat, rep in rules:
        src = re.sub(pat, rep, src)
    return src


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    pairs = [(PKG / f"_async_{m}.py", PKG / f"_sync_{m}.py", RULES) for m in MODULES]
    pairs.append((TESTS / "test_async_api.py", TESTS / "test_sync_api.py", TEST_RULES + RULES))
    for a, s, rules in pairs:
        want = f"# Generated from {a.name} by tools/gen_sync.py: do not edit.\n" + convert(
            a.read_text(), rules
        )
        if not s.exists() or s.read_text() != want:
            stale.append(s.name)
            if not check:
                s.write_text(want)
    if check and stale:
        print(f"out of date: {', '.join(stale)} (run python3 tools/gen_sync.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
