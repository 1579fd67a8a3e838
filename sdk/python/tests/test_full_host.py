"""A full host: a daemon admitting one sandbox at a time refuses the
next with HostFull (Retry-After), and a client made with ``retries``
gets through once room is made."""

from __future__ import annotations

import asyncio
import threading

import pytest

import shoal
from conftest import Daemon


@pytest.fixture(scope="module")
def small_daemon():
    d = Daemon("--max-sandboxes", "1", "--no-pools")
    try:
        with shoal.Shoal(d.sock, autostart=False) as c:
            c.create_template("one", "tiny", timeout=300)
        yield d
    finally:
        d.stop()


def test_full_host_raises_host_full_with_retry_after(small_daemon):
    with shoal.Shoal(small_daemon.sock, autostart=False) as c:
        with c.create(template="one") as first:
            with pytest.raises(shoal.HostFull) as e:
                c.create(template="one")
            assert e.value.code == "host_full" and e.value.status == 429
            assert e.value.retry_after is not None and e.value.retry_after > 0
            assert isinstance(e.value, shoal.Retryable)
            # Still serving what it has.
            assert first.exec(["true"]).ok
        assert c.list() == []


def test_retries_get_through_once_room_is_made(small_daemon):
    with shoal.Shoal(small_daemon.sock, autostart=False, retries=20, backoff=0.2) as c:
        first = c.create(template="one")
        threading.Timer(1.5, first.kill).start()
        second = c.create(template="one")  # refused, retried, admitted
        try:
            assert second.id != first.id and second.exec(["true"]).ok
        finally:
            second.kill()


async def test_async_retries_and_no_retries(small_daemon):
    async with shoal.AsyncShoal(small_daemon.sock, autostart=False) as c:
        async with c.sandbox(template="one"):
            with pytest.raises(shoal.HostFull):
                await c.create(template="one")
    async with shoal.AsyncShoal(small_daemon.sock, autostart=False, retries=20) as c:
        first = await c.create(template="one")

        async def free_later() -> None:
            await asyncio.sleep(1.5)
            await first.kill()

        killer = asyncio.create_task(free_later())
        second = await c.create(template="one")
        await killer
        await second.kill()
