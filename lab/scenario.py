"""One run's workload: the CLI's options and the notebooks' ``parameters`` cell.

Fields are primitives only (papermill stringifies anything else). Defaults are the reference
bench's: 200 closed-loop senders, batches of 100, 100 ms wait for a
batch's first message and 50 ms to top it up, a 600 s drain deadline, ``CHECKPOINT`` plus a
20 s cooldown after every run.

``producer`` picks where messages enter: ``web`` (the study: HTTP senders -> web service ->
outbox row, Debezium for ``kafka``/``rabbitmq``) or ``direct`` (the broker-native stand of
the reference study: ``senders`` producer tasks write straight into the topic, the queue or the table).

``reset`` is what a reused pooled PostgreSQL connection gets before the INSERT: ``discard``
(``DISCARD ALL`` in the same round trip, as Npgsql's pool does) or ``none``.

``fault`` injects one fault into the run, ``KIND[=AMOUNT][:TARGET]@START[+DURATION]``, times
in ``s`` or ``ms`` (a bare number is seconds), START counted from the senders' gate, e.g.
``consumer-kill:1@10s`` or ``sink-outage@5s+3s``. This layer reads only that shared grammar
(:func:`parse_fault`); the kinds, what each makes of its amount, target and duration, and where it
applies are :mod:`lab.faults`'s (one module per kind; docs/faults.md), checked by
:func:`lab.faults.check` before a run starts. Likewise ``pipeline`` is any name here: which names
are registered and what each pipeline takes is :mod:`lab.pipelines`'s, checked by
:func:`lab.pipelines.check`.

A fault run needs ``producer="web"`` and one process per consumer: ``consumer_layout="auto"`` (the
default) gives it that, ``tasks`` is refused.

``consumer_layout``: ``tasks`` runs the N consumers as asyncio tasks of one process (one shared AMQP
connection for RabbitMQ), as the reference did; ``processes`` one OS process each (per-consumer CPU
and RSS, and what a fault needs); ``auto`` (the default) is ``tasks``, or ``processes`` when a
fault is injected (:attr:`Scenario.layout`).

``rate_steps`` is a load **staircase**: ``"R1,R2,..."`` (strictly increasing msg/s, a
string because fields are primitives), each rate held open-loop for ``step_s`` seconds (default
20 s). Step i sends ``round(Ri * step_s)`` messages, message j of it due at
``gate + i * step_s + j / Ri``; ``messages`` is then derived (the sum over the steps: a given value
is replaced) and ``rate`` must stay 0. What a step measures and when it is sustainable:
:mod:`lab.measure.staircase`.

``warm_s`` > 0 puts a **warm phase** before the staircase's first step (a staircase only; default 0:
none): the senders send at the staircase's top rate for ``warm_s`` seconds (``round(top * warm_s)``
messages, :func:`warm_plan`), then rest :func:`warm_rest_s` seconds, so that the JVM (Debezium) has
compiled its hot paths before the first step is measured; the steps' offsets move by ``warm_s`` plus
that rest (:func:`step_plan`). The warm messages are messages of the run (``messages`` counts them)
but of no step.

``claim`` is how a broker consumer claims a message in ``inbox`` (:mod:`lab.workload.inbox`):
``owner``, the reference's statement (a row belongs to a consumer name; only that name gets it
back), or ``takeover`` (a row whose claimant's database session is gone may be claimed by a live
consumer: at-least-once when a broker hands a dead consumer's messages to another one). The WAL
readers claim by slot either way (a slot streams to one reader at a time).

``claim_retention`` is how long the direct readers' claims stay in ``inbox_wal`` (the pipelines that
claim there; :func:`lab.pipelines.check` refuses it elsewhere): ``never``, the reference study's
(the table grows by one row per message, autovacuum off), or ``behind-slots`` (a pruner deletes the
claims no reader can meet again, those behind every slot's ``restart_lsn``, and vacuums the table:
:mod:`lab.workload.retention`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

PRODUCERS = ("web", "direct")
RESETS = ("discard", "none")
CONSUMER_LAYOUTS = ("auto", "tasks", "processes")
CLAIMS = ("owner", "takeover")  # lab.workload.inbox.CLAIMS
CLAIM_RETENTIONS = ("never", "behind-slots")  # lab.workload.retention.RETENTIONS
MAX_CONSUMERS = 60  # max_wal_senders = 64, minus Debezium and headroom
BROKER_NODES = 3  # the ha topology's nodes per broker (lab.settings.Settings.kafka_nodes)
_FAULT = re.compile(r"(?P<kind>[a-z-]+)(?:=(?P<amount>[^:@]+))?(?::(?P<target>\d+))?@(?P<start>[^+]+)"
                    r"(?:\+(?P<duration>.+))?")
_TIME = re.compile(r"(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|s)?")
FAULT_GRAMMAR = "KIND[:TARGET]@START[+DURATION], e.g. consumer-kill:1@10s or sink-outage@5s+3s"
DAY_S = 86_400.0
#: the largest value of each float field: a run must end (a cooldown of a year holds the stack's
#: lock as surely as one of ``inf``); the CLI's options carry the same bounds (lab.cli.options.SCENARIO_NUMBERS)
FLOAT_LIMITS = {"rate": 1e7, "work_delay_ms": 3_600_000.0, "ready_timeout_s": DAY_S, "drain_timeout_s": 7 * DAY_S,
                "cooldown_s": DAY_S, "step_s": 3600.0, "warm_s": 3600.0}
#: the rest after a warm phase: WARM_REST_FACTOR times the warm phase, at least WARM_REST_MIN_S. A
#: pipeline that carries at least 1 / (1 + WARM_REST_FACTOR) of the top rate clears the backlog the
#: warm phase left within it ((R - X)·warm / X ≤ 2·warm for X ≥ R/3); the minimum lets the last warm
#: messages through a pipeline that kept up (two seconds, the lag criterion's allowance)
WARM_REST_FACTOR = 2.0
WARM_REST_MIN_S = 2.0


@dataclass(frozen=True)
class FaultSpec:
    """The generic parse of ``Scenario.fault``, ``KIND[=AMOUNT][:TARGET]@START[+DURATION]``: what
    every fault's text shares. What a kind makes of it (its amount, whether it takes a target or a
    duration, where it applies) is :mod:`lab.faults`'s, which this layer does not know."""

    text: str  # as written
    kind: str
    amount: str | None  # after '=', unparsed
    target: int | None
    start_s: float
    duration_s: float | None  # None: no +DURATION written


