"""The pipeline contract: what differs between the four ways of delivering outbox rows.

A pipeline has two halves that live in different processes:

* :class:`Pipeline`, in the runner: resets its transport before a run (slots, topic, queue),
  holds the readiness gate after the consumers started, starts its CDC source (Debezium) if it
  has one, gives the reader of its broker's backlog (:class:`BacklogReader`) and tears everything
  down afterwards. What it is (its :class:`Capabilities`) is declared on its class, read before a
  run builds one.
* :class:`Source`, in each consumer process: fills a batch from the transport, claims it in
  the inbox, and acknowledges positions. The consumer loop around it (work call, counters,
  stop) is the same for every pipeline and lives in :mod:`lab.consumer`.

Example (what the runner does)::

    pipeline = PIPELINES["wal"](scenario, settings, stack)
    await pipeline.prepare()
    ...start N consumer processes...
    await pipeline.wait_ready()
    await pipeline.start_source()
    ...senders, window, drain...
    await pipeline.teardown()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import orjson
import psycopg

from lab.workload.inbox import claim_ids

if TYPE_CHECKING:
    from lab.scenario import Scenario
    from lab.settings import Settings
    from lab.stack.base import Stack


@dataclass(slots=True)
class Item:
    """One message inside a consumer: its id and payload, and its transport position."""

    id: int
    content: str
    created_at: str  # ISO-8601, as the work call sends it
    pos: Any  # LSN (int), Kafka message, AMQP delivery tag


class SharedResources:
    """What the consumers of one process share in the ``tasks`` layout (e.g. one AMQP connection).

    ``get(key, factory)`` opens a resource once (the first caller's ``factory``; concurrent
    callers await the same opening), and ``close`` closes every opened one; never raises.
    """

    def __init__(self) -> None:
        self._opened: dict[str, asyncio.Task[Any]] = {}

    async def get(self, key: str, factory: Callable[[], Awaitable[Any]]) -> Any:
        task = self._opened.get(key)
        if task is None:
            task = self._opened[key] = asyncio.ensure_future(factory())
        return await task

    async def close(self) -> None:
        for task in self._opened.values():
            with contextlib.suppress(Exception):
                resource = await task
                await resource.close()
        self._opened.clear()


class Source(Protocol):
    """One consumer's end of the transport (in the consumer process)."""

    skipped: int  # claim lost to another consumer (acked at once)
    db_ops: int  # claim statements
    decoded_bytes: int  # transport bytes this consumer decoded

    async def open(self) -> None:
        """Connect and subscribe; return once reads have started (a slot is active only then)."""

    async def fill(self, max_items: int, first_wait: float, flush_wait: float) -> list[Item]:
        """Up to ``max_items``: wait ``first_wait`` for the first, ``flush_wait`` to top up.

        Returns an empty list on a timeout with nothing read; a pending read survives.
        """

    async def claim(self, batch: list[Item]) -> list[Item]:
        """One claim statement; returns the claimed items, acks and counts the lost ones."""

    def done(self, item: Item) -> None:
        """The work for ``item`` succeeded: acknowledge its position (through a watermark)."""

    async def idle(self) -> None:
        """Nothing is pending: flush acknowledgements (e.g. a standby status update)."""

    async def close(self) -> None:
        """Release everything; never raises."""


@dataclass(frozen=True)
class Capabilities:
    """What a pipeline is, declared once on its class and read before a run builds one: by the runner,
    the faults (where a fault applies), the study (which side of the question a pipeline is on) and
    :func:`lab.pipelines.check`. Never decided from a pipeline's name. A pipeline states only what
    differs from these defaults (a broker-less competing-consumer design with no slot of its own)."""

    fan_out: bool = False  # every consumer sees every row (skipped = (N-1)·M)
    inbox_table: str = "inbox"  # "inbox" (claimed by message id) or "inbox_wal" (by WAL position)
    cdc_sink: str | None = None  # the Debezium sink (lab.stack.base.DEBEZIUM_SINKS) it needs, if any
    broker: str | None = None  # the stack's service its messages wait in (a participant), if any
    consumes_outbox: bool = False  # consumers delete the rows they finished from ``messages`` (poll)
    # processes of the pipeline's own that the runner starts for each run, each measured as a
    # participant of its own: participant name -> module run as ``python -m <module> --run-dir DIR
    # --scenario JSON`` (it writes ``<name>.ready`` once it serves, ``<name>.json`` at its end); it
    # reconnects by itself when PostgreSQL goes away (a restart, a failover): one that exits fails the run
    helpers: Mapping[str, str] = field(default_factory=dict)
    consumer_slots: bool = False  # consumer i reads its own logical slot (lab.pipelines.wal.slot_name(i))
    # the one slot a helper streams for every consumer (a walsender fault's target, held again
    # after PostgreSQL's restart or failover), or None
    helper_slot: str | None = None
    # None: the faults apply as their own rules say; a text: why this pipeline has no fault runs
    fault_refusal: str | None = None
    # None: ``producer="direct"`` (the broker-native stand) writes into its broker, or its table
    # without one; a text: why it has no such stand
    stand_refusal: str | None = None
    # how long a record handed to a consumer that stopped answering may stay out of the others'
    # reach before the broker hands it out again (a share group's acquisition lock; 0: no such
    # hold): a fault run's drain waits this much longer for work before it counts the rest lost
    redelivery_s: float = 0.0

    @property
    def participants(self) -> tuple[str, ...]:
        """The participants of its own beside the stack's services and the run's processes: its helpers."""
        return tuple(self.helpers)

    @property
    def stand_target(self) -> str:
        """Where the broker-native stand's producers write (:mod:`lab.pipelines.producers`' ``--target``)."""
        return self.broker or "pg"


