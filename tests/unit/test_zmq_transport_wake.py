"""The transport thread's wake-up flag never stays set with no wake-up on its way.

A hand-over (``send_client``, ``send``) wakes the transport thread only when the flag says no
wake-up is on its way. If the thread cleared the flag *before* reading the wake-ups, a wake-up
sent in between was read too, the flag stayed set, and every later hand-over waited for the
poll's timeout (up to the ping interval: replies to clients 100 ms late on average).
"""

from __future__ import annotations

import zmq

from zlink.mesh.zmq_transport import ZmqTransport


def test_a_wake_up_sent_while_the_thread_drains_them_is_not_lost():
    transport = ZmqTransport("tcp://127.0.0.1:0")
    try:
        transport.endpoint("n1")  # binds; the thread is not started: this test is the thread
        transport.send_client(b"c1", b"first")  # sets the flag and sends one wake-up
        real_recv = transport._wake_r.recv
        raced = []

        def recv(flags: int = 0) -> bytes:
            if not raced:  # another thread hands a frame over right now
                raced.append(True)
                transport.send_client(b"c2", b"second")
            return real_recv(flags)

        transport._wake_r.recv = recv  # type: ignore[method-assign]
        transport._drain_wake()
        transport._wake_r.recv = real_recv  # type: ignore[method-assign]
        pending = transport._wake_r.poll(0, zmq.POLLIN)
        # either a wake-up is still on its way, or the next hand-over will send one
        assert pending or not transport._signalled
    finally:
        transport._ctx.destroy(linger=0)
