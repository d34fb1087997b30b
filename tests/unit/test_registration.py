"""Registration errors are InvalidOperation at decoration or Node.start(), never later."""

from __future__ import annotations

import pytest

import zlink


class Ping(zlink.Message, type_name="t.rg.ping"):
    pass


def test_a_handler_needs_a_message_parameter_at_decoration():
    with pytest.raises(zlink.InvalidOperation):

        @zlink.handler
        def lonely(self) -> None: ...

    with pytest.raises(zlink.InvalidOperation):

        @zlink.handler
        def too_many(self, msg: Ping, ctx: object, extra: int) -> None: ...

    with pytest.raises(zlink.InvalidOperation):
        zlink.handler(42)  # type: ignore[type-var]


def test_a_handler_annotation_must_be_a_message_type():
    app = zlink.App("reg")
    with pytest.raises(zlink.InvalidOperation, match="Message subclass"):

        @app.user_spot("t.rg.a")
        class A(zlink.UserSpot):
            @zlink.handler
            def handle(self, msg: int) -> None: ...

    with pytest.raises(zlink.InvalidOperation, match="Message subclass"):

        @app.user_spot("t.rg.b")
        class B(zlink.UserSpot):
            @zlink.handler
            def handle(self, msg) -> None: ...  # type: ignore[no-untyped-def]


def test_two_handlers_for_one_message_type_are_refused():
    app = zlink.App("reg")
    with pytest.raises(zlink.InvalidOperation, match="two handlers"):

        @app.user_spot("t.rg.c")
        class C(zlink.UserSpot):
            @zlink.handler
            def one(self, msg: Ping) -> None: ...

            @zlink.handler
            def two(self, msg: Ping) -> None: ...


def test_duplicate_types_and_wrong_bases_are_refused():
    app = zlink.App("reg")

    @app.user_spot("t.rg.d")
    class D(zlink.UserSpot): ...

    with pytest.raises(zlink.InvalidOperation, match="twice"):
        app.user_spot("t.rg.d")
    with pytest.raises(zlink.InvalidOperation, match="subclass"):
        app.user_spot("t.rg.e")(object)
    with pytest.raises(zlink.InvalidArgument):
        app.user_spot("")


def test_per_actor_accepts_only_recreate_and_application_signaled_only_spot_wide():
    app = zlink.App("reg")
    with pytest.raises(zlink.InvalidOperation, match="recreate"):
        app.user_spot(
            "t.rg.f",
            mode=zlink.ExecutionMode.PER_ACTOR,
            relocation=zlink.Relocation.preserve_state(object),
        )
    with pytest.raises(zlink.InvalidOperation, match="SPOT_WIDE"):
        app.user_spot(
            "t.rg.g",
            mode=zlink.ExecutionMode.PER_ACTOR,
            relocation_coordination=zlink.RelocationCoordination.APPLICATION_SIGNALED,
        )


def test_an_instance_spot_cannot_hold_actors():
    app = zlink.App("reg")
    with pytest.raises(zlink.InvalidOperation, match="cannot hold Actors"):

        @app.instance_spot("t.rg.h")
        class H(zlink.InstanceSpot):
            def on_actor_join(self, actor_id: str, request: object) -> None: ...


def test_actor_and_entry_spot_must_match_at_start():
    app = zlink.App("reg")

    @app.actor("t.rg.homeless")
    class Homeless(zlink.Actor): ...

    with pytest.raises(zlink.InvalidOperation, match="no entry_spot"):
        zlink.Node(app, zlink.NodeConfig(workers=1)).start()

    app2 = zlink.App("reg2")

    @app2.entry_spot("t.rg.lobby", actor="t.rg.ghost")
    class Lobby(zlink.EntrySpot): ...

    with pytest.raises(zlink.InvalidOperation, match="unknown Actor type"):
        zlink.Node(app2, zlink.NodeConfig(workers=1)).start()


def test_an_unresolvable_forward_reference_fails_at_node_start():
    app = zlink.App("reg")

    @app.user_spot("t.rg.fwd")
    class Fwd(zlink.UserSpot):
        @zlink.handler
        def handle(self, msg: NotYetDefined) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    node = zlink.Node(app, zlink.NodeConfig(workers=1))
    with pytest.raises(zlink.InvalidOperation, match="cannot resolve"):
        node.start()
    node.shutdown()


def test_two_message_classes_cannot_share_a_wire_name():
    with pytest.raises(zlink.InvalidOperation, match="wire name"):

        class Other(zlink.Message, type_name="t.rg.ping"):
            pass


def test_the_public_surface_is_exactly_all():
    modules = {"app", "cli", "config", "executor", "handlers", "messaging", "node", "runtime"}
    modules |= {"timers", "status", "admin", "mesh", "relocation", "lock_order", "types"}
    modules |= {"adapters", "bases", "durations", "samples", "addresses"}
    public = {n for n in dir(zlink) if not n.startswith("_")} - modules - {"testing"}
    assert public == set(zlink.__all__)
    for name in zlink.__all__:
        assert getattr(zlink, name) is not None
