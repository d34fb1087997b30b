"""A ``zlink.connect`` client of a node that listens on 127.0.0.1 (docs/guide/mesh.md).

The node serves the tutorial's chat App on a free port of 127.0.0.1; the clients use only the
message classes. They run in this process to keep the example self-contained; from another
process the code is the same. Run it with ``python -m examples.guide.remote``, or, against a
node you started yourself (``zlink run examples.guide.chat:app --listen tcp://127.0.0.1:7101``),
with ``python -m examples.guide.remote tcp://127.0.0.1:7101``.
"""

from __future__ import annotations

import asyncio
import sys

import zlink
from examples.guide.chat import EnterRoom, Say, Transcript, WhoAmI, app


# [start:blocking]
def blocking_client(endpoint: str) -> None:
    """A plain thread: terminals that block (wait) or return futures."""
    with zlink.connect(endpoint, timeout=5.0) as client:
        client.spots.get_or_create("lounge", "chat.room").wait(5)
        client.actors.get_or_create("carol", "chat.user").wait(5)
        client.send_to_actor("carol", EnterRoom(room="lounge", nick="carol")).wait(5)
        print("carol:", client.request_to_actor("carol", WhoAmI()).timeout(2).wait(5))
        client.request_to_actor("carol", Say(text="anyone here?")).timeout(2).wait(5)
        print("lounge:", client.request_to_spot("lounge", Transcript()).timeout(2).wait(5))


# [end:blocking]


# [start:asyncio]
async def asyncio_client(endpoint: str) -> None:
    """asyncio code: ``await`` a call; the event loop is never blocked (connect_async and
    its ``async with`` connect and leave on a thread of their own)."""
    async with zlink.connect_async(endpoint, timeout=5.0) as client:
        await client.actors.get_or_create("dave", "chat.user")
        await client.send_to_actor("dave", EnterRoom(room="lounge", nick="dave"))
        print("dave:", await client.request_to_actor("dave", WhoAmI()).timeout(2))
        await client.request_to_actor("dave", Say(text="hi carol")).timeout(2)
        lines = await client.request_to_spot("lounge", Transcript()).timeout(2)
        print("lounge:", lines)


# [end:asyncio]


# [start:main]
def main() -> None:
    if len(sys.argv) > 1:  # a node that runs elsewhere: python -m examples.guide.remote ENDPOINT
        blocking_client(sys.argv[1])
        asyncio.run(asyncio_client(sys.argv[1]))
        return
    config = zlink.NodeConfig(node_id="chat-1", listen="tcp://127.0.0.1:0")  # 0: a free port
    with zlink.Node(app, config) as node:
        endpoint = node.address  # tcp://127.0.0.1:<the port it bound>
        assert endpoint is not None
        blocking_client(endpoint)
        asyncio.run(asyncio_client(endpoint))


if __name__ == "__main__":
    main()
# [end:main]