def seconds(text: str, what: str, spec: str) -> float:
    """``10s``, ``2.5s``, ``500ms`` or a bare number of seconds; ValueError naming ``what`` of ``spec``."""
    m = _TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"fault {spec!r}: {what} {text!r} is not a time like 10s, 2.5s or 500ms")
    value = float(m["value"])
    return value / 1000 if m["unit"] == "ms" else value


def parse_fault(spec: str) -> FaultSpec:
    """``KIND[=AMOUNT][:TARGET]@START[+DURATION]`` -> :class:`FaultSpec`; ValueError with one clear line."""
    m = _FAULT.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"fault {spec!r} does not read as {FAULT_GRAMMAR}")
    target = int(m["target"]) if m["target"] is not None else None
    start = seconds(m["start"], "START", spec)
    duration = seconds(m["duration"], "DURATION", spec) if m["duration"] is not None else None
    return FaultSpec(spec, m["kind"], m["amount"], target, start, duration)


def parse_rate_steps(text: str) -> tuple[float, ...]:
    """``"200,400,800"`` -> ``(200.0, 400.0, 800.0)``; ValueError with one clear line unless every
    rate is a positive number and they increase strictly."""
    parts = [p.strip() for p in text.split(",")]
    try:
        rates = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError(f"rate_steps {text!r} is not a comma-separated list of msg/s like 200,400,800") from None
    if not all(math.isfinite(r) and r > 0 for r in rates):
        raise ValueError(f"rate_steps {text!r}: every rate must be a positive finite number of msg/s")
    if any(b <= a for a, b in itertools.pairwise(rates)):
        raise ValueError(f"rate_steps {text!r}: the rates must increase strictly (a staircase up)")
    return rates


def warm_rest_s(warm_s: float) -> float:
    """Seconds between a warm phase's end and the first step (0 without one): ``max(WARM_REST_MIN_S,
    WARM_REST_FACTOR * warm_s)``."""
    return max(WARM_REST_MIN_S, WARM_REST_FACTOR * warm_s) if warm_s > 0 else 0.0


def warm_plan(rates: tuple[float, ...], warm_s: float) -> list[tuple[float, float, int]]:
    """The warm phase as one ``(rate, offset_s, messages)`` entry at the top rate from the gate
    (``round(top * warm_s)`` messages, at least 1); empty when ``warm_s`` is 0."""
    if warm_s <= 0:
        return []
    return [(rates[-1], 0.0, max(1, round(rates[-1] * warm_s)))]


