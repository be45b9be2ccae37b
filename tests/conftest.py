"""Shared fixtures.

The integration suite runs against its own native stack: its own state dir
(``<LAB_STACK_DIR>/test``, by default ``.stack/test``) and ports 300 above the configured ones,
so a stack a user has running is never touched. It is started once per test session and
stopped (and purged) afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.settings import Settings, child_env

TEST_PORT_OFFSET = 300
# Debezium's JVM in the suite: the reference's options plus a quick start (C1 only, the serial
# collector). Nothing in the suite measures Debezium's cost, and it starts Debezium dozens of times;
# a start to streaming took 7.1 and 8.1 s with the reference's options alone, 5.6 and 6.1 with these
# (2 rounds, alternating, nothing else running, 2026-12-07).
TEST_DEBEZIUM_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def test_settings(offset: int = TEST_PORT_OFFSET, name: str = "test", **extra: object) -> Settings:
    """The environment's settings moved to a stack of their own: ``<stack_dir>/<name>``, every port
    + ``offset``, the RabbitMQ node ``<name>-<node>``; ``extra`` overrides any field."""
    base = Settings.from_env()
    o = offset
    return base.replace(
        stack_dir=base.stack_dir / name,
        data_dir=base.stack_dir / name / "data",
        pg_port=base.pg_port + o,
        kafka_port=base.kafka_port + o,
        kafka_controller_port=base.kafka_controller_port + o,
        amqp_port=base.amqp_port + o,
        rabbitmq_dist_port=base.rabbitmq_dist_port + o,
        rabbitmq_epmd_port=base.rabbitmq_epmd_port + o,
        rabbitmq_node=f"{name}-{base.rabbitmq_node}",
        web_port=base.web_port + o,
        debezium_java_opts=TEST_DEBEZIUM_JAVA_OPTS,
        web_control_port=base.control_port + o,
        debezium_kafka_http_port=base.debezium_kafka_http_port + o,
        debezium_rabbitmq_http_port=base.debezium_rabbitmq_http_port + o,
        **extra,
    )


@pytest.fixture(scope="session")
def settings() -> Settings:
    return test_settings()


@pytest.fixture(scope="session")
def stack(settings: Settings) -> Iterator[object]:
    """The real native stack, up for the whole session, down and purged afterwards."""
    from lab.stack.native import NativeStack

    native = NativeStack(settings)
    native.down(purge=True)  # leftovers of an interrupted earlier session
    try:
        native.up()  # inside: a node that failed to start must not leave the others running
        yield native
    finally:
        from lab.measure.cgroups import remove_scope

        native.down(purge=True)
        remove_scope(settings)


def lab_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a `lab` subprocess use ``settings``."""
    return child_env(settings)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`lab stack down` is checked last, after every test that uses the session stack."""
    items.sort(key=lambda item: item.path.name == "test_zz_stack_down.py")
