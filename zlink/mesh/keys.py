"""CURVE keys of a mesh (python-api §10: a mesh on a network is encrypted and authenticated).

Layout of a keys folder (``zlink keys generate DIR``), in ZeroMQ's certificate format:

* ``DIR/mesh.key`` (public) and ``DIR/mesh.key_secret``: the mesh's key pair. Every node
  serves with it and presents it to its peers, so a node proves it belongs to the mesh by
  holding the secret.
* ``DIR/clients/NAME.key`` and ``NAME.key_secret``: one key pair per client
  (``zlink.connect(endpoint, keys=DIR, client=NAME)``). A node accepts the public keys found
  there when it starts; deleting a client's files and restarting the nodes revokes it.

A node reads ``mesh.key``, ``mesh.key_secret`` and ``clients/*.key`` (no client's secret); a
client reads ``mesh.key`` and its own pair (not the mesh's secret): each is given only those
(docs/guide/mesh.md "Security"; a probe found the guide saying to give clients the whole
folder, whose secrets let a client serve as a node or pose as another client).

Guarantees / assumes: a folder that is missing, or lacks the mesh's secret, is refused with
``InvalidArgument`` when the node or client is built, never at the first connection; secrets are
written readable by their owner only (0600).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument

MESH = "mesh"
CLIENTS = "clients"


@dataclass(frozen=True)
class MeshKeys:
    """What a node needs: the mesh's key pair and the public keys it lets in."""

    public: bytes
    secret: bytes
    allowed: frozenset[bytes]  # the mesh's own key (peers) and every client's

    @staticmethod
    def load(folder: str | os.PathLike[str]) -> MeshKeys:
        """The keys in ``folder``; ``InvalidArgument`` if it is not a keys folder."""
        root = Path(folder)
        public, secret = _pair(root / f"{MESH}.key_secret")
        allowed = {public}
        clients = root / CLIENTS
        if clients.is_dir():
            for path in sorted(clients.glob("*.key")):
                allowed.add(_public(path))
        return MeshKeys(public, secret, frozenset(allowed))


@dataclass(frozen=True)
class ClientKeys:
    """What a client needs: the mesh's public key and its own key pair."""

    server: bytes
    public: bytes
    secret: bytes

    @staticmethod
    def load(folder: str | os.PathLike[str], name: str = "client") -> ClientKeys:
        root = Path(folder)
        public, secret = _pair(root / CLIENTS / f"{name}.key_secret")
        return ClientKeys(_public(root / f"{MESH}.key"), public, secret)


def generate(folder: str | os.PathLike[str], clients: list[str] | None = None) -> list[Path]:
    """Write a mesh key pair and one key pair per client name (default: ``client``) into
    ``folder`` (made if missing); refuses to overwrite a mesh key. Returns the files."""
    import zmq.auth

    root = Path(folder)
    if (root / f"{MESH}.key_secret").exists():
        raise InvalidArgument(
            f"{root} already holds a mesh key; use another folder (or `zlink keys add-client` "
            "to add a client to it)"
        )
    names = _client_names(clients if clients else ["client"])
    (root / CLIENTS).mkdir(parents=True, exist_ok=True)
    written = [Path(p) for p in zmq.auth.create_certificates(root, MESH)]
    return _secret_only(written + _client_pairs(root, names))


def add_clients(folder: str | os.PathLike[str], clients: list[str]) -> list[Path]:
    """Write a key pair for each client name into the keys folder ``folder`` (made by
    ``generate``), keeping its mesh key; refuses a name that has a pair already (a new one
    would lock its holder out). Nodes read client keys when they start: restart them to let
    the new clients in. Returns the files."""
    root = Path(folder)
    if not (root / f"{MESH}.key_secret").is_file():
        raise InvalidArgument(f"{root} holds no mesh key (make one with `zlink keys generate`)")
    names = _client_names(clients)
    taken = [n for n in names if (root / CLIENTS / f"{n}.key").exists()
             or (root / CLIENTS / f"{n}.key_secret").exists()]  # fmt: skip
    if taken:
        raise InvalidArgument(f"{root} already holds a key pair for {', '.join(taken)}")
    (root / CLIENTS).mkdir(parents=True, exist_ok=True)
    return _secret_only(_client_pairs(root, names))


def _client_names(names: list[str]) -> list[str]:
    if not names:
        raise InvalidArgument("name at least one client")
    for name in names:
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgument(f"a client name is a plain file name, got {name!r}")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a client name is given once, got {names!r}")
    return names


def _client_pairs(root: Path, names: list[str]) -> list[Path]:
    import zmq.auth

    written: list[Path] = []
    for name in names:
        written += [Path(p) for p in zmq.auth.create_certificates(root / CLIENTS, name)]
    return written


def _secret_only(paths: list[Path]) -> list[Path]:
    """Secrets readable by their owner only (0600); returns ``paths``."""
    for path in paths:
        if path.name.endswith("_secret"):
            path.chmod(0o600)
    return paths


def _pair(path: Path) -> tuple[bytes, bytes]:
    import zmq.auth

    if not path.is_file():
        raise InvalidArgument(f"no key pair at {path} (make one with `zlink keys generate`)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{path} is not a ZeroMQ certificate: {exc}") from None
    if secret is None:
        raise InvalidArgument(f"{path} holds no secret key")
    return public, secret


def _public(path: Path) -> bytes:
    import zmq.auth

    if not path.is_file():
        raise InvalidArgument(f"no public key at {path}")
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"{path} is not a ZeroMQ certificate: {exc}") from None
    return public
