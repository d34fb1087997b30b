"""The ``zlink`` command line (typer): ``zlink run MODULE:ATTR`` starts an embedded node.

A user's mistake (a target that does not import or is not what the command needs, a port in
use, a value a setting refuses) ends the command with one ``Error: ...`` line on stderr and
exit status 1, as uvicorn does; its traceback is logged only with ``--log-level debug``.
Options of ``zlink run`` can also come from ``ZLINK_<OPTION>`` environment variables.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import http.client
import importlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pydantic
import typer
import zmq

from ..admin import AdminServer, parse_address
from ..app import App
from ..config import NodeConfig
from ..durations import check_seconds
from ..errors import Cancelled, InvalidArgument, ZLinkError
from ..mesh.stores import shown_url
from ..node import Node
from ..status import NodeStatus, OwnerStatus, losses

cli = typer.Typer(
    help="ZLink for Python: Spots and Actors, one turn at a time.",
    pretty_exceptions_show_locals=False,
)


class LogLevel(StrEnum):
    """``--log-level``: how much the node logs."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(StrEnum):
    """``--log-format``: lines for people, or one JSON object per line for log collectors."""

    TEXT = "text"
    JSON = "json"


class _JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _logging(level: LogLevel, fmt: LogFormat) -> None:
    handler = logging.StreamHandler()
    if fmt is LogFormat.JSON:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.value.upper(), handlers=[handler])
    if fmt is LogFormat.JSON:  # a Python warning (a call never given a terminal) as a record
        logging.captureWarnings(True)  # too: as two lines of plain text it broke a collector


_log = logging.getLogger("zlink.cli")


def _explain(exc: BaseException) -> str:
    """One line that says what went wrong, for a user's mistake."""
    if isinstance(exc, ZLinkError) and isinstance(exc.__cause__, pydantic.ValidationError):
        return f"invalid setting: {_explain(exc.__cause__)}"
    if isinstance(exc, pydantic.ValidationError):
        return "; ".join(_setting_error(err) for err in exc.errors())
    if isinstance(exc, ModuleNotFoundError):
        return f"cannot import {exc.name!r}: {exc}"
    if isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EADDRINUSE:
        return f"the address is in use: {exc}"
    if isinstance(exc, OSError) and exc.errno is not None and "in use" in str(exc).lower():
        return f"the address is in use: {exc}"
    return str(exc) or type(exc).__name__


def _setting_error(err: Any) -> str:
    """One error of a setting: its name (none for a check of several settings together) and
    what is wrong, without pydantic's "Value error, " (a docs probe found it noise)."""
    where = ".".join(str(part) for part in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Turn a user's mistake into one ``Error:`` line and exit status 1 (the traceback only
    at ``--log-level debug``)."""
    try:
        yield
    except (ZLinkError, ImportError, OSError, pydantic.ValidationError, zmq.ZMQError) as exc:
        _log.debug("the command failed", exc_info=exc)
        typer.echo(f"Error: {_explain(exc)}", err=True)
        raise typer.Exit(1) from None


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"zlink {__version__}")
        raise typer.Exit()


@cli.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True,
                     help="print the version and exit"),
    ] = False,
) -> None:  # fmt: skip
    """ZLink for Python: Spots and Actors, one turn at a time."""


def _app_dir() -> None:
    """Import from the working directory, as ``python -m`` would (uvicorn's ``--app-dir .``)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)


def load(target: str, factory: bool = False) -> Any:
    """Import ``MODULE:ATTR``; call it when ``factory`` is set (it must return an App)."""
    _app_dir()
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"expected MODULE:ATTR, got {target!r}")
    module = importlib.import_module(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    if not factory:
        return obj
    if isinstance(obj, App):
        raise InvalidArgument(f"{target} is a zlink.App, not a factory: leave out --factory")
    if isinstance(obj, type) or not callable(obj):
        raise InvalidArgument(f"{target} is not a factory (a function that returns a zlink.App)")
    made = obj()
    if not isinstance(made, App):
        raise InvalidArgument(
            f"the factory {target} returned {type(made).__name__}, not a zlink.App"
        )
    return made


# SIGHUP too (a closed terminal, a session that ended): without a handler it killed the node
# at once, with no goodbye and its lease left to lapse
_STOP_SIGNALS = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig
)


def _stop_signals() -> tuple[int, ...]:
    """The stop signals this process takes: a SIGHUP or SIGINT it was started ignoring
    (``nohup``; a shell's background job) stays ignored, as its launcher asked (the node of
    an operator's probe, started by ``nohup``, stopped at the hangup of a logout); SIGTERM,
    a supervisor's, always stops it."""
    return tuple(
        sig for sig in _STOP_SIGNALS
        if sig == signal.SIGTERM or signal.getsignal(sig) is not signal.SIG_IGN
    )  # fmt: skip


def _say(text: str, *, err: bool = False) -> None:
    """One line for the operator of ``zlink run``, written at once. A reader that left (a
    broken pipe: ``zlink run app | head -1``, a log shipper restarted) stops nothing: the
    stream is pointed at the null device and the node serves on ("Logs" in
    docs/guide/cli.md); before, the next line's ``BrokenPipeError`` stopped the node."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:  # started with that descriptor closed (``zlink run app >&-``)
        return
    try:
        stream.write(text + "\n")
        stream.flush()
    except BrokenPipeError:
        _reader_left(stream)
    except (OSError, ValueError):  # a full device (/dev/full), a stream closed in this
        pass  # process: nowhere to say it, and the node serves on


def _reader_left(stream: Any) -> None:
    """Point ``stream``'s descriptor at the null device: what it holds and what follows go
    nowhere, and the interpreter's flush at exit raises nothing."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


_SIGHUP = getattr(signal, "SIGHUP", None)


# A repeat of the first stop signal this soon after it is the same request, not an operator's
# second: GNU ``timeout`` (without ``--foreground``) signals the process and then its process
# group, so the node got SIGTERM twice at once and cut its own stop short (a docs probe: 4
# runs in 6). A person's second Ctrl-C comes later than this.
_REPEAT_WINDOW = 0.25


class _Stop(threading.Event):
    """``zlink run``'s stop, once a signal asked for it; ``insisted``: a SIGINT or SIGTERM
    asked (a SIGHUP is a hangup, not an operator insisting: ``_on_stop_signal``); ``first``:
    the first stop signal and when it came (``time.monotonic``)."""

    def __init__(self) -> None:
        super().__init__()
        self.insisted = False
        self.first: tuple[int, float] | None = None

    def note(self, signum: int) -> None:
        """A stop signal came: the first is remembered (``_REPEAT_WINDOW``)."""
        if self.first is None:
            self.first = (signum, time.monotonic())


