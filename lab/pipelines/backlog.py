"""The brokers' backlog readers of ``kafka`` and ``rabbitmq`` (:class:`lab.pipelines.base.BacklogReader`):
a fault run's backlog, about once a second; each pipeline gives its own (``Pipeline.backlog``,
``kafka-share``'s is :mod:`lab.pipelines.share_lag`), the runner samples it.

* **Kafka**: Σ over the topic's 2N partitions of (log end offset − the run's group's committed
  offset; the log start offset when the group committed none), what ``kafka-consumer-groups``
  calls the group's lag. The consumers commit their stored offsets on librdkafka's 5 s timer
  (``auto.commit.interval.ms``), so this lag also holds up to 5 s of messages that were worked but
  not yet committed: a sawtooth under steady load. The true per-consumer lag comes from the
  arrivals (:mod:`lab.measure.recovery`). Read by a child process
  (``python -m lab.pipelines.backlog``) with a dedicated consumer that never subscribes (no group
  membership, no rebalance; ``committed`` and ``get_watermark_offsets`` with ``cached=False``, one
  OffsetFetch and 2N ListOffsets requests a sample). A child because librdkafka once aborted a
  whole process (SIGABRT in ``AdminClient.list_topics``) while a broker restarted: an abort here
  costs a gap, and the reader starts the child again. The runner starts it before the consumers
  (:meth:`lab.runner.fault_sampling.FaultSampling.prepare`: Python and librdkafka take seconds to start on
  a loaded machine) and moves it into the runner's cgroup at the gate: its CPU is the runner's.
* **RabbitMQ**: the quorum queue's messages ready + unacknowledged (delivered to a consumer, not
  yet acked: a stopped consumer's prefetch). The node runs no management plugin (it would add a
  statistics collector to the measured broker) and ``rabbitmqctl list_queues`` boots an Erlang VM
  per call (about 1 s of CPU) and reports quorum queues from metrics their leader publishes every
  5 s. The lab asks the queue's Raft leader instead, with ``erl_call`` (a small C program of
  Erlang's ``erl_interface``: one distribution connection, one ``ra:local_query`` for ready and one
  for checked out, no VM). Where that is not available (no ``erl_call``, the compose backend) it
  falls back to a passive ``queue.declare``, whose ``message_count`` is ready only
  (``"unacked": None`` in the sample says so).

A sample is ``{"t": monotonic s, "messages": int, ...}``; a reading that failed (the broker is
restarting) is ``{"t", "error"}``: a gap, never an exception.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

from lab.stack import children
from lab.stack.base import ErlCall

log = logging.getLogger(__name__)
SAMPLE_S = 1.0
ERL_CALL_TIMEOUT_S = 2.0
ERL_CALL_TRIES = 3  # erl_call failed this often while the broker answered: ready messages only
RESTARTS = 20  # Kafka: children started again after an exit, at most
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_ERL_RESULT = re.compile(rb"\{ok,\s*\{(\d+),\s*(\d+)\}\}")


# Kafka -----------------------------------------------------------------------------------------
def kafka_lag(consumer: Any, topic: str, partitions: int, timeout: float) -> int:
    """Σ (log end offset − committed offset) over ``partitions`` partitions of ``topic`` (raises
    ``KafkaException`` when the broker does not answer within ``timeout`` a request)."""
    from confluent_kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    total = 0
    for tp in consumer.committed(tps, timeout=timeout):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout,
                                                   cached=False)
        total += max(0, high - (tp.offset if tp.offset >= 0 else low))
    return total


def _kafka_child(a: argparse.Namespace) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": a.bootstrap, "group.id": a.group, "enable.auto.commit": False,
                         "logger": log})
    due = time.monotonic()
    with open(a.out, "a", buffering=1) as out:
        while True:
            t = time.monotonic()
            try:
                line: dict[str, Any] = {"t": t, "messages": kafka_lag(consumer, a.topic, a.partitions, a.interval)}
            except Exception as exc:  # KafkaException on a timeout: a gap, never an exit
                line = {"t": t, "error": f"{type(exc).__name__}: {exc}"[:200]}
            out.write(json.dumps(line) + "\n")
            due = max(due + a.interval, time.monotonic())
            time.sleep(max(0.0, due - time.monotonic()))


class KafkaBacklog:
    """The run's group's lag, sampled by a child process that writes one JSON line a sample."""

    where = "kafka"

    def __init__(self, settings: Any, topic: str, group: str | None, partitions: int, scratch: Path) -> None:
        self.settings, self.topic, self.group, self.partitions = settings, topic, group, partitions
        self.out = scratch / "backlog-kafka.jsonl"
        self.log = scratch / "backlog-kafka.log"
        self.procs: list[Any] = []
        self.restarts = 0
        self._offset = 0

    def start(self) -> None:
        """Start the sampling child (before the gate: it takes seconds to start on a loaded machine)."""
        if not self.procs:
            self._spawn()

    def pids(self) -> list[int]:
        """The live sampling child's pid (to move it into the runner's cgroup)."""
        return [p.pid for p in self.procs if p.poll() is None]

    def _spawn(self) -> None:
        argv = [sys.executable, "-m", "lab.pipelines.backlog", "--bootstrap", self.settings.kafka_bootstrap,
                "--topic", self.topic, "--group", str(self.group), "--partitions", str(self.partitions),
                "--interval", str(SAMPLE_S), "--out", str(self.out)]
        # on the loop's thread, like the consumers: it dies with the runner
        self.procs.append(children.spawn(self.settings, "backlog", argv, log_path=self.log,
                                         cwd=self.settings.root))

    async def read(self) -> list[dict[str, Any]]:
        """The samples written since the last call; starts the child (again) when it is not running."""
        if not self.procs:
            self._spawn()
        elif self.procs[-1].poll() is not None:
            code = self.procs[-1].returncode
            if self.restarts >= RESTARTS:
                return []
            self.restarts += 1
            log.warning("Kafka backlog sampler exited with %s; starting it again", code)
            self._spawn()
            return [{"t": time.monotonic(), "error": f"sampler exited with {code}"}]
        try:
            with open(self.out, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def close(self) -> None:
        """Stop the child (never raises)."""
        with contextlib.suppress(Exception):
            alive = [p for p in self.procs if p.poll() is None]
            for p in alive:
                p.kill()
            children.stop(alive, timeout=0)
            children.forget(self.settings, self.procs)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


# RabbitMQ --------------------------------------------------------------------------------------
def queue_expression(queue: str) -> bytes:
    """The Erlang expression ``erl_call`` evaluates: ``{Ready, CheckedOut}`` of quorum queue ``queue``
    in vhost ``/``, asked of its Raft member on the node."""
    if not _QUEUE_NAME.match(queue):
        raise ValueError(f"unexpected queue name {queue!r}")
    return (
        f'{{ok,Q}}=rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>,queue,<<"{queue}">>)),'
        "L=amqqueue:get_pid(Q),"
        "{ok,{_,R},_}=ra:local_query(L,fun rabbit_fifo:query_messages_ready/1),"
        "{ok,{_,C},_}=ra:local_query(L,fun rabbit_fifo:query_messages_checked_out/1),"
        "{R,C}.\n"
    ).encode()


def parse_erl_call(output: bytes) -> tuple[int, int] | None:
    """``(ready, unacked)`` from ``erl_call``'s ``{ok,{R,C}}``; None for anything else."""
    m = _ERL_RESULT.search(output)
    return (int(m.group(1)), int(m.group(2))) if m else None


