"""The private RabbitMQ node: topology of the reference study, confirms, restart, clean stop.

Publish/consume, idempotent start, status and users run against the session stack's node (the
queue and exchange made here are deleted again). Restart and stop need a node that may be
stopped: one throwaway node of this module (own node name, AMQP, distribution and epmd ports
derived from the session settings, under the session stack dir), stopped and purged even when
a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import psutil
import pytest

from lab.settings import Settings
from lab.stack import proc
from lab.stack.rabbitmq_broker import RabbitMQService

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

EXCHANGE = "test-load-dbz"
ROUTING_KEY = "quorum"
OWN_OFFSET = 100  # the module's throwaway node: session ports + 100


@pytest.fixture(scope="module")
def rabbitmq(stack: object) -> RabbitMQService:
    """The session stack's node (never stopped here)."""
    return stack.rabbitmq  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def own_rabbitmq(stack: object, settings: Settings) -> Iterator[RabbitMQService]:
    """A throwaway node of this module's own; stopped and purged whatever happens."""
    service = RabbitMQService(settings.replace(
        stack_dir=settings.stack_dir / "own-rabbitmq",
        amqp_port=settings.amqp_port + OWN_OFFSET,
        rabbitmq_dist_port=settings.rabbitmq_dist_port + OWN_OFFSET,
        rabbitmq_epmd_port=settings.rabbitmq_epmd_port + OWN_OFFSET,
        rabbitmq_node="own-" + settings.rabbitmq_node,
    ))
    try:
        service.start()
        yield service
    finally:
        service.stop(purge=True)
        shutil.rmtree(service.settings.stack_dir, ignore_errors=True)


async def _delete(url: str, queue: str, exchange: str) -> None:
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)


def _tree(service: RabbitMQService) -> list[psutil.Process]:
    roots = service.processes()
    return [p for root in roots for p in [root, *root.children(recursive=True)]]


def _zombie(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return p.status() == psutil.STATUS_ZOMBIE
    return False


def _ours_alive(service: RabbitMQService, known: list[psutil.Process]) -> list[str]:
    """Known processes still running, plus any beam/epmd started with our HOME or epmd port.

    ``stop`` returns once every process has exited; one that has just exited may still be a
    zombie for a moment until its parent (PID 1 for the VM's orphaned helpers) reaps it, so
    zombies get up to 10 s to disappear before they count as left behind.
    """
    deadline = time.monotonic() + 10
    while any(p.is_running() and _zombie(p) for p in known) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [f"{p.pid} {p.name()}" for p in known if p.is_running()]
    home, port = str(service.home), str(service.settings.rabbitmq_epmd_port)
    for p in psutil.process_iter(["name", "cmdline"]):
        if not (p.info["name"] or "").startswith(("beam", "epmd")):
            continue
        with contextlib.suppress(psutil.Error):
            if home in (p.info["cmdline"] or []) or port in (p.info["cmdline"] or []):
                alive.append(f"{p.pid} {p.info['name']} (found by scan)")
    return alive


async def _declare(channel: aio_pika.abc.AbstractChannel, queue_name: str) -> tuple:
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    queue = await channel.declare_queue(
        queue_name, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await queue.bind(exchange, routing_key=ROUTING_KEY)
    return exchange, queue


async def _publish(url: str, queue_name: str, bodies: list[bytes]) -> None:
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel(publisher_confirms=True)
        exchange, _ = await _declare(channel, queue_name)
        # with confirms on, each publish returns only once the broker has acked it
        await asyncio.gather(*(
            exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=ROUTING_KEY, mandatory=True,
            )
            for body in bodies
        ))


async def _consume(url: str, queue_name: str, count: int) -> tuple[list[bytes], int]:
    """Consume and ack ``count`` messages; return their bodies and the ready count left."""
    received: list[bytes] = []
    async with await aio_pika.connect(url) as conn:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=1000)
        _, queue = await _declare(channel, queue_name)
        async with asyncio.timeout(60), queue.iterator() as messages:
            async for message in messages:
                assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                received.append(message.body)
                await message.ack()
                if len(received) == count:
                    break
        left = await channel.declare_queue(queue_name, passive=True)
        return received, left.declaration_result.message_count or 0


def test_quorum_queue_publish_with_confirms_and_consume(rabbitmq: RabbitMQService) -> None:
    url = rabbitmq.settings.amqp_url
    bodies = [f"message-{i}".encode() for i in range(100)]
    try:
        asyncio.run(_publish(url, "test-load-dbz-quorum", bodies))
        received, left = asyncio.run(_consume(url, "test-load-dbz-quorum", len(bodies)))
        queues = rabbitmq.ctl("list_queues", "name", "type", "durable", "--formatter", "json")
    finally:
        asyncio.run(_delete(url, "test-load-dbz-quorum", EXCHANGE))
    assert sorted(received) == sorted(bodies)
    assert left == 0
    assert {"name": "test-load-dbz-quorum", "type": "quorum", "durable": True} in json.loads(queues)
    after = json.loads(rabbitmq.ctl("list_queues", "name", "--formatter", "json"))
    assert {"name": "test-load-dbz-quorum"} not in after  # the shared node is left as it was