def _exits_now(stop: _Stop, signum: int) -> bool:
    """Whether ``signum`` now is a second, insisting stop signal (``_on_stop_signal``): not a
    SIGHUP, and not the first signal again within ``_REPEAT_WINDOW`` (one supervisor's)."""
    if not (stop.is_set() and stop.insisted and signum != _SIGHUP):
        return False
    first = stop.first
    return first is None or first[0] != signum or time.monotonic() - first[1] >= _REPEAT_WINDOW


def _on_stop_signal(stop: _Stop, signum: int, _frame: object) -> None:
    """SIGINT/SIGTERM/SIGHUP under ``zlink run``: the first starts the graceful stop (drain, then
    shutdown); a SIGINT or SIGTERM after a SIGINT or SIGTERM exits at once, with 128 + the
    signal's number (130 for SIGINT), skipping what is left of the stop. A SIGHUP is nobody
    insisting: systemd's ``SendSIGHUP=yes`` sends it right after SIGTERM (and a closing
    terminal sends one), and pending together the two are handled SIGHUP first (signal
    numbers in order): a review found such a stop cut short at once, so a SIGHUP during a
    stop changes nothing, and a SIGTERM after a stop a SIGHUP began is not a second one. The
    first signal again within ``_REPEAT_WINDOW`` is the same request (GNU ``timeout``)."""
    if not _exits_now(stop, signum):
        stop.note(signum)
        stop.insisted = stop.insisted or signum != _SIGHUP
        stop.set()
        return
    with contextlib.suppress(OSError):  # os.write: print() may be mid-write on this thread
        os.write(2, f"signal {signum} again: exiting now, the stop unfinished\n".encode())
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a flush interrupted mid-write raises)
            stream.flush()
    os._exit(128 + signum)


