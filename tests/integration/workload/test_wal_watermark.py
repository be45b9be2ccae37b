"""The ``wal`` watermark on the real stack: a slot never confirms past a row whose work is not done.

Two ``wal`` consumers (every reader sees every row). Row A is inserted alone and its work is held
in the web service (``--test-hold``); once A is claimed, 20 later rows are inserted. The holder
has read A's Commit, yet its slot's ``confirmed_flush_lsn`` must stay at or below the WAL position
before A while the other reader works all 20 later rows and its slot moves past A. Released, the
holder finishes A, loses the later rows' claims, and its slot passes A as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from lab.pg.slots import drop_slots, wait_streaming
from lab.pg.walstream import parse_lsn
from lab.pipelines.wal import SLOT_PREFIX, slot_name
from lab.scenario import Scenario
from lab.settings import Settings, child_env

pytestmark = pytest.mark.integration
LATER = 20


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def reader_pair(stack: object, settings: Settings, tmp_path: Path) -> Iterator[Callable[[str, dict], None]]:
    """The web service with the test hold, two ``wal`` consumers streaming; all stopped afterwards."""
    drop_slots(settings.pg_dsn, SLOT_PREFIX)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE inbox_wal, messages")
    env = child_env(settings)
    out = open(tmp_path / "procs.log", "ab")  # noqa: SIM115 - closed below
    web = subprocess.Popen([sys.executable, "-m", "lab.workload.web", "--port", str(settings.web_port),
                            "--control-port", str(settings.control_port),
                            "--dsn", settings.pg_dsn, "--pool", "4", "--test-hold"],
                           env=env, stdout=out, stderr=subprocess.STDOUT)
    procs = [web]

    def post(path: str, body: dict | None = None) -> None:
        req = urllib.request.Request(settings.control_url + path, data=json.dumps(body or {}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10):
            pass

    try:
        wait_for("the web service", lambda: _answers(settings.control_url + "/load/stats"))
        scenario = json.dumps(Scenario(pipeline="wal", consumers=2).as_parameters())
        for i in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "lab.consumer", "--pipeline", "wal", "--index", str(i),
                 "--run-dir", str(tmp_path), "--scenario", scenario],
                env=env, stdout=out, stderr=subprocess.STDOUT))
        for i in range(2):
            wait_streaming(settings.pg_dsn, slot_name(i), timeout=120)
        yield post
    finally:
        for p in procs[1:] + procs[:1]:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        out.close()
        drop_slots(settings.pg_dsn, SLOT_PREFIX)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_a_held_row_keeps_its_slot_below_its_commit_until_its_work_is_done(
        settings: Settings, reader_pair: Callable[[str, dict], None]) -> None:
    post = reader_pair
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        def lsn(query: str = "SELECT pg_current_wal_insert_lsn()::text") -> int:
            return parse_lsn(conn.execute(query).fetchone()[0])

        def confirmed() -> dict[str, int]:
            rows = conn.execute("SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots "
                                "WHERE slot_name LIKE %s", (SLOT_PREFIX + "%",)).fetchall()
            return {name: parse_lsn(v) for name, v in rows}

        def calls() -> int:
            return _get(settings.control_url + "/load/stats")["calls"]

        before_a = lsn()
        with conn.transaction():  # A's work is held before A can be streamed (at its commit)
            a = conn.execute("INSERT INTO messages (content) VALUES ('held') RETURNING id").fetchone()[0]
            post("/test/hold", {"id": a})
        after_a = lsn()
        wait_for("A to be claimed and its work called",
                 lambda: conn.execute("SELECT count(*) FROM inbox_wal").fetchone()[0] == 1 and calls() == 1)
        holder = conn.execute("SELECT slot FROM inbox_wal").fetchone()[0]
        other = next(s for s in (slot_name(0), slot_name(1)) if s != holder)
        for i in range(LATER):
            conn.execute("INSERT INTO messages (content) VALUES (%s)", (f"later-{i}",))
        wait_for("the later rows to be worked by the other reader", lambda: calls() == 1 + LATER)
        wait_for("the other slot to pass A", lambda: confirmed()[other] >= after_a)
        mark = conn.execute("SELECT now()").fetchone()[0]

        def reported() -> bool:  # the holder's walsender got a status update after ``mark``
            row = conn.execute(
                "SELECT r.reply_time FROM pg_stat_replication r JOIN pg_replication_slots s "
                "ON s.active_pid = r.pid WHERE s.slot_name = %s", (holder,)).fetchone()
            return row is not None and row[0] is not None and row[0] > mark

        # the reader's periodic status (every 10 s) goes out while A's work is pending: a reader that
        # confirmed positions as it read them would report A's commit in it
        wait_for("the holder to report its position while A is held", reported, timeout=90)
        held = confirmed()
        assert held[holder] <= before_a < after_a <= held[other], held
        owners = dict(conn.execute("SELECT slot, count(*) FROM inbox_wal GROUP BY slot").fetchall())
        assert owners == {holder: 1, other: LATER}  # the holder, blocked on A, claimed nothing more

        post("/test/release")
        wait_for("the holder's slot to pass A once A is done", lambda: confirmed()[holder] > after_a)
        assert calls() == 1 + LATER