class RabbitBacklog:
    """The quorum queue's ready + unacknowledged messages (module docstring)."""

    where = "rabbitmq"

    def __init__(self, settings: Any, erl_call: ErlCall | None, queue: str) -> None:
        """``erl_call``: how to evaluate Erlang on the node (:meth:`lab.stack.base.ServiceControl.erl_call`),
        None where the stack cannot (the compose backend, a cluster)."""
        self.settings, self.queue = settings, queue
        self.erl_call = erl_call
        self.erl_call_ok = False  # it answered once: later failures are gaps, not a reason to give up
        self.erl_call_failed = 0  # failures in a row while the broker answered a declare
        self._conn: Any = None
        self._channel: Any = None

    async def read(self) -> list[dict[str, Any]]:
        t = time.monotonic()
        error = "no reading"
        if self.erl_call is not None:
            got, error = await self._erl_call()
            if got is not None:
                self.erl_call_ok = True
                return [{"t": t, "messages": got[0] + got[1], "ready": got[0], "unacked": got[1],
                         "source": "erl_call"}]
        ready, declare_error = await self._declare()
        if ready is None:
            return [{"t": t, "error": declare_error or error}]
        if self.erl_call is not None and not self.erl_call_ok:  # the broker answers, erl_call does not
            self.erl_call_failed += 1
            if self.erl_call_failed >= ERL_CALL_TRIES:
                log.warning("RabbitMQ backlog: erl_call does not work here (%s): ready messages only", error)
                self.erl_call = None
        return [{"t": t, "messages": ready, "ready": ready, "unacked": None, "source": "declare"}]

    def start(self) -> None:
        """Nothing to start: each reading is one ``erl_call`` (or declare) from the runner."""

    def pids(self) -> list[int]:
        return []

    async def _erl_call(self) -> tuple[tuple[int, int] | None, str]:
        assert self.erl_call is not None  # only called when the service has erl_call
        argv, env = self.erl_call
        try:
            p = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                     stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.STDOUT, env=env)
        except OSError as exc:
            return None, str(exc)
        try:
            async with asyncio.timeout(ERL_CALL_TIMEOUT_S):  # not wait_for: on 3.11 it can swallow a cancel
                out, _ = await p.communicate(queue_expression(self.queue))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
            return None, f"erl_call: no answer within {ERL_CALL_TIMEOUT_S:.0f} s"
        got = parse_erl_call(out)
        return got, "" if got else "erl_call: " + " ".join(out.decode(errors="replace").split())[:200]

    async def _declare(self) -> tuple[int | None, str]:
        import aio_pika

        try:
            if self._conn is None or self._conn.is_closed:
                async with asyncio.timeout(ERL_CALL_TIMEOUT_S):
                    self._conn = await aio_pika.connect(self.settings.amqp_url)
                self._channel = await self._conn.channel()
            async with asyncio.timeout(ERL_CALL_TIMEOUT_S):
                queue = await self._channel.declare_queue(self.queue, passive=True)
            return int(queue.declaration_result.message_count), ""
        except Exception as exc:  # the broker restarts: a gap; reconnect next time
            await self._drop()
            return None, f"{type(exc).__name__}: {exc}"[:200]

    async def _drop(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(ERL_CALL_TIMEOUT_S):
                    await conn.close()

    def close(self) -> None:
        """Forget the AMQP connection (its loop closes the transport); never raises."""
        self._conn, self._channel = None, None

    async def aclose(self) -> None:
        """Close the AMQP connection; never raises."""
        await self._drop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Kafka backlog sampler of a fault run (lab.pipelines.backlog)")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--interval", type=float, default=SAMPLE_S)
    p.add_argument("--out", type=Path, required=True)
    _kafka_child(p.parse_args(argv))


if __name__ == "__main__":
    main()