@cli.command()
def run(
    target: Annotated[str, typer.Argument(help="MODULE:ATTR of a zlink.App or a main()")],
    factory: Annotated[
        bool, typer.Option(envvar="ZLINK_FACTORY", help="ATTR is a factory returning an App")
    ] = False,
    node_id: Annotated[str, typer.Option(envvar="ZLINK_NODE_ID", help="this node's id")] = "node-1",
    workers: Annotated[
        int | None, typer.Option(envvar="ZLINK_WORKERS", help="worker threads (default: cores)")
    ] = None,
    admin: Annotated[
        str | None,
        typer.Option(
            envvar="ZLINK_ADMIN", help="serve status on HOST:PORT (loopback; port 0 picks one)"
        ),
    ] = None,
    admin_allow_remote: Annotated[
        bool,
        typer.Option(envvar="ZLINK_ADMIN_ALLOW_REMOTE", help="allow a non-loopback admin address"),
    ] = False,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            envvar="ZLINK_LOG_FORMAT",
            case_sensitive=False,
            help="text, or json: one JSON object per line",
        ),
    ] = LogFormat.TEXT,
    log_level: Annotated[
        LogLevel,
        typer.Option(
            envvar="ZLINK_LOG_LEVEL",
            case_sensitive=False,
            help="how much to log (debug: tracebacks)",
        ),
    ] = LogLevel.INFO,
    listen: Annotated[
        str | None,
        typer.Option(
            envvar="ZLINK_LISTEN",
            help="tcp://HOST:PORT for peers and clients (port 0: any free one)",
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            envvar="ZLINK_ADVERTISE",
            help="the host peers and clients reach this node at (a host name or an"
            " IPv4 address), registered in place of --listen's host: for --listen tcp://0.0.0.0:P"
            " or a container's address",
        ),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            envvar="ZLINK_STORE",
            help='Location Store: "memory", "sqlite:///PATH" or "redis://HOST:PORT/DB"'
            " (shared by the mesh)",
        ),
    ] = None,
    mesh: Annotated[str, typer.Option(envvar="ZLINK_MESH", help="the mesh's name")] = "main",
    lease: Annotated[
        float | None,
        typer.Option(
            envvar="ZLINK_LEASE",
            help="node lease in the store, seconds (default 3): a node that cannot"
            " renew it stops serving; a dead node's Spots move after it",
        ),
    ] = None,
    store_retention: Annotated[
        float | None,
        typer.Option(
            envvar="ZLINK_STORE_RETENTION",
            help="seconds after a dead node's lease lapsed that the rows it left in the store"
            " go (default a week; at least 60)",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            envvar="ZLINK_INSECURE",
            help="allow a non-loopback --listen or --advertise without CURVE keys (logged)",
        ),
    ] = False,
    keys: Annotated[
        str | None,
        typer.Option(
            envvar="ZLINK_KEYS", help="keys folder (zlink keys generate): CURVE on the mesh"
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            envvar="ZLINK_NODES",
            min=1,
            max=64,
            help="start this many node processes here, stopped together",
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            envvar="ZLINK_DRAIN",
            help="at SIGINT/SIGTERM move Spots to other nodes before stopping",
        ),
    ] = True,
    drain_timeout: Annotated[
        float | None,
        typer.Option(
            envvar="ZLINK_DRAIN_TIMEOUT",
            help="seconds the drain may take at most (default: the request timeout, 30);"
            " a move not done by then is withdrawn and its Spot stays",
        ),
    ] = None,
    shutdown_timeout: Annotated[
        float | None,
        typer.Option(
            envvar="ZLINK_SHUTDOWN_TIMEOUT",
            help="seconds the stop may take at most, after the drain (default 10): running"
            " turns get that long, then they are abandoned; keep it within your supervisor's"
            " grace period",
        ),
    ] = None,
    stop_with_stdin: Annotated[
        bool, typer.Option(hidden=True, help="stop when stdin closes (--nodes children)")
    ] = False,
    summary_file: Annotated[
        str | None,
        typer.Option(hidden=True, help="write the stop summary here as JSON (--nodes children)"),
    ] = None,
    ready_file: Annotated[
        str | None,
        typer.Option(hidden=True, help="made once the node serves (--nodes children)"),
    ] = None,
) -> None:
    """Start a node for an App and serve until SIGINT/SIGTERM (drain, then shutdown; a second
    signal exits at once, with 130 for SIGINT); a callable ATTR is just run.

    With --listen the node joins a mesh of processes through the Location Store (--store,
    python-api §10); with --nodes K, K node processes start on this machine (ports from
    --listen's on, or free ones; the store a SQLite file in a fresh temporary folder unless
    --store says), and SIGINT/SIGTERM stops them all."""
    _logging(log_level, log_format)
    with _user_errors():
        obj = load(target, factory)
        if not isinstance(obj, App):  # a main(): it makes its own node(s), if any
            given = {"--listen": listen, "--store": store, "--keys": keys, "--lease": lease,
                     "--store-retention": store_retention,
                     "--advertise": advertise, "--nodes": nodes, "--workers": workers,
                     "--insecure": insecure or None,
                     "--drain-timeout": drain_timeout,
                     "--shutdown-timeout": shutdown_timeout}  # fmt: skip
            for option, value in given.items():
                if value is not None:
                    raise InvalidArgument(
                        f"{option} configures a node zlink run makes for a zlink.App target;"
                        f" {target} is a function, which makes its own"
                    )
            _run_callable(target, obj, admin)
            return
        if drain_timeout is not None:  # (told now, not when the stop comes)
            if nodes is not None or not drain:
                raise InvalidArgument(
                    "--drain-timeout bounds a drain: with --nodes the nodes stop together"
                    " and none drains, nor does one with --no-drain"
                )
            check_seconds(drain_timeout, "--drain-timeout")
        if shutdown_timeout is not None:
            check_seconds(shutdown_timeout, "--shutdown-timeout")
    if nodes is not None:
        with _user_errors():  # a bad --admin or --store: one line
            admin_port = None if admin is None else parse_address(admin)[1]
            if store == "memory":  # each process its own: K meshes of one node, each making
                raise InvalidArgument(  # the same ids (a probe's split brain)
                    '--nodes K needs a store its processes share: "memory" is a store of one '
                    "process; give sqlite:///PATH or redis://HOST:PORT/DB, or no --store (a "
                    "SQLite file made for this run)"
                )
        if admin is not None and admin_port != 0:
            _say(f"--admin {admin} is not served: {nodes} nodes cannot share one port"
                       " (port 0 gives each node one of its own)", err=True)  # fmt: skip
            admin = None
        sys.exit(_run_many(target, factory, node_id, nodes, workers, listen, store, mesh,
                           insecure, keys, log_level.value, lease, log_format.value, admin,
                           admin_allow_remote, advertise, store_retention,
                           shutdown_timeout))  # fmt: skip
    with _user_errors():
        config = NodeConfig(
            node_id=node_id, workers=workers, listen=listen, advertise=advertise, mesh=mesh,
            insecure=insecure,
            keys=keys, **({} if store is None else {"store": store}),
            **({} if lease is None else {"lease_seconds": lease}),
            **({} if store_retention is None else {"store_retention": store_retention}),
            **({} if shutdown_timeout is None else {"shutdown_timeout": shutdown_timeout}),
        )  # fmt: skip
    stop = _Stop()
    # one of ``zlink run --nodes``' processes: its lines share the terminal with the others',
    # so each stop line says whose it is (a probe could not tell them apart)
    whose = "" if ready_file is None else f" (node {config.node_id})"
    with _SignalWaker() as waker:
        for sig in _stop_signals():
            signal.signal(sig, functools.partial(_on_stop_signal, stop))
        server = None
        with _user_errors():  # a port in use, a store that will not open: one line
            where = None if admin is None else parse_address(admin)  # (before the node starts)
            node = Node(obj, config)
            try:  # the admin address is bound (or found taken) before the node registers:
                if where is not None:  # a start refused for it changes nothing (before, it
                    host, port = where  # registered the id first, and a running node of
                    server = AdminServer(node, host, port,  # that id fenced itself)
                                         allow_remote=admin_allow_remote)  # fmt: skip
                if not _started(node, stop, waker):
                    if server is not None:
                        server.stop()
                    return
            except BaseException:
                if server is not None:
                    server.stop()
                node.shutdown(5.0)
                raise
            if server is not None:
                server.start()
        with node:
            if server is not None:
                bound = server.address
                _say(f"admin on http://{bound[0]}:{bound[1]} (node {node.node_id})")
            if listen is not None:
                _say(f"node {node.node_id} listening on {node.address} ({shown_url(config.store)})")
            if stop_with_stdin:  # its parent (zlink run --nodes) holds the other end
                _stop_at_eof(stop, waker)
            _stop_when_superseded(node, stop, waker)
            _say(f"{node!r} serving {obj.describe()}; SIGINT or SIGTERM stops it")
            if ready_file is not None:  # its parent (zlink run --nodes) waits for it
                with contextlib.suppress(OSError):
                    Path(ready_file).touch()
            waker.wait(stop)

            summary: dict[str, int] = {"moved": 0, "stayed": 0}

            def graceful() -> None:
                if drain:  # Spots that can move go to the other nodes first
                    drained = node.drain(drain_timeout)
                    summary["moved"], summary["stayed"] = len(drained.moved), len(drained.stayed)
                    _say(
                        f"drained: {len(drained.moved)} Spots moved, {len(drained.stayed)} stayed"
                        f"{_why_stayed(drained.stayed)}{whose}"
                    )
                else:  # --no-drain: none moves, so every Spot the node holds stays (and closes)
                    summary["stayed"] = node.status().spots
                _say(
                    "stopping: refusing new work, finishing running turns "
                    f"(SIGINT or SIGTERM again exits at once){whose}"
                )
                node.shutdown()  # (/health says 503 and /metrics answers until it ends)
                if server is not None:
                    server.stop()

            # on a thread of its own: this (main) thread stays free for a second signal
            waker.run(graceful, "zlink-graceful-stop")
    lost = _stop_losses(node.counters())
    if summary_file is not None:  # its parent (zlink run --nodes) adds them up; one it
        with contextlib.suppress(OSError):  # cannot read says "said nothing"
            Path(summary_file).write_text(json.dumps({**summary, "losses": lost}))
    said = _stop_summary(summary["moved"], summary["stayed"], lost)
    if lost:  # (also where a log, not the terminal, is read)
        _log.warning("node %s stopped: %s", node.node_id, said)
    _say(f"stopped: {said}{whose}")
    if node.superseded.is_set():  # one line, and a status a supervisor sees
        _say(f"Error: {node.not_serving()}", err=True)
        raise typer.Exit(1)


def _started(node: Node, stop: threading.Event, waker: _SignalWaker) -> bool:
    """(Main thread.) Start ``node`` on a thread of its own while this one waits for it or
    for a stop signal: ``False`` if one came first (said at once; the start gave up and
    stopped what began, within the node's shutdown time). Before, a signal during a start
    that waited on an Entry Spot was acted on only once the start gave up (30 s), then the
    stop: ~36 s, past a supervisor's grace period, with nothing said."""
    done, failed = waker.spawn(node.start, "zlink-start")
    waker.wait_any(done, stop)
    if not done.is_set():  # a stop signal came first: the start gives up, then stops
        _say("stopping while the node starts (SIGINT or SIGTERM again exits at once)")
        node.abandon_start()  # (no effect once it is past its Entry Spots: it then started,
        waker.wait(done)  # and stops as any node does, the signal seen)
    if failed:
        if isinstance(failed[0], Cancelled) and stop.is_set():
            _say("stopped before the node finished starting")
            return False
        raise failed[0]
    return True


