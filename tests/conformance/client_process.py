"""The messages of the ClientServer tests, and a client process that uses them.

    python -m tests.conformance.client_process ENDPOINT N

connects to the node at ENDPOINT and, from two threads at once, sends N numbered ``Note``s
each to the Spot ``p`` (``submit()``, and ``wait()`` for room when the window is full), with an
``Echo`` request every tenth note; then asks the Spot what it saw (``Seen``) and prints one
JSON object: ``replies`` (per thread, in order), ``seen`` and the client's ``counters``. The
test checks exactly once and per-sender order. Every wait here is bounded.
"""

from __future__ import annotations

import json
import sys
import threading

import zlink

WAIT = 10.0


class Note(zlink.Message, type_name="t.cs.note"):
    n: int
    who: str = ""


class News(zlink.Message, type_name="t.cs.news"):
    text: str


class Seen(zlink.Request[list[str]], type_name="t.cs.seen"):
    pass


class Echo(zlink.Request[str], type_name="t.cs.echo"):
    text: str


class Fail(zlink.Request[int], type_name="t.cs.fail"):
    pass


class Hold(zlink.Request[str], type_name="t.cs.hold"):
    pass


def _sender(client: zlink.Client, who: str, n: int, replies: list[str]) -> None:
    for i in range(n):
        note = Note(n=i, who=who)
        try:
            client.send_to_spot("p", note).submit()
        except zlink.ResourceExhausted:  # the window is full: wait for room instead
            client.send_to_spot("p", note).wait(WAIT)
        if i % 10 == 0:
            replies.append(client.request_to_spot("p", Echo(text=f"{who}:{i}")).wait(WAIT))


def main(argv: list[str]) -> int:
    endpoint, n = argv[0], int(argv[1])
    with zlink.connect(endpoint, timeout=WAIT) as client:
        client.spots.get_or_create("p", "t.cs.room").wait(WAIT)
        replies: dict[str, list[str]] = {"a": [], "b": []}
        threads = [
            threading.Thread(target=_sender, args=(client, who, n, out))
            for who, out in replies.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT * 6)
        seen = client.request_to_spot("p", Seen()).wait(WAIT)
        print(json.dumps({"replies": replies, "seen": seen, "counters": client.counters()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
