"""The fixture that runs a test module on both JSON backends ``zlink.messaging.codec`` may pick
(orjson; the standard ``json`` where orjson has no wheel, as on 3.13t). A module imports
``backend`` to have it apply to every test it holds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zlink.messaging import codec


@pytest.fixture(autouse=True, params=["orjson", "json"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test runs on both JSON backends ``zlink.messaging.codec`` may pick."""
    if request.param == "orjson" and codec._orjson is None:
        pytest.skip("orjson is not installed on this interpreter")
    if request.param == "json":
        monkeypatch.setattr(codec, "_orjson", None)
    yield request.param
