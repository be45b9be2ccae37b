"""The native stack as a user drives it: `lab stack ...` against the session's real stack."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from lab.pg.pgoutput import protocol_version
from lab.pg.replication import ReplicationStream
from lab.pg.slots import drop_slots, wait_streaming
from lab.settings import Settings
from lab.stack.postgres import PUBLICATION
from tests.conftest import lab_env

pytestmark = pytest.mark.integration
LAB = [sys.executable, "-m", "lab"]


def lab(settings: Settings, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAB, *args], env=env or lab_env(settings), capture_output=True, text=True,
                          timeout=300, check=False)


def test_status_json_lists_every_service(stack: object, settings: Settings) -> None:
    res = lab(settings, "stack", "status", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert {"postgres", "kafka", "rabbitmq", "debezium-kafka", "debezium-rabbitmq"} <= rows.keys()
    for name in ("postgres", "kafka", "rabbitmq"):
        assert rows[name]["state"] == "running"
        assert rows[name]["pids"] and rows[name]["rss_mb"] > 10
        assert rows[name]["version"]
    assert rows["postgres"]["version"].startswith("18")
    assert rows["kafka"]["version"].startswith("4.")
    assert str(settings.pg_port) in rows["postgres"]["endpoint"]
    assert rows["debezium-kafka"]["state"] == "stopped"


def test_up_twice_is_a_no_op(stack: object, settings: Settings) -> None:
    before = json.loads(lab(settings, "stack", "status", "--json").stdout)
    res = lab(settings, "stack", "up")
    assert res.returncode == 0, res.stderr
    after = json.loads(lab(settings, "stack", "status", "--json").stdout)
    assert [r["pids"] for r in before] == [r["pids"] for r in after]


def test_status_shows_every_slot_and_the_wal_it_retains(stack: object, settings: Settings) -> None:
    """An active slot (a walsender streams it) and an inactive one, each with its name, whether it
    is held, the WAL it retains, ``wal_status`` and ``safe_wal_size`` (Safety)."""

    async def status_while_streaming() -> tuple[str, list[dict[str, object]]]:
        async with await ReplicationStream.connect(settings.pg_dsn) as stream:
            await stream.create_slot("lab_status_active")
            await stream.start("lab_status_active", PUBLICATION, protocol_version(stream.server_version_num))
            await asyncio.to_thread(wait_streaming, settings.pg_dsn, "lab_status_active", timeout=30)
            res = await asyncio.to_thread(lab, settings, "stack", "status")
            rows = json.loads((await asyncio.to_thread(lab, settings, "stack", "status", "--json")).stdout)
        return res.stdout, next(r for r in rows if r["name"] == "postgres")["detail"]["slots"]

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('lab_status_idle', 'pgoutput')")
        conn.execute("INSERT INTO messages (content) VALUES ('x')")
        try:
            text, slots = asyncio.run(status_while_streaming())
        finally:
            drop_slots(settings.pg_dsn, "lab_status_")
    by_name = {s["slot"]: s for s in slots}
    idle, active = by_name["lab_status_idle"], by_name["lab_status_active"]
    assert idle["active"] is False and active["active"] is True and isinstance(active["active_pid"], int)
    assert idle["retained_wal_bytes"] > 0 and active["retained_wal_bytes"] >= 0
    assert idle["wal_status"] == active["wal_status"] == "reserved"
    assert idle["safe_wal_size"] > 0 and idle["invalidation_reason"] is None
    # the two status calls are apart in time and the background writer logs running transactions
    # every 15 s: the idle slot's retention may only have grown between the text and the JSON
    shown = re.search(rf"slot {'lab_status_idle':<22} inactive retains (\d+) bytes", text)
    assert shown is not None, text
    assert 0 < int(shown.group(1)) <= idle["retained_wal_bytes"]
    assert f"slot {'lab_status_active':<22} active   retains" in text
    assert "wal_status reserved, safe_wal_size " in text


def test_status_warns_about_an_inactive_slot(stack: object, settings: Settings) -> None:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('lab_idle_probe', 'pgoutput')")
        conn.execute("INSERT INTO messages (content) VALUES ('x')")
        try:
            res = lab(settings, "stack", "status")
            assert "replication slot lab_idle_probe is inactive and retains" in res.stdout
            rows = json.loads(lab(settings, "stack", "status", "--json").stdout)
            pg = next(r for r in rows if r["name"] == "postgres")
            slots = {s["slot"]: s for s in pg["detail"]["inactive_slots"]}
            assert slots["lab_idle_probe"]["retained_wal_bytes"] > 0
        finally:
            conn.execute("SELECT pg_drop_replication_slot('lab_idle_probe')")


def test_unknown_sink_is_one_clear_line(stack: object, settings: Settings) -> None:
    res = lab(settings, "stack", "debezium", "start", "pulsar")
    assert res.returncode == 2
    assert res.stderr.strip() == "lab: error: unknown Debezium sink 'pulsar': choose one of kafka, rabbitmq"


def test_taken_port_stops_up_before_anything_starts(settings: Settings, tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        env = lab_env(settings.replace(stack_dir=tmp_path / "s", pg_port=port))
        res = lab(settings, "stack", "up", env=env)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"lab: error: port {port} needed by PostgreSQL is already in use by another process; "
        f"stop that process or choose another port with LAB_PG_PORT=<port>"
    )
    assert not list((tmp_path / "s").rglob("pid.json"))


def test_missing_maven_is_named(settings: Settings, tmp_path: Path) -> None:
    env = lab_env(settings.replace(stack_dir=tmp_path / "s", cache_dir=tmp_path / "cache"))
    env["PATH"] = str(Path(sys.executable).parent)
    res = lab(settings, "stack", "provision", env=env)
    assert res.returncode == 2
    assert "mvn not found on PATH; install Maven" in res.stderr


def test_old_java_is_refused(settings: Settings, tmp_path: Path) -> None:
    old = next((p for p in Path("/usr/lib/jvm").glob("*17*") if (p / "bin" / "java").exists()), None)
    if old is None:
        pytest.skip("no Java 17 on this machine to play the old Java")
    env = lab_env(settings.replace(stack_dir=tmp_path / "s", java_home=old))
    res = lab(settings, "stack", "provision", env=env)
    assert res.returncode == 2
    assert "Java 21+ is needed for Kafka and Debezium" in res.stderr and "(17)" in res.stderr
