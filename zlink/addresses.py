"""Network addresses a node listens on or connects to (python-api §10): checked once, here.

Guarantees / assumes: pure functions of their text; nothing here opens a socket.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from .errors import InvalidArgument


def is_loopback(endpoint: str) -> bool:
    """Whether a ``tcp://host:port`` endpoint names this machine only (python-api §10)."""
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(endpoint: str) -> str:
    """A ``tcp://host:port`` to bind (port ``0`` or ``*``: any free one); ``InvalidArgument``
    otherwise."""
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        raise InvalidArgument(f"listen must be tcp://HOST:PORT, got {endpoint!r}")
    rest = endpoint[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not (port == "*" or (port.isdigit() and int(port) < 65536)):
        raise InvalidArgument(f"listen must be tcp://HOST:PORT, got {endpoint!r}")
    if host.startswith("[") or ":" in host:  # (ZeroMQ would fail to bind it: "No such device")
        raise InvalidArgument(
            f"listen {endpoint!r} is an IPv6 address: the mesh's sockets speak IPv4 only for "
            "now; give an IPv4 address or a host name"
        )
    return endpoint


def check_endpoint(endpoint: object) -> str:
    """A ``tcp://host:port`` to connect to (a client's node): a concrete port ``1..65535``;
    ``InvalidArgument`` otherwise. Any host is taken: the client side may reach across a
    network (python-api §10; its security is the node's keys, a later step)."""
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        raise InvalidArgument(f"an endpoint is tcp://HOST:PORT, got {endpoint!r}")
    host, sep, port = endpoint[len("tcp://") :].rpartition(":")
    # (a NUL or a lone surrogate, neither printable, reached ZeroMQ: ZMQError, UnicodeError)
    if not sep or not host or "/" in host or any(c.isspace() or not c.isprintable() for c in host):
        raise InvalidArgument(f"an endpoint is tcp://HOST:PORT, got {endpoint!r}")
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InvalidArgument(f"an endpoint's port is 1..65535, got {endpoint!r}")
    if host.startswith("[") or ":" in host:  # (ZeroMQ would try it for the whole timeout)
        raise InvalidArgument(
            f"endpoint {endpoint!r} is an IPv6 address: the mesh's sockets speak IPv4 only for "
            "now; give an IPv4 address or a host name"
        )
    if not _host_name(host.removesuffix("."), underscore=True):  # (ZeroMQ refused some at
        raise InvalidArgument(  # connect, a raw ZMQError: '-a', '%', '*', 'a@b', 'é', '..')
            f"an endpoint's host is a host name or an IPv4 address, got {endpoint!r}"
        )
    return endpoint


def _host_name(name: str, underscore: bool = False) -> bool:
    """Whether ``name`` is a DNS host name (or a dotted IPv4 address, which is one in form):
    labels of 1..63 ASCII letters, digits and hyphens, none at a label's start or end, at most
    253 characters; ``underscore``: also within a label (container and service names), never
    first (ZeroMQ refuses that)."""
    extra = "-_" if underscore else "-"
    return 0 < len(name) <= 253 and all(
        0 < len(label) <= 63 and label.isascii() and label[0].isalnum()
        and label[-1] != "-" and all(c.isalnum() or c in extra for c in label)
        for label in name.split(".")
    )  # fmt: skip


def check_advertise(host: object) -> str:
    """The host other nodes and clients reach a node at (``NodeConfig.advertise``): a DNS name
    or an IPv4 address, no scheme and no port (the bound ports are kept). ``InvalidArgument``
    otherwise, and for an IPv6 address: the mesh's sockets speak IPv4 only for now, so a node
    advertised at one could never be reached."""
    if not isinstance(host, str) or not host or len(host) > 253:
        raise InvalidArgument(f"advertise is a host name or an IP address, got {host!r}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if not _host_name(bare):
            raise InvalidArgument(
                f"advertise is a host name or an IP address (no scheme, no port), got {host!r}"
            ) from None
        return bare
    if address.version == 6:
        raise InvalidArgument(
            f"advertise {host!r} is an IPv6 address: the mesh reaches nodes over IPv4 only "
            "for now; give an IPv4 address or a host name"
        )
    return str(address)


def advertised(endpoint: str, host: str) -> str:
    """``endpoint`` (``tcp://HOST:PORT``, as bound) with its host replaced by ``host``."""
    _bound, _, port = endpoint.rpartition(":")
    return f"tcp://{host}:{port}"