def test_start_twice_is_a_noop(rabbitmq: RabbitMQService) -> None:
    before = {(p.pid, p.create_time()) for p in _tree(rabbitmq)}
    rabbitmq.start()
    after = {(p.pid, p.create_time()) for p in _tree(rabbitmq)}
    assert before == after


def test_status_and_processes(rabbitmq: RabbitMQService) -> None:
    s = rabbitmq.settings
    status = rabbitmq.status()
    assert status.state == "running"
    assert status.endpoint == f"amqp://{s.rabbitmq_user}@127.0.0.1:{s.amqp_port}/"
    assert s.secret("rabbitmq") not in status.endpoint
    assert status.version.split(".")[0] in {"3", "4"}
    assert status.rss_mb and status.rss_mb > 20
    names = [p.name() for p in _tree(rabbitmq)]
    assert "beam.smp" in names and "epmd" in names
    for port in (s.amqp_port, s.rabbitmq_dist_port, s.rabbitmq_epmd_port):
        assert proc.port_open(port)
    node = json.loads(rabbitmq.ctl("status", "--formatter", "json"))
    assert any(lst.get("port") == s.amqp_port and lst.get("interface") == "127.0.0.1"
               for lst in node["listeners"])


def test_only_the_lab_user_exists(rabbitmq: RabbitMQService) -> None:
    users = json.loads(rabbitmq.ctl("list_users", "--formatter", "json"))
    assert users == [{"user": rabbitmq.settings.rabbitmq_user, "tags": ["administrator"]}]
    perms = json.loads(rabbitmq.ctl("list_permissions", "-p", "/", "--formatter", "json"))
    assert perms == [{"user": rabbitmq.settings.rabbitmq_user,
                      "configure": ".*", "write": ".*", "read": ".*"}]


def test_persistent_messages_survive_a_restart(own_rabbitmq: RabbitMQService) -> None:
    rabbitmq = own_rabbitmq
    url = rabbitmq.settings.amqp_url
    bodies = [f"durable-{i}".encode() for i in range(10)]
    asyncio.run(_publish(url, "test-restart-quorum", bodies))
    known = _tree(rabbitmq)
    rabbitmq.stop()
    assert _ours_alive(rabbitmq, known) == []
    assert not proc.port_open(rabbitmq.settings.amqp_port)
    rabbitmq.start()  # warm: existing data dir
    log.info("warm start took %s s", rabbitmq.last_start_seconds)
    received, left = asyncio.run(_consume(url, "test-restart-quorum", len(bodies)))
    assert sorted(received) == sorted(bodies) and left == 0


def test_stop_leaves_no_process_of_ours(own_rabbitmq: RabbitMQService) -> None:
    rabbitmq = own_rabbitmq
    rabbitmq.start()  # no-op unless an earlier test of this module left it stopped
    known = _tree(rabbitmq)
    assert known
    rabbitmq.stop()
    assert _ours_alive(rabbitmq, known) == []
    assert rabbitmq.processes() == []
    assert rabbitmq.status().state == "stopped"
    s = rabbitmq.settings
    for port in (s.amqp_port, s.rabbitmq_dist_port, s.rabbitmq_epmd_port):
        assert not proc.port_open(port)
    assert rabbitmq.mnesia.exists()  # stop without purge keeps the data


def test_default_node_is_debian_13s_4_0_from_the_lab_root(rabbitmq: RabbitMQService) -> None:
    """RabbitMQ 4.0 runs from the cache's Debian 13 root; its mounts never reach the host."""
    assert rabbitmq.settings.rabbitmq_version == "4.0"
    assert rabbitmq.root is not None and rabbitmq.root.is_relative_to(rabbitmq.settings.cache_dir)
    assert rabbitmq.status().version.startswith("4.0.")
    beam = next(p for p in _tree(rabbitmq) if p.name() == "beam.smp")
    assert Path(f"/proc/{beam.pid}/root").resolve() == rabbitmq.root.resolve()
    assert str(rabbitmq.root) not in Path("/proc/self/mounts").read_text()


# a further cell: RabbitMQ 4 is every other test's broker; 3.10's choice and provisioning path are
# unit-tested (tests/unit/stack/test_without_root.py)
@pytest.mark.matrix
def test_debian_12s_3_10_stays_selectable(stack: object, settings: Settings) -> None:
    service = RabbitMQService(settings.replace(
        stack_dir=settings.stack_dir / "rabbitmq-3.10",
        amqp_port=settings.amqp_port + OWN_OFFSET + 10,
        rabbitmq_dist_port=settings.rabbitmq_dist_port + OWN_OFFSET + 10,
        rabbitmq_epmd_port=settings.rabbitmq_epmd_port + OWN_OFFSET + 10,
        rabbitmq_node="old-" + settings.rabbitmq_node,
        rabbitmq_version="3.10",
    ))
    try:
        service.start()
        assert service.root is None and service.status().version.startswith("3.10.")
        assert Path(f"/proc/{service.processes()[0].pid}/root").resolve() == Path("/")
        known = _tree(service)
        service.stop()
        assert _ours_alive(service, known) == []
    finally:
        service.stop(purge=True)
        shutil.rmtree(service.settings.stack_dir, ignore_errors=True)
