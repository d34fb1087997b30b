"""Static types of the call builders, checked by mypy (``tests/unit/test_typing_calls.py``).

Not a test module (no ``test_`` prefix): nothing here runs. Each ``assert_type`` states what a
caller's type checker sees: an option keeps the exact call type (``Self``), and a request's
reply is the ``T`` of its ``Request[T]`` message (python-api §4).
"""

from __future__ import annotations

import concurrent.futures
from typing import assert_type

import zlink
from zlink.mesh.client import RemoteClient
from zlink.messaging.calls import (
    BatchSendCall,
    WatchedCreateCall,
    WatchedRequestCall,
    WatchedSendCall,
    WatchedWorkerCall,
)


class Total(zlink.Request[int]):
    pass


class Card(zlink.Message):
    numbers: list[int] = []


class GetCard(zlink.Request[Card]):
    player_id: str = ""


class Ping(zlink.Message):
    pass


def square(x: int) -> int:
    return x * x


def client_calls(client: zlink.Client) -> None:
    assert_type(client.request_to_spot("x", Total()), zlink.RequestCall[int])
    assert_type(client.request_to_spot("x", Total()).wait(5), int)
    assert_type(client.request_to_spot("x", Total()).timeout(2).wait(5), int)
    assert_type(
        client.request_to_spot("x", GetCard()).metadata("k", "v").timeout(2),
        zlink.RequestCall[Card],
    )
    assert_type(client.request_to_spot("x", Total()).instance_spot("t").in_mesh("m").wait(), int)
    assert_type(client.request_to_actor("a", GetCard()).timeout(1).wait(), Card)
    assert_type(client.request("ch", Total()).future(), concurrent.futures.Future[int])

    assert_type(client.send_to_spot("x", Ping()), zlink.SendCall)
    assert_type(client.send_to_spot("x", Ping()).metadata("k", "v"), zlink.SendCall)
    assert_type(client.send_to_actor("a", Ping()).in_mesh("m").instance_spot(), zlink.SendCall)
    assert_type(client.send("ch", Ping()).metadata("k", "v").submit(), None)
    assert_type(client.publish("t", Ping()).wait(1), None)
    assert_type(client.send_many_to_spot("x", [Ping()]), BatchSendCall)

    assert_type(client.spots.create("room").timeout(1), zlink.CreateCall[zlink.SpotCreateResult])
    assert_type(
        client.spots.get_or_create("r", "room").request(Ping()).in_mesh("m").wait(),
        zlink.SpotCreateResult,
    )
    assert_type(
        client.actors.create("player", actor_id="p").timeout(1).wait(), zlink.ActorCreateResult
    )
    assert_type(client.actors.get_or_create("p", "player").wait(), zlink.ActorCreateResult)


def remote_calls(remote: RemoteClient) -> None:
    assert_type(remote.request_to_spot("x", Total()).timeout(2).wait(5), int)


async def handler_calls(context: zlink.SpotContext) -> None:
    assert_type(await context.outbound.request_to_spot("x", Total()).timeout(1), int)
    assert_type(await context.outbound.request_to_spot("x", GetCard()).yield_(), Card)
    assert_type(await context.outbound.send_to_spot("x", Ping()).metadata("k", "v"), None)
    assert_type(context.workers.io(square, 3), zlink.WorkerCall[int])
    assert_type(await context.workers.cpu(square, 3).timeout(1), int)
    assert_type((await context.spots.get_or_create("r", "room").timeout(1)).spot_ref, zlink.SpotRef)


def watched_keep_their_class(
    send: WatchedSendCall,
    request: WatchedRequestCall[int],
    create: WatchedCreateCall[zlink.ActorCreateResult],
    work: WatchedWorkerCall[str],
) -> None:
    assert_type(send.metadata("k", "v").in_mesh("m"), WatchedSendCall)
    assert_type(request.timeout(1).metadata("k", "v"), WatchedRequestCall[int])
    assert_type(create.timeout(1).request(Ping()), WatchedCreateCall[zlink.ActorCreateResult])
    assert_type(work.timeout(1), WatchedWorkerCall[str])
