"""ZLink for Python: addressable, stateful Spots and Actors, one turn at a time.

The public surface is exactly the names below (spec/python-api.md). The layout behind them:
``executor/`` is the engine (gates, lanes, turns, workers, infrastructure thread) and knows
nothing of Spots; ``types.py`` the shared values and enums; ``bases.py`` the classes users
subclass; ``messaging/`` messages, calls and contexts; ``runtime/`` one node's live objects and
delivery; ``relocation/`` moves between nodes; ``mesh/`` the store and transport seams;
``node.py`` wires them together. docs/architecture.md draws the arrows.
"""

from . import _native

_native.install()  # before any other module: which of them run compiled (zlink/_native.py)

from . import errors as errors
from .adapters import JsonStateAdapter as JsonStateAdapter
from .adapters import RelocationAdapter as RelocationAdapter
from .app import App as App
from .app import Relocation as Relocation
from .bases import Actor as Actor
from .bases import EntrySpot as EntrySpot
from .bases import InstanceSpot as InstanceSpot
from .bases import UserSpot as UserSpot
from .config import NodeConfig as NodeConfig
from .errors import Cancelled as Cancelled
from .errors import DeadlineExceeded as DeadlineExceeded
from .errors import ErrorCode as ErrorCode
from .errors import HandlerError as HandlerError
from .errors import InvalidArgument as InvalidArgument
from .errors import InvalidOperation as InvalidOperation
from .errors import NotFound as NotFound
from .errors import ResourceExhausted as ResourceExhausted
from .errors import StateIncompatible as StateIncompatible
from .errors import Unavailable as Unavailable
from .errors import ZLinkError as ZLinkError
from .handlers import handler as handler
from .handlers import subscription as subscription
from .mesh.client import AsyncConnect as AsyncConnect
from .mesh.client import RemoteClient as RemoteClient
from .mesh.client import connect as connect
from .mesh.client import connect_async as connect_async
from .messaging.calls import CreateCall as CreateCall
from .messaging.calls import JoinCall as JoinCall
from .messaging.calls import RequestCall as RequestCall
from .messaging.calls import SendCall as SendCall
from .messaging.calls import WorkerCall as WorkerCall
from .messaging.context import ActorContext as ActorContext
from .messaging.context import ActorManager as ActorManager
from .messaging.context import ChannelContext as ChannelContext
from .messaging.context import Client as Client
from .messaging.context import EntrySpotContext as EntrySpotContext
from .messaging.context import InstanceSpotContext as InstanceSpotContext
from .messaging.context import MessageContext as MessageContext
from .messaging.context import RouteClient as RouteClient
from .messaging.context import SpotContext as SpotContext
from .messaging.context import SpotManager as SpotManager
from .messaging.context import WorkerManager as WorkerManager
from .messaging.message import Message as Message
from .messaging.message import Request as Request
from .node import DrainResult as DrainResult
from .node import Node as Node
from .status import NodeStatus as NodeStatus
from .status import OwnerStatus as OwnerStatus
from .status import StatusSubscription as StatusSubscription
from .status import TimerStatus as TimerStatus
from .status import TypeStatus as TypeStatus
from .timers import OverrunPolicy as OverrunPolicy
from .timers import TimerHandle as TimerHandle
from .timers import TimerManager as TimerManager
from .timers import TimerOptions as TimerOptions
from .timers import TimerTick as TimerTick
from .timers import timer_handler as timer_handler
from .types import ActorCreateResponse as ActorCreateResponse
from .types import ActorCreateResult as ActorCreateResult
from .types import ActorJoinCompletion as ActorJoinCompletion
from .types import ActorJoinResult as ActorJoinResult
from .types import ExecutionMode as ExecutionMode
from .types import RelocationCoordination as RelocationCoordination
from .types import RelocationReadyStatus as RelocationReadyStatus
from .types import SpotCloseReason as SpotCloseReason
from .types import SpotClosingContext as SpotClosingContext
from .types import SpotCreateResponse as SpotCreateResponse
from .types import SpotCreateResult as SpotCreateResult
from .types import SpotKind as SpotKind
from .types import SpotRef as SpotRef
from .types import SpotRelocationReadyCompletion as SpotRelocationReadyCompletion

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "ActorContext",
    "ActorCreateResponse",
    "ActorCreateResult",
    "ActorJoinCompletion",
    "ActorJoinResult",
    "ActorManager",
    "App",
    "AsyncConnect",
    "Cancelled",
    "ChannelContext",
    "Client",
    "CreateCall",
    "DeadlineExceeded",
    "DrainResult",
    "EntrySpot",
    "EntrySpotContext",
    "ErrorCode",
    "ExecutionMode",
    "HandlerError",
    "InstanceSpot",
    "InstanceSpotContext",
    "InvalidArgument",
    "InvalidOperation",
    "JoinCall",
    "JsonStateAdapter",
    "Message",
    "MessageContext",
    "Node",
    "NodeConfig",
    "NodeStatus",
    "NotFound",
    "OverrunPolicy",
    "OwnerStatus",
    "Relocation",
    "RelocationAdapter",
    "RelocationCoordination",
    "RelocationReadyStatus",
    "RemoteClient",
    "Request",
    "RequestCall",
    "ResourceExhausted",
    "RouteClient",
    "SendCall",
    "SpotCloseReason",
    "SpotClosingContext",
    "SpotContext",
    "SpotCreateResponse",
    "SpotCreateResult",
    "SpotKind",
    "SpotManager",
    "SpotRef",
    "SpotRelocationReadyCompletion",
    "StateIncompatible",
    "StatusSubscription",
    "TimerHandle",
    "TimerManager",
    "TimerOptions",
    "TimerStatus",
    "TimerTick",
    "TypeStatus",
    "Unavailable",
    "UserSpot",
    "WorkerCall",
    "WorkerManager",
    "ZLinkError",
    "connect",
    "connect_async",
    "errors",
    "handler",
    "subscription",
    "timer_handler",
]
