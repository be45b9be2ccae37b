from __future__ import annotations

import re
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


FLOAT_FIELDS = [f.name for f in __import__("dataclasses").fields(Scenario) if f.type == "float"]
INT_FIELDS = [f.name for f in __import__("dataclasses").fields(Scenario) if f.type == "int"]


def test_every_float_field_is_known() -> None:
    assert {"cooldown_s", "drain_timeout_s", "ready_timeout_s", "rate", "work_delay_ms", "step_s"} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("name", FLOAT_FIELDS + INT_FIELDS)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_number_is_refused_by_the_scenario_itself(name: str, value: float) -> None:
    """A notebook or an API caller reaches the runner without the CLI's option types: `cooldown_s=inf`
    would sleep holding the stack's lock, `drain_timeout_s=nan` removes the deadline, `rate=nan`
    turns an open-loop run into a burst."""
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number, got -?(nan|inf)$"):
        Scenario(**{name: value})


@pytest.mark.parametrize(("name", "value"), [("cooldown_s", 1e300), ("drain_timeout_s", 1e9), ("rate", 1e12),
                                             ("ready_timeout_s", 1e7), ("work_delay_ms", 1e10)])
def test_a_float_beyond_its_bound_is_refused(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be at most"):
        Scenario(**{name: value})


def test_a_bool_or_a_text_is_not_a_number() -> None:
    with pytest.raises(ValueError, match="consumers must be a number, got True"):
        Scenario(consumers=True)
    with pytest.raises(ValueError, match="rate must be a number, got '5'"):
        Scenario(rate="5")  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "line"), [
    ({"LAB_PG_PORT": "65535", "LAB_TOPOLOGY": "ha"},
     "LAB_PG_PORT=65535: the ha standby (+ 1) would listen on port 65536, above 65535"),
    ({"LAB_WEB_PORT": "65535"}, "LAB_WEB_PORT=65535: the web's control listener (+ 1) would listen on port 65536"),
    ({"LAB_KAFKA_PORT": "65520", "LAB_TOPOLOGY": "ha"},
     "LAB_KAFKA_PORT=65520: the ha topology's node 3 (+ 30) would listen on port 65550"),
    ({"LAB_AMQP_PORT": "65530", "LAB_TOPOLOGY": "ha"}, "LAB_AMQP_PORT=65530: the ha topology's node 3"),
])
def test_a_derived_port_beyond_the_range_names_its_variable(env: dict[str, str], line: str) -> None:
    """Not an OverflowError that names nothing when a socket is opened at last."""
    with pytest.raises(ValueError, match=f"^{re.escape(line)}"):
        Settings.from_env(env)
    Settings.from_env({**env, "LAB_TOPOLOGY": "single", "LAB_WEB_CONTROL_PORT": "30000"})  # not derived there


@pytest.mark.parametrize("version", ["../../etc", "4.2.2/../..", "..", "4.2 2", ""])
def test_a_version_that_is_not_one_is_refused(version: str) -> None:
    """The versions name directories of the cache the lab deletes and rebuilds."""
    with pytest.raises(ValueError, match=r"LAB_KAFKA_VERSION=.* is not a version"):
        Settings.from_env({"LAB_KAFKA_VERSION": version} if version else {"LAB_KAFKA_VERSION": " "})
    with pytest.raises(ValueError, match="LAB_DEBEZIUM_VERSION"):
        Settings.from_env({"LAB_DEBEZIUM_VERSION": version or "x/y"})
    good = Settings.from_env({"LAB_KAFKA_VERSION": "4.3.1", "LAB_DEBEZIUM_VERSION": "3.6.1.Final"})
    assert (good.kafka_version, good.debezium_version) == ("4.3.1", "3.6.1.Final")


def test_debezium_jvm_options_are_options_and_recorded_with_its_version() -> None:
    from lab.stack.debezium import debezium_version

    with pytest.raises(ValueError, match=r"LAB_DEBEZIUM_JAVA_OPTS=.*'TieredStopAtLevel=1' is not a JVM option"):
        Settings.from_env({"LAB_DEBEZIUM_JAVA_OPTS": "-XX:+UseSerialGC TieredStopAtLevel=1"})
    opts = Settings.from_env({"LAB_DEBEZIUM_JAVA_OPTS": "  -XX:TieredStopAtLevel=1   -XX:+UseSerialGC "})
    assert opts.debezium_java_opts == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert debezium_version(opts) == "3.6.1.Final (JVM -XX:TieredStopAtLevel=1 -XX:+UseSerialGC)"
    assert debezium_version(Settings.from_env({})) == "3.6.1.Final"  # the study's: the reference's options alone
    assert Settings.from_env(settings_env(opts)).debezium_java_opts == opts.debezium_java_opts  # to children


def test_docker_host_is_the_engine_when_lab_docker_host_is_empty() -> None:
    """An empty LAB_DOCKER_HOST does not let the user's DOCKER_HOST through unguarded: it is the engine,
    whose address the route guard checks (here a layout address routed nowhere: refused)."""
    from lab.stack.base import StackError
    from lab.stack.engine import engine_routed, require_engine_routed

    s = Settings.from_env({"DOCKER_HOST": "tcp://10.231.83.7:2376"})
    assert s.engine_host == "tcp://10.231.83.7:2376" and s.service_host == "10.231.83.7"
    assert not engine_routed(s)
    with pytest.raises(StackError, match=r"10\.231\.83\.7.* is on a lab bridge that is not up"):
        require_engine_routed(s)
    both = Settings.from_env({"DOCKER_HOST": "tcp://10.231.83.7:2376", "LAB_DOCKER_HOST": "unix:///run/x.sock"})
    assert both.engine_host == "unix:///run/x.sock" and engine_routed(both)
    assert Settings.from_env({}).engine_host == ""
