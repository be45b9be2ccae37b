"""A setting a fault run changes with ALTER SYSTEM is reset by the next `stack up` and by the next
run, and a run records the server settings it started under."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from lab.runner import run_scenario
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack

pytestmark = pytest.mark.integration


def _leave_keep_size(settings: Settings) -> None:
    """What a slot-invalidation run killed before its restore leaves behind."""
    with psycopg.connect(settings.pg_primary_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '32MB'")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute("SELECT pg_sleep(0.5)")


def _keep_size(settings: Settings) -> str:
    with psycopg.connect(settings.pg_primary_dsn) as conn:
        row = conn.execute("SHOW max_slot_wal_keep_size").fetchone()
    assert row is not None
    return str(row[0])


def test_up_and_the_next_run_reset_a_fault_setting(stack: NativeStack, settings: Settings) -> None:
    _leave_keep_size(settings)
    assert _keep_size(settings) == "32MB"
    stack.up()  # PostgreSQL already running: nothing restarts, the setting is reset anyway
    assert _keep_size(settings) == "4GB"
    _leave_keep_size(settings)
    r = asyncio.run(run_scenario(Scenario(messages=300, cooldown_s=0), settings))
    assert r["success"], r["error"]
    assert r["server_settings"]["max_slot_wal_keep_size"] == "4GB"
    assert r["server_settings"]["wal_level"] == "logical"
    assert _keep_size(settings) == "4GB"
