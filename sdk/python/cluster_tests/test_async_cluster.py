"""``AsyncShoalCluster`` on the suite's cluster (3 Ray nodes, 3 shoald,
real guests): create, exec, files, get, list and kill through it, the
ids routed to their node."""

from __future__ import annotations

import asyncio

import pytest

import shoal
from shoal.cluster import AsyncClusterSandbox, AsyncShoalCluster, SandboxLost, ShoalCluster

from conftest import NAMES, NAMESPACE, TEMPLATE, Env


async def test_async_cluster_creates_routes_and_kills(env: Env, cluster: ShoalCluster) -> None:
    async with AsyncShoalCluster(namespace=NAMESPACE, seed=3) as ac:
        assert await ac.live_nodes() == list(NAMES)
        sbs: list[AsyncClusterSandbox] = []
        try:
            # One pinned per node, and one placed, at once.
            sbs = list(
                await asyncio.wait_for(
                    asyncio.gather(
                        *(ac.create(template=TEMPLATE, node=n) for n in NAMES),
                        ac.create(template=TEMPLATE, metadata={"via": "async"}),
                    ),
                    timeout=180,
                )
            )
            for sb in sbs:
                assert isinstance(sb, shoal.AsyncSandbox)
                assert sb.id == f"{sb.node}.{sb.local_id}" == sb.info.id
                assert sb.info.state == "running"
            assert [s.node for s in sbs[:3]] == list(NAMES)
            outs = await asyncio.gather(*(s.exec(["echo", s.node]) for s in sbs))
            assert [o.text for o in outs] == [f"{s.node}\n" for s in sbs]
            await sbs[1].files.write("/tmp/who", b"n1")
            assert await sbs[1].files.read("/tmp/who") == b"n1"
            # The local id is on its node's daemon only.
            for name in NAMES:
                d = env.daemons[name]
                async with shoal.AsyncShoal(d.url, token=d.token) as direct:
                    if name == sbs[1].node:
                        assert (await direct.get(sbs[1].local_id)).info.state == "running"
                    else:
                        with pytest.raises(shoal.SandboxNotFound):
                            await direct.get(sbs[1].local_id)
            # The same ids through the sync client and back.
            assert cluster.get(sbs[2].id).exec(["echo", "sync"]).text == "sync\n"
            again = await ac.get(sbs[0].id)
            assert again.id == sbs[0].id and again.node == sbs[0].node
            listed = {s.id for s in await ac.list(metadata={"via": "async"})}
            assert listed == {sbs[3].id}
            with pytest.raises(shoal.BadRequest):
                await ac.get("no-dot-here")
            with pytest.raises(SandboxLost):
                await ac.get("n9.abcdef")
            await ac.kill(sbs[0].id)
            with pytest.raises(shoal.SandboxNotFound):
                await ac.get(sbs[0].id)
            await ac.kill(sbs[0].id, missing_ok=True)
        finally:
            await asyncio.gather(*(s.kill(missing_ok=True) for s in sbs))
        assert not await ac.list(metadata={"via": "async"})