def _why_stayed(stayed: Mapping[str, str], most: int = 3) -> str:
    """Why a drain's Spots stayed, the commonest reasons first, with how many each (an
    operator saw only "21 stayed": here, Spots registered without a relocation policy)."""
    if not stayed:
        return ""
    ranked = sorted(Counter(stayed.values()).items(), key=lambda item: (-item[1], item[0]))
    said = "; ".join(f"{n}: {why}" for why, n in ranked[:most])
    return f" ({said}{'; ...' if len(ranked) > most else ''})"


def _how_it_ended(returncode: int | None) -> str:
    """A child's end, as a person reads it: its exit status, or the signal that ended it
    (with the status a shell gives for it)."""
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-returncode).name
            return f"was ended by {name} (status {_status(returncode)})"
        return f"was ended by signal {-returncode} (status {_status(returncode)})"
    return f"exited with status {_status(returncode or 0)}"


def _stop_losses(counters: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """``losses(counters)``, and the handlers the stop cut off at its deadline (``abandoned``:
    their callers were failed; an operator's probe saw them counted, and the summary say "0
    messages discarded" only)."""
    lost = losses(counters)
    abandoned = {
        what: n
        for what, name in (("turns", "turns_abandoned_at_shutdown"),
                           ("worker calls", "worker_calls_abandoned_at_shutdown"))
        if (n := counters.get(name, 0))
    }  # fmt: skip
    if abandoned:
        lost["abandoned"] = abandoned
    return lost


def _stop_summary(moved: int, stayed: int, lost: Mapping[str, Mapping[str, int]]) -> str:
    """What a stop did: Spots moved and stayed, and what it lost by kind and reason
    (``zlink.runtime.metrics.losses``): messages discarded (always said), sends dropped,
    frames never acknowledged and handlers cut off at the stop's deadline (said when there
    are any)."""
    said = [f"{moved} Spots moved, {stayed} stayed"]
    for kind, what in (
        ("discarded", "messages discarded"),
        ("dropped", "sends dropped"),
        ("unacknowledged", "sent and never acknowledged"),
        ("abandoned", "abandoned at the stop's deadline"),
    ):
        by_reason = lost.get(kind, {})
        if not by_reason and kind != "discarded":
            continue
        total = sum(by_reason.values())
        if kind == "unacknowledged":
            said.append(f"{total} {what} (may have arrived)")
            continue
        if kind == "abandoned":  # (turns and worker calls: not one kind of thing to add up)
            said.append(", ".join(f"{n} {k}" for k, n in sorted(by_reason.items())) + f" {what}")
            continue
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(by_reason.items()))
        said.append(f"{total} {what}{f' ({reasons})' if reasons else ''}")
    return "; ".join(said)


def _run_callable(target: str, obj: Any, admin: str | None) -> None:
    """``zlink run MODULE:ATTR`` of a ``main()``: run it, refusing what is not one."""
    if isinstance(obj, type):
        raise InvalidArgument(
            f"{target} is a class ({obj.__name__}), not a zlink.App or a main() function"
        )
    if not callable(obj):
        raise InvalidArgument(f"{target} is neither a zlink.App nor callable")
    if admin is not None:
        raise InvalidArgument(
            "--admin serves a node's status: it needs a zlink.App target, not a function"
        )
    if _returns_app(obj):  # known before it runs: refused without running it
        raise InvalidArgument(f"{target} returns a zlink.App: it is a factory; add --factory")
    try:
        with _stopped_as_by_ctrl_c():
            made = obj()
    except _StopSignal as stopped:  # it ended as at Ctrl-C, its nodes stopped on the way
        raise typer.Exit(128 + stopped.signum) from None
    if isinstance(made, App):
        raise InvalidArgument(f"{target} returned a zlink.App: it is a factory; add --factory")


class _StopSignal(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) in a ``main()`` target, raised as Ctrl-C raises KeyboardInterrupt,
    so its ``with zlink.Node(...)`` blocks and ``finally`` clauses stop its nodes on the way
    out (a supervisor's SIGTERM killed the process outright before: no goodbye, no leaving
    the store, queued work lost uncounted)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _stopped_as_by_ctrl_c() -> Iterator[None]:
    """While a ``main()`` runs: SIGTERM and SIGHUP (unless ignored) raise ``_StopSignal``."""

    stop = _Stop()

    def raise_it(signum: int, _frame: object) -> None:
        first = not stop.is_set()
        stop.note(signum)
        if first or _exits_now(stop, signum):  # (as in ``_on_stop_signal``: a hangup, or
            stop.insisted = signum != _SIGHUP  # the first SIGTERM after one, does not cut
            stop.set()  # the stop short)
            raise _StopSignal(signum)
        stop.insisted = stop.insisted or signum != _SIGHUP

    taken = [sig for sig in _stop_signals() if sig != signal.SIGINT]  # (Ctrl-C is Python's)
    before = {sig: signal.signal(sig, raise_it) for sig in taken}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _returns_app(fn: Any) -> bool:
    """Whether ``fn``'s return annotation says it makes a ``zlink.App`` (a factory), read
    without calling it; an annotation that does not resolve says nothing."""
    import typing

    try:
        hint = typing.get_type_hints(fn).get("return")
    except Exception:  # noqa: BLE001 - a hint naming what is not importable here: unknown
        return False
    return isinstance(hint, type) and issubclass(hint, App)


