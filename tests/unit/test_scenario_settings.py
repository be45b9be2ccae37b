from __future__ import annotations

import subprocess
import sys

import pytest

from lab.scenario import MAX_CONSUMERS, Scenario
from lab.settings import Settings, parse_size, settings_env


def test_defaults_are_the_reference_bench() -> None:
    s = Scenario()
    assert (s.messages, s.senders, s.batch_size, s.poll_wait_ms, s.flush_wait_ms) == (100_000, 200, 100, 100, 50)
    assert s.cooldown_s == 20 and s.drain_timeout_s == 600 and s.ready_timeout_s == 120


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"consumers": 0}, "consumers must be between 1 and"),
        ({"consumers": MAX_CONSUMERS + 1}, "max_wal_senders"),
        ({"messages": 0}, "messages must be at least 1"),
        ({"senders": 0}, "senders must be at least 1"),
        ({"rate": -1}, "rate must not be negative"),
        ({"drain_timeout_s": 0}, "drain_timeout_s must be positive"),
    ],
)
def test_bad_values_are_one_clear_error(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scenario(**changes)


def test_parameters_round_trip() -> None:
    s = Scenario(pipeline="kafka", consumers=4, messages=10, label="x")
    assert Scenario(**s.as_parameters()) == s
    assert set(s.as_parameters()) == set(Scenario.field_names())
    assert all(isinstance(v, str | int | float | bool) for v in s.as_parameters().values())


def test_settings_pass_to_children_through_the_environment() -> None:
    s = Settings.from_env({}).replace(pg_port=1234, rabbitmq_node="x@localhost")
    assert Settings.from_env(settings_env(s)) == s


def test_the_retained_wal_limit_reads_sizes() -> None:
    assert Settings.from_env({}).max_retained_wal == 2 * 1024**3
    assert Settings.from_env({"LAB_MAX_RETAINED_WAL": "4MB"}).max_retained_wal == 4 * 1024**2
    assert Settings.from_env({"LAB_MAX_RETAINED_WAL": "1048576"}).max_retained_wal == 1048576
    assert parse_size("64kB") == 65536 and parse_size("1 GB") == 1024**3
    for bad in ("2 parsecs", "MB", "0MB", "-1"):
        with pytest.raises(ValueError, match=r"LAB_MAX_RETAINED_WAL=.* is not a size like 2GB"):
            Settings.from_env({"LAB_MAX_RETAINED_WAL": bad})
    s = Settings.from_env({}).replace(max_retained_wal=12345)
    assert Settings.from_env(settings_env(s)).max_retained_wal == 12345


def test_the_free_disk_minimum_reads_sizes() -> None:
    assert Settings.from_env({}).min_free_disk == 1024**3
    assert Settings.from_env({"LAB_MIN_FREE_DISK": "10GB"}).min_free_disk == 10 * 1024**3
    for bad in ("lots", "0"):
        with pytest.raises(ValueError, match=r"LAB_MIN_FREE_DISK=.* is not a size like 2GB"):
            Settings.from_env({"LAB_MIN_FREE_DISK": bad})
    s = Settings.from_env({}).replace(min_free_disk=54321)
    assert Settings.from_env(settings_env(s)).min_free_disk == 54321


def test_settings_reject_a_bad_port() -> None:
    with pytest.raises(ValueError, match="LAB_PG_PORT='abc' is not an integer"):
        Settings.from_env({"LAB_PG_PORT": "abc"})


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "--pipeline", "nope"], "lab: error: unknown pipeline 'nope'"),
        (["run", "--consumers", "0"], "lab run: error: argument --consumers: '0' must be a finite number at least 1 "
                                      "and at most 60"),
        (["run", "--messages", "0"], "lab run: error: argument --messages: '0' must be a finite number at least 1"),
    ],
)
def test_cli_rejects_bad_scenarios_before_starting_anything(args: list[str], line: str) -> None:
    res = subprocess.run([sys.executable, "-m", "lab", *args], capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert res.stderr.startswith(line) and len(res.stderr.strip().splitlines()) == 1
