"""The matrix's plan: its profiles and its cells.

A profile (:data:`PROFILES`) fixes the load (N = 2 consumers, M messages open-loop at a fixed rate,
so that lag and recovery mean something) and the faults' timing; :func:`plan` turns it into one
:class:`~lab.scenario.Scenario` per cell, fault kinds outer and pipelines inner (an interrupted
matrix still compares the architectures on the faults it reached), then a clean cell per pipeline
at the same rate (``baseline``) to price the recovery. Which (pipeline, fault) pairs exist is the
faults' decision (:func:`lab.faults.check`, by each pipeline's capabilities), not this module's: a
cell is planned when its fault applies, and :func:`inapplicable` says why the others were left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab import faults as fault_kinds
from lab.scenario import Scenario
from lab.study.series import available_pipelines

LABEL = "faults"  # every cell's Scenario.label
# the fault kinds a matrix runs, in its order: the telling ones first, the slow ones last
KIND_ORDER = ("consumer-dead", "consumer-kill", "sink-outage", "walsender-kill", "consumer-slow",
              "debezium-kill", "broker-restart", "postgres-restart", "slot-invalidation", "big-transaction")
# kinds of the ha topology only (the failover), run on their own, not in the single matrix
HA_KINDS = ("broker-node-kill", "postgres-failover")
TARGET = 1  # the consumer a targeted fault hits (consumer 0 stays healthy)


@dataclass(frozen=True)
class FaultProfile:
    """How big a fault matrix is: the load of every cell and the faults' timing."""

    name: str
    messages: int
    rate: float  # open-loop msg/s
    start_s: float  # the fault's start after the senders' gate
    duration_s: float  # consumer-dead, sink-outage, consumer-slow
    outage_s: float  # broker-restart, postgres-restart: stopped this long
    big_rows: int  # big-transaction's rows
    cooldown_s: float
    drain_timeout_s: float
    kinds: tuple[str, ...]
    pipelines: tuple[str, ...]  # empty: every registered pipeline
    baseline: bool  # a clean cell per pipeline at the same rate
    description: str
    consumers: int = 2
    slow: str = "20ms"  # consumer-slow's extra work per message

    @property
    def sends_s(self) -> float:
        return self.messages / self.rate


PROFILES: dict[str, FaultProfile] = {p.name: p for p in (
    FaultProfile("smoke", 1400, 200.0, 2.0, 2.0, 1.0, 2000, 0.0, 180.0, ("consumer-dead",),
                 ("wal", "kafka"), False,
                 "tests: wal and kafka x a 2 s dead consumer, 1,400 messages at 200 msg/s "
                 "(2 runs, about a minute)"),
    FaultProfile("quick", 2400, 200.0, 3.0, 4.0, 2.0, 5000, 2.0, 300.0, KIND_ORDER, (), True,
                 "every applicable fault x every pipeline, 2,400 messages at 200 msg/s, faults of 4 s at "
                 "3 s, plus a clean cell per pipeline (72 runs with eight pipelines, about 40-45 min on 2 cores)"),
    FaultProfile("full", 24_000, 200.0, 20.0, 60.0, 30.0, 100_000, 10.0, 900.0, KIND_ORDER, (), True,
                 "as quick with 24,000 messages (2 min of sends) and 60 s faults at 20 s, so WAL "
                 "pinning and its slope show; 100,000-row big transaction (about 1.5-2 h)"),
)}


def profile(name: str) -> FaultProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown fault profile {name!r}: choose one of {', '.join(PROFILES)}") from None


def _t(seconds: float) -> str:
    return f"{seconds:g}s"


def candidates(kind: str, p: FaultProfile) -> list[str]:
    """The specs of ``kind`` under profile ``p``, aimed at consumer :data:`TARGET` first, then
    untargeted: the scenario validation keeps the first it accepts (a kind that takes no target,
    or Debezium's walsender, only parses without)."""
    amount = {"consumer-slow": f"={p.slow}", "big-transaction": f"={p.big_rows}"}.get(kind, "")  # the profile's
    # a fault that must last lasts the profile's duration, one that may (a service's outage) its outage
    lasting = {"required": p.duration_s, "optional": p.outage_s}.get(fault_kinds.FAULTS[kind].lasting)
    tail = f"@{_t(p.start_s)}" + (f"+{_t(lasting)}" if lasting else "")
    return [f"{kind}{amount}:{TARGET}{tail}", f"{kind}{amount}{tail}"]


def _cells(p: FaultProfile, pipelines: Sequence[str]) -> list[tuple[str, str, Scenario | None, str]]:
    """(pipeline, kind, scenario or None, why not) for every kind x pipeline, in the run order."""
    # one process per consumer and the takeover claim in every cell, the clean ones too: a fault
    # needs them, and the clean cell is what a fault cell's CPU is compared with (the defaults,
    # auto layout and the reference's owner claim, would differ there)
    base = Scenario(consumers=p.consumers, messages=p.messages, rate=p.rate, cooldown_s=p.cooldown_s,
                    drain_timeout_s=p.drain_timeout_s, label=LABEL, consumer_layout="processes",
                    claim="takeover")  # at-least-once under every fault (lab.workload.inbox)
    out: list[tuple[str, str, Scenario | None, str]] = []
    for kind in p.kinds:
        for pipe in pipelines:
            why = ""
            for spec in candidates(kind, p):
                try:
                    cell = base.replace(pipeline=pipe, fault=spec)
                    fault_kinds.check(cell)
                    out.append((pipe, kind, cell, ""))
                    break
                except ValueError as exc:
                    why = str(exc)
            else:
                out.append((pipe, kind, None, why))
    if p.baseline:  # last: on a slow day the faults come first
        out += [(pipe, "none", base.replace(pipeline=pipe), "") for pipe in pipelines]
    return out


def _pipelines(p: FaultProfile, pipelines: Sequence[str] | None) -> list[str]:
    pipes = list(pipelines or p.pipelines or available_pipelines())
    if not pipes:
        raise ValueError("no pipeline to run")
    return pipes


def plan(name: str = "quick", *, pipelines: Sequence[str] | None = None) -> list[Scenario]:
    """The cells of profile ``name``: each fault on every pipeline it applies to, then the clean cells."""
    p = profile(name)
    return [s for _, _, s, _ in _cells(p, _pipelines(p, pipelines)) if s is not None]


def inapplicable(name: str = "quick", *, pipelines: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
    """(pipeline, kind, the scenario validation's reason) for every pair :func:`plan` leaves out."""
    p = profile(name)
    return [(pipe, kind, why) for pipe, kind, s, why in _cells(p, _pipelines(p, pipelines)) if s is None]


def default_series_id(name: str, *, pipelines: Sequence[str] | None = None) -> str:
    """``faults-<profile>`` (``-wal+kafka`` for a subset), stable so that running it again resumes it."""
    p = profile(name)
    pipes = _pipelines(p, pipelines)
    return f"faults-{name}" + ("" if pipes == _pipelines(p, None) else "-" + "+".join(pipes))


def cell_label(s: Scenario) -> str:
    return f"{s.pipeline} {s.fault or 'no fault'}"