def _run_many(
    target: str, factory: bool, node_id: str, count: int, workers: int | None,
    listen: str | None, store: str | None, mesh: str, insecure: bool, keys: str | None,
    log_level: str, lease: float | None = None, log_format: str = "text",
    admin: str | None = None, admin_allow_remote: bool = False, advertise: str | None = None,
    store_retention: float | None = None, shutdown_timeout: float | None = None,
) -> int:  # fmt: skip
    """``zlink run --nodes K``: K node processes of one mesh on this machine; the first
    SIGINT/SIGTERM stops them all (each without a drain: they stop together), a second kills
    them. Returns the worst exit status."""
    import subprocess
    import tempfile

    folder: str | None = None  # a store made here, for this run only: removed at its end
    if store is None:
        folder = tempfile.mkdtemp(prefix="zlink-mesh-")
        store = f"sqlite:///{folder}/mesh.db"
        _say(f"Location Store: {store}")
    summaries = Path(tempfile.mkdtemp(prefix="zlink-nodes-"))  # each child's stop summary
    base = listen or "tcp://127.0.0.1:0"
    host, _, port = base.rpartition(":")
    child_env = _child_env(os.environ, store)
    procs: list[subprocess.Popen[bytes]] = []
    failed_start: int | None = None  # the run's status when the nodes did not all serve
    stop = _Stop()

    def on_signal(signum: int, frame: object) -> None:
        if _exits_now(stop, signum):  # a second one: kill them, then exit at once; the exit skips
            for proc in procs:  # the stop's own clean-up, so the folders made here go now
                with contextlib.suppress(OSError):
                    proc.kill()
            for made in (summaries, folder):
                if made is not None:
                    shutil.rmtree(made, ignore_errors=True)
        _on_stop_signal(stop, signum, frame)

    with _SignalWaker() as waker:
        for sig in _stop_signals():
            signal.signal(sig, on_signal)
        try:
            for i in range(1, count + 1):
                address = base if port in ("0", "*") else f"{host}:{int(port) + i - 1}"
                args = _child_args(target, factory, f"{node_id}-{i}", address, store, mesh,
                                   insecure, keys, workers, lease, log_level, log_format, admin,
                                   admin_allow_remote, advertise, store_retention,
                                   shutdown_timeout)  # fmt: skip
                args += ["--summary-file", str(summaries / f"{i}.json"),
                         "--ready-file", str(summaries / f"{i}.ready")]  # fmt: skip
                # its stdin is a pipe from here: if this process dies, even by SIGKILL, the
                # pipe closes and the node stops (no node outlives its parent)
                procs.append(subprocess.Popen(args, start_new_session=True, env=child_env,
                                              stdin=subprocess.PIPE))  # fmt: skip
            start = _until_serving(procs, summaries, stop, f"{node_id}-")
            if start.error is not None:  # (its status is the run's, not the others' stop)
                failed_start = start.status
                _say(f"Error: {start.error}; stopping the others", err=True)
                stop.set()
            elif start.serving:  # (not when a signal came first: they are stopping)
                _say(f"{count} node processes serving; SIGINT or SIGTERM stops them all")

            def watch() -> None:  # one that ends by itself stops the rest
                while not stop.is_set() and all(p.poll() is None for p in procs):
                    stop.wait(0.2)
                for i, proc in enumerate(procs, 1):
                    if not stop.is_set() and proc.returncode is not None:  # it ended first
                        _say(f"node {node_id}-{i} (pid {proc.pid}) "
                                   f"{_how_it_ended(proc.returncode)}; stopping the others",
                                   err=True)  # fmt: skip
                stop.set()
                waker.wake()

            threading.Thread(target=watch, name="zlink-nodes-watch", daemon=True).start()
            waker.wait(stop)
        finally:
            stopped_here: set[int] = set()  # children this run sent its SIGTERM
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    stopped_here.add(proc.pid)
            patience = 20.0 + (10.0 if shutdown_timeout is None else shutdown_timeout)
            for proc in procs:  # (each stops within its shutdown time, all at once)
                try:
                    proc.wait(patience)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
                if proc.stdin is not None:
                    proc.stdin.close()
            names = [f"{node_id}-{i}" for i in range(1, len(procs) + 1)]
            summed = _summed(summaries, names)  # (all stopped: what they wrote is all)
            shutil.rmtree(summaries, ignore_errors=True)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    _say(f"all nodes stopped: {summed}")
    if failed_start is not None:  # the nodes did not all serve: the others were stopped
        return failed_start
    # a child a signal ended: 128 + its number, as a shell says (137 for SIGKILL); but one
    # that this run's own SIGTERM ended before it could handle it (still starting) stopped as
    # asked
    return max(
        (
            0 if p.returncode == -signal.SIGTERM and p.pid in stopped_here
            else _status(p.returncode or 0)
            for p in procs
        ),
        default=0,
    )  # fmt: skip


_SERVING_WITHIN = 120.0  # seconds for every --nodes child to serve (a store, a first lease)


@dataclass(frozen=True)
class _Start:
    """How the start of ``--nodes`` children went (``_until_serving``)."""

    serving: bool  # every child serves
    error: str | None = None  # what went wrong, naming the children (None: nothing did)
    status: int = 0  # the run's exit status when ``error``


def _until_serving(procs: list[Any], folder: Path, stop: threading.Event, prefix: str) -> _Start:
    """Wait until every ``--nodes`` child serves (its ready file exists), one ends first
    (served or not: the run is then not whole), a signal stops the run, or
    ``_SERVING_WITHIN`` passes (status 1)."""
    deadline = time.monotonic() + _SERVING_WITHIN
    pending = set(range(1, len(procs) + 1))
    while not stop.is_set():
        pending = {i for i in pending if not (folder / f"{i}.ready").exists()}
        ended = [i for i in range(1, len(procs) + 1) if procs[i - 1].poll() is not None]
        if ended:
            first = _status(procs[ended[0] - 1].returncode)
            return _Start(
                False,
                ", ".join(
                    f"node {prefix}{i} {_how_it_ended(procs[i - 1].returncode)} "
                    + ("before it served" if i in pending else "as the others started")
                    for i in ended
                ),
                first or 1,
            )  # (ending before all serve is a failure, even with status 0)
        if not pending:
            return _Start(True)
        if time.monotonic() > deadline:
            names = ", ".join(f"{prefix}{i}" for i in sorted(pending))
            return _Start(False, f"{names} did not serve within {_SERVING_WITHIN:g} s", 1)
        stop.wait(0.05)
    return _Start(False)


def _status(returncode: int) -> int:
    """A child's exit status as a shell reports it: a signal's is 128 + its number."""
    return 128 - returncode if returncode < 0 else returncode


def _summed(folder: Path, names: list[str]) -> str:
    """The stop summaries the ``--nodes`` children (``names``, in order) wrote into
    ``folder``, added up; a child that wrote none (killed, or failed) is named."""
    count = len(names)
    moved = stayed = reported = 0
    lost: dict[str, dict[str, int]] = {}
    silent = set(names)
    for path in sorted(folder.glob("*.json")):
        with contextlib.suppress(ValueError, IndexError):
            silent.discard(names[int(path.stem) - 1])
        try:
            one = json.loads(path.read_text())
            counts = (int(one["moved"]), int(one["stayed"]))
            theirs = {
                str(kind): {str(k): int(n) for k, n in dict(by_reason).items()}
                for kind, by_reason in dict(one["losses"]).items()
            }
        except (OSError, ValueError, TypeError, KeyError):  # a child's file cut short
            continue
        finally:
            path.unlink(missing_ok=True)
        moved, stayed, reported = moved + counts[0], stayed + counts[1], reported + 1
        for kind, by_reason in theirs.items():
            ours = lost.setdefault(kind, {})
            for reason, n in by_reason.items():
                ours[reason] = ours.get(reason, 0) + n
    missing = (
        ""
        if reported == count
        else f" ({count - reported} of {count} nodes said nothing: "
        f"{', '.join(n for n in names if n in silent) or 'their summaries were cut short'})"
    )
    return _stop_summary(moved, stayed, lost) + missing