def step_plan(rates: tuple[float, ...], step_s: float, warm_s: float = 0.0) -> list[tuple[float, float, int]]:
    """The staircase's schedule: ``(rate, offset_s from the gate, messages)`` per step; a step
    sends ``round(rate * step_s)`` messages (at least 1), message j due at ``offset + j / rate``.
    After a warm phase (``warm_s`` > 0) the first step starts at ``warm_s + warm_rest_s(warm_s)``."""
    lead = warm_s + warm_rest_s(warm_s) if warm_s > 0 else 0.0
    return [(r, lead + i * step_s, max(1, round(r * step_s))) for i, r in enumerate(rates)]


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What load a run applies. Validated on construction; errors are one clear line."""

    pipeline: str = "wal"  # a registered pipeline's name (lab.pipelines.REGISTRY; lab.pipelines.check)
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
    # auto: tasks, or processes with a fault | tasks: N asyncio tasks, one process | processes: one OS process each
    consumer_layout: str = "auto"
    claim: str = "owner"  # inbox claim: owner (the reference's, by consumer name) | takeover (a gone claimant's rows)
    claim_retention: str = "never"  # inbox_wal: never (the reference's) | behind-slots (pruned behind every slot)
    fault: str = ""  # e.g. consumer-kill:1@10s, see lab.scenario; empty: no fault
    rate_steps: str = ""  # "R1,R2,...": a staircase of open-loop rates (messages derived); empty: none
    step_s: float = 20.0  # how long each rate of rate_steps is held
    warm_s: float = 0.0  # rate_steps: seconds at the top rate, then a rest, before the first step; 0: none
    decode_slots: int = 0  # extra slots that decode every change and publish none: the decode cost per slot

    def __post_init__(self) -> None:
        self._check_numbers()
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
        if self.claim not in CLAIMS:
            raise ValueError(f"unknown claim {self.claim!r}: choose one of {', '.join(CLAIMS)}")
        if self.claim_retention not in CLAIM_RETENTIONS:
            raise ValueError(f"unknown claim_retention {self.claim_retention!r}: choose one of "
                             f"{', '.join(CLAIM_RETENTIONS)}")
        if self.producer == "direct" and self.rate:
            raise ValueError("rate needs producer='web': the direct producers are closed-loop only")
        for name in ("messages", "senders", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rate", "poll_wait_ms", "flush_wait_ms", "work_delay_ms", "cooldown_s", "warm_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("ready_timeout_s", "drain_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.decode_slots <= MAX_CONSUMERS - self.consumers:
            raise ValueError(f"decode_slots must be between 0 and {MAX_CONSUMERS - self.consumers} "
                             f"(max_wal_senders=64 is shared with the {self.consumers} reader(s)), "
                             f"got {self.decode_slots}")
        if self.fault:
            parse_fault(self.fault)  # the grammar; what the kind makes of it: lab.faults.check
            if self.producer != "web" or self.layout != "processes":
                raise ValueError("a fault needs producer='web' and consumer_layout='processes' or 'auto' "
                                 "(one OS process per consumer)")
        if self.rate_steps:
            self._derive_staircase()
        elif self.warm_s:
            raise ValueError("warm_s needs rate_steps: it warms a staircase at its top rate")

    def _check_numbers(self) -> None:
        """Every numeric field is a finite number (not a bool, not nan or inf, which a notebook or an
        API caller can pass: ``cooldown_s=inf`` would sleep holding the stack's lock, a nan deadline
        never passes, a nan rate sends at once), each float within :data:`FLOAT_LIMITS`."""
        for f in dataclasses.fields(self):
            if f.type not in ("int", "float"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
            limit = FLOAT_LIMITS.get(f.name)
            if limit is not None and value > limit:
                raise ValueError(f"{f.name} must be at most {limit:g}, got {value!r}")

    def _derive_staircase(self) -> None:
        rates = parse_rate_steps(self.rate_steps)
        if self.rate:
            raise ValueError("rate_steps and rate exclude each other: a staircase sets its own rates")
        if self.producer != "web":
            raise ValueError("rate_steps needs producer='web': the direct producers are closed-loop only")
        if self.fault:
            raise ValueError("rate_steps and fault exclude each other (one experiment per run)")
        if not 1 <= self.step_s <= 3600:
            raise ValueError(f"step_s must be between 1 and 3600 s, got {self.step_s}")
        # frozen: the one derived field is set here, once, from the staircase and its warm phase
        plan = warm_plan(rates, self.warm_s) + step_plan(rates, self.step_s, self.warm_s)
        object.__setattr__(self, "messages", sum(n for _, _, n in plan))

    @property
    def layout(self) -> str:
        """The consumer layout a run uses: ``consumer_layout``, with ``auto`` resolved to ``tasks``
        (as the reference ran its consumers; measured cheaper, docs/benchmarks.md "Consumer
        layout") or to ``processes`` when a fault is injected (it needs one process per consumer)."""
        if self.consumer_layout != "auto":
            return self.consumer_layout
        return "processes" if self.fault else "tasks"

    @property
    def staircase(self) -> list[tuple[float, float, int]]:
        """:func:`step_plan` of ``rate_steps`` after the warm phase (empty without a staircase)."""
        return step_plan(parse_rate_steps(self.rate_steps), self.step_s, self.warm_s) if self.rate_steps else []

    @property
    def warm(self) -> list[tuple[float, float, int]]:
        """:func:`warm_plan` of the staircase: its one entry, or empty (no staircase, or ``warm_s`` 0)."""
        return warm_plan(parse_rate_steps(self.rate_steps), self.warm_s) if self.rate_steps else []

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
        if self.rate_steps:
            rates = parse_rate_steps(self.rate_steps)
            mode = f"steps{rates[0]:g}-{rates[-1]:g}x{self.step_s:g}s"
            if self.warm_s:
                mode += f"-warm{self.warm_s:g}s"
        tail = "" if self.producer == "web" else f"-{self.producer}"
        if self.fault:
            tail += "-" + parse_fault(self.fault).kind
        if self.claim_retention != "never":
            tail += "-" + self.claim_retention
        return f"{self.pipeline}-c{self.consumers}-m{self.messages}-{mode}{tail}"
