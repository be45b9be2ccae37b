"""One run's workload: the CLI's options and the notebooks' ``parameters`` cell.

Fields are primitives only (papermill stringifies anything else). Defaults are the reference
bench's (method.md §3, §4.0): 200 closed-loop senders, batches of 100, 100 ms wait for a
batch's first message and 50 ms to top it up, a 600 s drain deadline, ``CHECKPOINT`` plus a
20 s cooldown after every run.

``producer`` picks where messages enter: ``web`` (the study: HTTP senders -> web service ->
outbox row, Debezium for ``kafka``/``rabbitmq``) or ``direct`` (the broker-native stand of
method.md §9.5: ``senders`` producer tasks write straight into the topic, the queue or the table).

``reset`` is what a reused pooled PostgreSQL connection gets before the INSERT: ``discard``
(``DISCARD ALL`` in the same round trip, as Npgsql's pool does; method.md §3) or ``none``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

PIPELINE_NAMES = ("wal", "wal-sharded", "kafka", "rabbitmq")
PRODUCERS = ("web", "direct")
RESETS = ("discard", "none")
CONSUMER_LAYOUTS = ("processes", "tasks")
MAX_CONSUMERS = 60  # max_wal_senders = 64, minus Debezium and headroom (method.md §1.2)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What load a run applies. Validated on construction; errors are one clear line."""

    pipeline: str = "wal"  # wal | wal-sharded | kafka | rabbitmq
    consumers: int = 1  # N consumer processes
    messages: int = 100_000  # M messages sent, the divisor of the metric
    senders: int = 200  # closed-loop HTTP senders
    rate: float = 0.0  # > 0: open-loop sends at this many msg/s (latency mode)
    batch_size: int = 100  # claim batch
    poll_wait_ms: int = 100  # wait for a batch's first message
    flush_wait_ms: int = 50  # wait to top up a non-empty batch
    work_delay_ms: float = 0.0  # extra delay inside /send-email (control experiment)
    ready_timeout_s: float = 120.0  # readiness gates
    drain_timeout_s: float = 600.0  # deadline from readiness to drained
    cooldown_s: float = 20.0  # after CHECKPOINT, before the next run
    warmup: bool = False  # marked as warm-up/drift: kept, excluded from tables
    label: str = ""  # free text (e.g. "drift"), stored with the result
    seed: int = 0  # for anything randomised in a series
    producer: str = "web"  # web: senders -> web -> outbox (+ Debezium) | direct: into the transport
    reset: str = "discard"  # discard: DISCARD ALL pipelined with each INSERT on a reused connection | none
    consumer_layout: str = "processes"  # processes: one OS process per consumer | tasks: N asyncio tasks, one process

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINE_NAMES:
            raise ValueError(
                f"unknown pipeline {self.pipeline!r}: choose one of {', '.join(PIPELINE_NAMES)}"
            )
        if not 1 <= self.consumers <= MAX_CONSUMERS:
            raise ValueError(
                f"consumers must be between 1 and {MAX_CONSUMERS} "
                f"(max_wal_senders=64 leaves room for Debezium), got {self.consumers}"
            )
        if self.producer not in PRODUCERS:
            raise ValueError(
                f"unknown producer {self.producer!r}: choose one of {', '.join(PRODUCERS)}"
            )
        if self.reset not in RESETS:
            raise ValueError(f"unknown reset {self.reset!r}: choose one of {', '.join(RESETS)}")
        if self.consumer_layout not in CONSUMER_LAYOUTS:
            raise ValueError(
                f"unknown consumer_layout {self.consumer_layout!r}: choose one of {', '.join(CONSUMER_LAYOUTS)}"
            )
        if self.producer == "direct" and self.rate:
            raise ValueError("rate needs producer='web': the direct producers are closed-loop only")
        for name in ("messages", "senders", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rate", "poll_wait_ms", "flush_wait_ms", "work_delay_ms", "cooldown_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("ready_timeout_s", "drain_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def as_parameters(self) -> dict[str, Any]:
        """The papermill ``parameters`` for this scenario."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    @property
    def slug(self) -> str:
        mode = f"r{self.rate:g}" if self.rate else f"s{self.senders}"
        tail = "" if self.producer == "web" else f"-{self.producer}"
        return f"{self.pipeline}-c{self.consumers}-m{self.messages}-{mode}{tail}"