def _child_args(
    target: str, factory: bool, node_id: str, address: str, store: str, mesh: str,
    insecure: bool, keys: str | None, workers: int | None, lease: float | None,
    log_level: str, log_format: str, admin: str | None, admin_allow_remote: bool,
    advertise: str | None = None, store_retention: float | None = None,
    shutdown_timeout: float | None = None,
) -> list[str]:  # fmt: skip
    """The command line of one ``--nodes`` child: every setting the parent was given that a
    node needs, explicitly (its environment is the parent's, less ``_child_env``'s drops),
    but the store's URL, which may hold a password every user could read in ``ps``: that
    goes in the child's environment (``_child_env``). ``admin`` is passed on only as port 0
    (each child picks a port of its own)."""
    del store  # (in the environment: ``_child_env``)
    args = [sys.executable, "-m", "zlink", "run", target, "--node-id", node_id,
            "--listen", address, "--mesh", mesh, "--no-drain",
            "--log-level", log_level, "--log-format", log_format,
            "--stop-with-stdin"]  # fmt: skip
    # a flag both ways: a ZLINK_FACTORY / ZLINK_INSECURE the parent was told to override
    # (--no-factory) is still in the child's environment
    args += ["--factory"] if factory else ["--no-factory"]
    args += ["--insecure"] if insecure else ["--no-insecure"]
    args += [] if keys is None else ["--keys", keys]
    args += [] if workers is None else ["--workers", str(workers)]
    args += [] if lease is None else ["--lease", repr(lease)]
    args += [] if store_retention is None else ["--store-retention", repr(store_retention)]
    args += [] if shutdown_timeout is None else ["--shutdown-timeout", repr(shutdown_timeout)]
    args += [] if advertise is None else ["--advertise", advertise]
    if admin is not None and parse_address(admin)[1] == 0:
        args += ["--admin", admin] + (["--admin-allow-remote"] if admin_allow_remote else [])
    return args


_NOT_INHERITED = ("ZLINK_NODES", "ZLINK_ADMIN")


def _child_env(environ: Mapping[str, str], store: str | None = None) -> dict[str, str]:
    """The environment of a ``--nodes`` child: the parent's, without ``ZLINK_NODES`` (each
    child would start K more nodes) and ``ZLINK_ADMIN`` (K nodes cannot share a fixed port;
    the parent passes ``--admin`` on itself when it names port 0), with ``ZLINK_STORE`` the
    run's store (not on its command line: it may hold a password)."""
    child = {k: v for k, v in environ.items() if k not in _NOT_INHERITED}
    if store is not None:
        child["ZLINK_STORE"] = store
    return child


keys_cli = typer.Typer(add_completion=False, help="CURVE keys of a mesh (python-api §10).")
cli.add_typer(keys_cli, name="keys")


@keys_cli.command("generate")
def keys_generate(
    folder: Annotated[str, typer.Argument(help="where to write them (made if missing)")],
    client: Annotated[
        list[str] | None, typer.Option(help="a client key pair to make (repeatable)")
    ] = None,
) -> None:
    """Write the mesh's key pair (every node uses it) and client key pairs (default: one,
    "client"); give the folder to nodes (--keys) and clients (zlink.connect(keys=...))."""
    from ..mesh.keys import generate

    with _user_errors():
        paths = generate(folder, client)
    for path in paths:
        typer.echo(str(path))


@keys_cli.command("add-client")
def keys_add_client(
    folder: Annotated[str, typer.Argument(help="a keys folder (zlink keys generate)")],
    names: Annotated[list[str], typer.Argument(help="client names, one key pair each")],
) -> None:
    """Add client key pairs to a keys folder, keeping its mesh key. Nodes read client keys
    when they start: restart them to let the new clients in."""
    from ..mesh.keys import add_clients

    with _user_errors():
        paths = add_clients(folder, names)
    for path in paths:
        typer.echo(str(path))