class BacklogReader(Protocol):
    """The broker's backlog of one fault run, read about once a second (:mod:`lab.pipelines.backlog`).

    A sample is ``{"t": monotonic s, "messages": int, ...}``; a reading that failed (the broker is
    restarting) is ``{"t", "error"}``: a gap, never an exception."""

    where: str  # the participant that holds the backlog

    def start(self) -> None:
        """Before the consumers start: a reader with a process of its own starts it now."""

    def pids(self) -> list[int]:
        """Its live processes (moved into the runner's cgroup at the gate: their CPU is the runner's)."""

    async def read(self) -> list[dict[str, Any]]:
        """The samples since the last call."""

    def close(self) -> None:
        """Release what it holds without awaiting (the run's cleanup); never raises."""

    async def aclose(self) -> None:
        """Release what it holds; never raises."""


class Pipeline(Protocol):
    """The runner's half of a pipeline."""

    name: ClassVar[str]  # the CLI value, the result field and the legend label
    capabilities: ClassVar[Capabilities]

    def describe(self) -> dict[str, Any]:
        """The pipeline's settings, echoed into run.json."""

    async def prepare(self) -> None:
        """Reset the transport before consumers start (drop slots, recreate topic or queue)."""

    async def wait_ready(self) -> None:
        """Readiness gate after the consumers started; raises on timeout."""

    async def start_source(self) -> None:
        """Start the CDC source and wait until it streams (no-op for direct readers)."""

    async def teardown(self) -> None:
        """Stop the source, drop slots, delete the topic or queue; never raises."""

    def backlog(self, scratch: Path) -> BacklogReader | None:
        """The reader of its broker's backlog during a fault run, once :meth:`prepare` made the
        transport (``scratch``: the run's scratch dir); None without a broker."""


class PipelineFactory(Protocol):
    """The one constructor shape of a pipeline's runner half (its class), and what it declares
    before a run builds one (its name and :class:`Capabilities`)."""

    @property
    def name(self) -> str: ...
    @property
    def capabilities(self) -> Capabilities: ...

    def __call__(self, scenario: Scenario, settings: Settings, stack: Stack) -> Pipeline: ...


class SourceFactory(Protocol):
    """The one constructor shape of a pipeline's consumer half (its class): consumer ``index``,
    the run's scratch directory ``run_dir`` and what the consumers of one process share
    (``shared``, ``tasks`` layout); a source ignores what it does not use."""

    def __call__(
        self, scenario: Scenario, settings: Settings, index: int, *,
        run_dir: Path | None = None, shared: SharedResources | None = None,
    ) -> Source: ...


# Shared by the broker pipelines (kafka, rabbitmq) -------------------------------------------
Row = tuple[int, str, str]  # id, content, created_at


def envelope_row(value: bytes) -> Row | None:
    """The row of a Debezium JSON envelope (no SMT); None unless it is an
    insert (``op`` ``c``): deletes, updates and heartbeats are acknowledged without work."""
    envelope = orjson.loads(value)
    after = envelope.get("after")
    if after is None or envelope.get("op") != "c":
        return None
    return after["id"], after["content"], after["created_at"]


def plain_row(value: bytes) -> Row:
    """A message the broker-native producer (:mod:`lab.pipelines.producers`) wrote."""
    m = orjson.loads(value)
    return m["id"], m["content"], m["createdAt"]


def row_parser(producer: str) -> Callable[[bytes], Row | None]:
    """The parser a consumer's read loop calls, chosen once from ``scenario.producer``."""
    return plain_row if producer == "direct" else envelope_row


TAKEOVER_GRACE_S = 0.5  # a lost takeover claim is tried once more after this (a dying owner's session)


async def claim_batch(conn: psycopg.AsyncConnection[Any], batch: list[Item], me: str,
                      lose: Callable[[Item], None], *, takeover: bool = False) -> tuple[list[Item], int]:
    """One ``inbox`` claim of ``batch`` by message id as ``me``; returns the items won and the
    number of claim statements run.

    Every other item goes to ``lose`` (the caller acknowledges its position), including the
    second copy of an id that appears twice in one batch (a redelivery): one claim never leads
    to two work calls.

    ``takeover`` (:mod:`lab.workload.inbox`; ``me`` is then a claimant with a lease): ids lost to
    another claimant are claimed once more after :data:`TAKEOVER_GRACE_S`. A broker can hand a
    dead consumer's messages to us (RabbitMQ requeues them the moment its connection drops) a
    moment before its database session has ended and let go of its lease; the second try sees
    it gone. Only a batch with a lost claim pays it: none on the happy path.
    """
    ids = [item.id for item in batch]
    won = await claim_ids(conn, ids, me, takeover=takeover)
    statements = 1
    if takeover and len(won) < len(set(ids)):
        await asyncio.sleep(TAKEOVER_GRACE_S)
        won |= await claim_ids(conn, sorted(set(ids) - won), me, takeover=True)
        statements += 1
    mine: list[Item] = []
    for item in batch:
        if item.id in won:
            won.discard(item.id)
            mine.append(item)
        else:
            lose(item)
    return mine, statements
