"""The properties Debezium Server runs with: the reference's in clean runs, and
:data:`lab.stack.debezium.DURABLE` on top of them in fault runs, nothing else changed."""

from __future__ import annotations

import pytest

from lab.settings import Settings
from lab.stack.debezium import DURABLE, render_properties, with_overrides


def _props(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            assert key not in out, f"{key} set twice"
            out[key] = value
    return out


@pytest.mark.parametrize("sink", ["kafka", "rabbitmq"])
def test_durable_changes_only_its_keys(sink: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env()
    monkeypatch.setattr(Settings, "secret", lambda self, name: "pw")
    clean = _props(render_properties(settings, sink))
    durable = _props(render_properties(settings, sink, durable=True))
    assert clean["debezium.source.slot.drop.on.stop"] == "true"  # the reference
    assert clean["debezium.source.offset.storage"].endswith("MemoryOffsetBackingStore")
    assert {k: durable[k] for k in DURABLE} == DURABLE
    rest = {k: v for k, v in durable.items() if k not in DURABLE}
    assert rest == {k: v for k, v in clean.items() if k not in DURABLE}


def test_with_overrides_replaces_in_place_and_appends() -> None:
    text = "# a=comment\na=1\nb=2\n"
    assert with_overrides(text, {"a": "9", "c": "3"}) == "# a=comment\na=9\nb=2\nc=3\n"


@pytest.mark.parametrize("sink", ["kafka", "rabbitmq"])
def test_a_moved_debezium_changes_only_its_port(sink: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After postgres-failover Debezium is restarted pointed at the promoted standby: the
    database port is the only key that changes."""
    settings = Settings.from_env()
    monkeypatch.setattr(Settings, "secret", lambda self, name: "pw")
    clean = _props(render_properties(settings, sink, durable=True))
    moved = _props(render_properties(settings, sink, durable=True, pg_port=settings.pg_standby_port))
    assert clean["debezium.source.database.port"] == str(settings.pg_port)
    assert moved["debezium.source.database.port"] == str(settings.pg_port + 1)
    assert {k for k in clean if clean[k] != moved[k]} == {"debezium.source.database.port"}