@cli.command("mesh")
def mesh_cmd(
    store: Annotated[
        str, typer.Option(help='the Location Store: "sqlite:///PATH" or "redis://HOST:PORT/DB"')
    ],
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List the nodes the Location Store knows: id, address, incarnation, lease left, and how
    many Spots and Actors each owns (python-api §10); also a node whose lease lapsed that
    still owns some (they are re-homed on their next call)."""

    from rich.console import Console
    from rich.table import Table

    from ..mesh.stores import open_store
    from ..mesh.zmq_transport import MeshEndpoint

    with _user_errors():
        opened = open_store(store, existing=True)  # (looking must not make one)
    try:
        records = opened.nodes()
        owned = opened.owned()
        now = opened.now()  # leases are on the store's clock (a Redis server's: not ours)
    finally:
        close = getattr(opened, "close", None)
        if close is not None:
            close()
    rows = []
    for r in records:
        try:
            address = MeshEndpoint.parse(r.endpoint).client
        except InvalidArgument:
            address = r.endpoint
        rows.append({"node_id": r.node_id, "address": address, "incarnation": r.incarnation,
                     "lease_left": round(r.lease_until - now, 1),
                     "owned": owned.get((r.node_id, r.incarnation), 0),
                     "state": "live"})  # fmt: skip
    live = {(r.node_id, r.incarnation) for r in records}
    # what an incarnation whose lease lapsed owns (a node that died, or was restarted with
    # its id: the new one owns none of it) is re-homed on its next call
    for owner, incarnation in sorted(set(owned) - live):
        rows.append({"node_id": owner, "address": "", "incarnation": incarnation,
                     "lease_left": None, "owned": owned[owner, incarnation],
                     "state": "lease lapsed"})  # fmt: skip
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"mesh in {shown_url(store)}")
    for column in ("node", "address", "incarnation", "lease left (s)", "owns", "state"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row.values()))
    Console().print(table)


def _stop_when_superseded(node: Node, stop: threading.Event, waker: _SignalWaker) -> None:
    """Set ``stop`` (and wake the main thread) if another process takes this node's id: a
    second ``zlink run --node-id`` on the same store; the older one stops, and exits 1."""

    def watch() -> None:
        node.superseded.wait()
        stop.set()
        waker.wake()

    threading.Thread(target=watch, name="zlink-superseded-watch", daemon=True).start()


def _stop_at_eof(stop: threading.Event, waker: _SignalWaker) -> None:
    """Set ``stop`` (and wake the main thread) once stdin reaches its end."""

    def watch() -> None:
        # os.read, not sys.stdin: a daemon thread blocked inside a buffered reader holds its
        # lock, and the interpreter's exit then aborts ("could not acquire lock for stdin")
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        stop.set()
        waker.wake()

    threading.Thread(target=watch, name="zlink-stdin-watch", daemon=True).start()


class _SignalWaker:
    """Lets the main thread wait so that a signal's Python handler runs at once.

    CPython runs handlers on the main thread only, and a signal the OS hands to another
    thread does not interrupt a lock wait of the main thread: the handler then runs only
    when that wait ends (seen on the free-threaded build: a SIGINT noticed only when a 9 s
    wait ran out, or never while ``Event.wait()`` had no timeout). With
    ``signal.set_wakeup_fd`` every signal writes a byte the main thread's ``select`` sees;
    its handler runs as soon as ``select`` returns.
    """

    def __enter__(self) -> _SignalWaker:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._old = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._old)
        self._read.close()
        self._write.close()

    def wake(self) -> None:
        """(Any thread.) Make ``wait`` look at its event again."""
        with contextlib.suppress(OSError):  # full: a wake-up is on its way already
            self._write.send(b"\0")

    def wait(self, event: threading.Event) -> None:
        """(Main thread.) Block until ``event`` is set, by a signal handler or by a thread
        that then calls ``wake``; signal handlers run meanwhile, at once."""
        self.wait_any(event)

    def wait_any(self, *events: threading.Event) -> None:
        """(Main thread.) ``wait`` until any of ``events`` is set."""
        while not any(event.is_set() for event in events):
            select.select([self._read], [], [])
            with contextlib.suppress(OSError):
                self._read.recv(4096)

    def run(self, fn: Callable[[], object], name: str) -> None:
        """(Main thread.) Run ``fn`` on a daemon thread and wait for it as ``wait`` does;
        what it raises is raised here."""
        done, failed = self.spawn(fn, name)
        self.wait(done)
        if failed:
            raise failed[0]

    def spawn(
        self, fn: Callable[[], object], name: str
    ) -> tuple[threading.Event, list[BaseException]]:
        """Run ``fn`` on a daemon thread; an event set (and this waker woken) once it ended,
        and what it raised, if anything."""
        done = threading.Event()
        failed: list[BaseException] = []

        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                failed.append(exc)
            finally:
                done.set()
                self.wake()

        threading.Thread(target=body, name=name, daemon=True).start()
        return done, failed


def _fetch(admin: str) -> NodeStatus:
    """The status of the node whose admin endpoint is ``admin``; a mistake (a malformed
    address, nobody there, something else answering) is one ``BadParameter`` line."""
    try:
        host, port = parse_address(admin)
    except ZLinkError as exc:
        raise typer.BadParameter(str(exc)) from exc
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/status"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = reply.read()
    except OSError as exc:
        raise typer.BadParameter(f"no node answers at {admin}: {exc}") from exc
    except http.client.HTTPException as exc:  # (a wrong port: SSH, Redis; a node that died
        raise typer.BadParameter(  # mid-answer: it gave a traceback, found by an audit)
            f"what answers at {admin} is not a zlink node's admin endpoint: {exc!r}"
        ) from exc
    try:
        return NodeStatus.model_validate_json(body)
    except pydantic.ValidationError as exc:
        raise typer.BadParameter(
            f"what answers at {admin} is not a zlink node's status "
            f"({exc.error_count()} fields do not fit)"
        ) from exc


_VIEWS: dict[str, tuple[list[str], Callable[[OwnerStatus], bool]]] = {
    "queues": (
        [
            "owner",
            "kind",
            "app items",
            "app bytes",
            "lifecycle",
            "gate",
            "running",
            "oldest",
            "waiting",
            "refused",
        ],
        lambda o: True,
    ),
    "spots": (["owner", "type", "state", "app items", "timers"], lambda o: o.kind == "spot"),
    "timers": (
        ["owner", "kind", "timer", "interval", "next due in", "sequence", "late ticks", "queued"],
        lambda o: bool(o.timers),
    ),
}


def _row(view: str, o: OwnerStatus) -> list[str]:
    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    if view == "queues":
        gate = "busy" if o.gate_busy else "idle"
        return [o.owner, o.kind, str(o.app_items), f"{o.app_bytes:,}", str(o.lifecycle_items),
                gate, secs(o.running_turn_age), secs(o.oldest_item_age), str(o.waiters),
                str(o.refused)]  # fmt: skip
    if view == "spots":
        return [o.owner, o.type, o.state, str(o.app_items), str(len(o.timers))]
    return [o.owner, o.kind, ", ".join(o.timers)]  # (timers: a row per timer, in ``inspect``)


def _upto(seconds: float | None) -> str:
    """A latency bucket's upper bound, as ``<= 250 us``."""
    if seconds is None:
        return "-"
    if seconds < 0.001:
        return f"<= {seconds * 1e6:g} us"
    return f"<= {seconds * 1e3:g} ms" if seconds < 1 else f"<= {seconds:g} s"


@cli.command()
def inspect(
    view: Annotated[str, typer.Argument(help="queues, spots, timers or types")],
    admin: Annotated[str, typer.Option(help="the node's admin HOST:PORT")] = "127.0.0.1:8765",
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Show a running node's owners: lane depths, bytes, gate state, oldest item age, timers;
    or per Spot / Actor type (``types``): messages handled, refused, and handler latency."""
    from rich.console import Console
    from rich.table import Table

    if view not in _VIEWS and view != "types":
        raise typer.BadParameter(f"choose queues, spots, timers or types, not {view!r}")
    status = _fetch(admin)
    if view == "types":
        if json_out:
            typer.echo(json.dumps([ty.model_dump() for ty in status.types], indent=2))
            return
        table = Table(
            title=f"types on {status.node_id}",
            caption=f"handler latency: one message in {status.latency_sample_every} per "
            "object timed",
        )
        for column in ("type", "kind", "live", "handled", "refused", "waited", "p50", "p99"):
            table.add_column(column, no_wrap=column == "type", overflow="fold")
        for ty in status.types:
            counts = (f"{n:,}" for n in (ty.handled, ty.refused, ty.waited))
            table.add_row(ty.type, ty.kind, str(ty.live), *counts, _upto(ty.latency_p50),
                          _upto(ty.latency_p99))  # fmt: skip
        Console().print(table)
        return
    columns, keep = _VIEWS[view]
    owners = [o for o in status.owners if keep(o)]
    if json_out:
        typer.echo(json.dumps([o.model_dump() for o in owners], indent=2))
        return
    table = Table(title=f"{view} on {status.node_id}")
    for column in columns:  # a narrow terminal folds a value, never cuts it ("1132…")
        table.add_column(column, overflow="fold")
    for o in owners:
        if view == "timers":  # a row per timer
            for t in o.timer_details:
                table.add_row(o.owner, o.kind, t.name, f"{t.interval:g} s",
                              f"{t.next_due_in:+.3f} s", str(t.sequence), str(t.late_ticks),
                              str(t.queued))  # fmt: skip
            continue
        table.add_row(*_row(view, o))
    Console().print(table)


@cli.command()
def status(
    admin: Annotated[str, typer.Option(help="the node's admin HOST:PORT")] = "127.0.0.1:8765",
    watch: Annotated[bool, typer.Option(help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")] = 1.0,
    count: Annotated[int | None, typer.Option(help="stop after this many refreshes")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
) -> None:
    """Show a node's workers, backlog and counters; --watch refreshes it."""
    try:  # (an interval it cannot wait, inf say, failed in the wait: OverflowError)
        check_seconds(interval, "--interval")
    except InvalidArgument as exc:
        raise typer.BadParameter(str(exc), param_hint="--interval") from exc
    if json_out:
        typer.echo(_fetch(admin).model_dump_json(indent=2))
        return
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    def render() -> Table:
        s = _fetch(admin)
        table = Table(title=f"node {s.node_id} ({s.mesh})", show_header=False)
        table.add_row("workers busy", f"{s.workers_busy} / {s.workers}")
        table.add_row("spots / actors", f"{s.spots} / {s.actors}")
        table.add_row("infrastructure backlog", str(s.infrastructure_backlog))
        table.add_row("infrastructure deadlines", str(s.infrastructure_deadlines))
        table.add_row("infrastructure thread", "alive" if s.infrastructure_alive else "DEAD")
        table.add_row("worker calls in flight", str(s.worker_calls_in_flight))
        if s.address is not None:
            table.add_row("address", s.address)
            table.add_row("incarnation", f"{s.incarnation}{' (FENCED)' if s.fenced else ''}")
            table.add_row("peers", ", ".join(s.peers) or "none")
            table.add_row("peers paused (DATA)", ", ".join(s.paused_peers) or "none")
        for key, value in sorted(s.counters.items()):
            table.add_row(key, str(value))
        return table

    if not watch:
        Console().print(render())
        return
    done = 0
    pause = threading.Event()
    with Live(render(), refresh_per_second=4) as live:
        while count is None or done < count:
            pause.wait(interval)
            live.update(render())
            done += 1


bingo_cli = typer.Typer(add_completion=False, help="The Bingo sample (zlink/samples/bingo).")
cli.add_typer(bingo_cli, name="bingo")


@bingo_cli.command("play")
def bingo_play(
    rooms: Annotated[int, typer.Option(min=1, help="rooms, one game each")] = 4,
    players: Annotated[
        int, typer.Option(min=1, max=100, help="players per room (a room seats 100)")
    ] = 8,
    nodes: Annotated[int, typer.Option(min=1, help="nodes; rooms move between them")] = 1,
    draw_ms: Annotated[float, typer.Option(min=1.0, help="milliseconds between draws")] = 5.0,
    workers: Annotated[int | None, typer.Option(help="worker threads (default: cores)")] = None,
    processes: Annotated[
        bool,
        typer.Option(help="each node its own process, driven by a zlink.connect client"),
    ] = False,
) -> None:
    """Play one Bingo game per room on embedded nodes and print a summary; with --nodes K
    the rooms move between the nodes while they play; with --processes the nodes are OS
    processes on 127.0.0.1 and this process drives them as a client (python-api §10)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    if processes:
        _bingo_processes(rooms, players, nodes, draw_ms, workers)
        return
    _app_dir()
    try:
        from zlink.samples.bingo.play import play
    except ImportError as exc:
        raise typer.BadParameter(f"run from the repository root: {exc}") from exc
    console = Console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("games finished", total=rooms)
        summary = play(
            rooms,
            players,
            draw_interval=draw_ms / 1000,
            nodes=nodes,
            workers=workers,
            progress=lambda done, total: bar.update(task, completed=done),
        )
    table = Table(title="Bingo", show_header=False)
    for key, value in (
        ("rooms / players", f"{summary.rooms} / {summary.players}"),
        ("games finished", str(summary.games)),
        ("winners", str(len(summary.winners))),
        ("messages", f"{summary.messages:,}"),
        ("draw -> mark latency", f"p50 {summary.p50_ms:.2f} ms, p99 {summary.p99_ms:.2f} ms"),
        ("nodes / room moves", f"{summary.nodes} / {summary.moves}"),
        ("wall time", f"{summary.seconds:.2f} s on {summary.workers} workers"),
        ("handler errors", str(summary.counters.get("handler_errors", 0))),
    ):
        table.add_row(key, value)
    console.print(table)
    slow = summary.p50_ms > max(50.0, 10 * draw_ms)
    if slow:  # marks queue up behind draws: say so, rather than a p50 of seconds in silence
        console.print(
            f"[yellow]overloaded:[/] a mark takes {summary.p50_ms:,.0f} ms (p50) after its draw,"
            f" {summary.p50_ms / draw_ms:,.0f}x the draw interval ({draw_ms:g} ms): the nodes"
            " cannot keep up; try fewer rooms or players, more --workers or a larger --draw-ms"
        )
    errors = summary.counters.get("handler_errors", 0)
    if errors:
        console.print(f"[red]{errors} handler errors[/]: the log above says which")
    if summary.games != rooms or errors:
        raise typer.Exit(1)


def _bingo_processes(
    rooms: int, players: int, nodes: int, draw_ms: float, workers: int | None
) -> None:
    from rich.console import Console
    from rich.table import Table

    from zlink.samples.bingo.processes import play_processes

    s = play_processes(rooms, players, nodes=nodes, draw_interval=draw_ms / 1000,
                       workers=workers)  # fmt: skip
    table = Table(title="Bingo on node processes", show_header=False)
    for key, value in (
        ("rooms / players", f"{s.rooms} / {s.players}"),
        ("games finished", str(s.games)),
        ("winners", str(len(s.winners))),
        ("numbers drawn", f"{s.drawn:,}"),
        ("node processes / room moves", f"{s.nodes} / {s.moves}"),
        ("wall time", f"{s.seconds:.2f} s"),
        ("handler errors", str(s.counters.get("handler_errors", 0))),
    ):
        table.add_row(key, value)
    Console().print(table)
    if s.games != rooms:
        raise typer.Exit(1)


@cli.command()
def version() -> None:
    """Print the ZLink version, the interpreter it runs on, and how many of the turn's modules
    run compiled (setup.py; ``ZLINK_PURE=1`` runs them all as Python)."""
    from .. import __version__, _native

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    compiled = [n for n in _native.compiled_modules() if n in _native.COMPILED]
    code = f"{len(compiled)} of {len(_native.COMPILED)} modules compiled"
    code = code if compiled else "pure Python"
    typer.echo(
        f"zlink {__version__} on Python {sys.version.split()[0]} "
        f"(GIL {'on' if gil else 'off'}, {code})"
    )


def main() -> None:
    """Console entry point."""
    cli()
