"""Fixtures the conformance tests share with the unit tests."""

# ``nodes``: fake nodes around real ZeroMQ transports on 127.0.0.1 (the transport audit's
# tests build them as the transport's own tests do)
from tests.unit.test_zmq_transport_flow import nodes  # noqa: F401 - a fixture
