"""What each phase of a run returns, passed by value to the next and to the run's record
(:mod:`lab.runner.readings`): frozen, built once by the phase that read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Drained:
    """The drain's end (:class:`lab.runner.drain.Drain`): the senders' result file (``sent``,
    ``send_failed``, the first send's completion, a staircase's ``planned`` and ``steps_sent``, ...)."""

    sent: dict[str, Any]


@dataclass(frozen=True)
class Stopped:
    """What the run's processes left when they stopped (:class:`lab.runner.processes.RunProcesses`):
    each consumer's result file (one per consumer in either layout), each pipeline helper's, and
    the consumers a fault ended on purpose (their errors are not the run's)."""

    consumers: list[dict[str, Any]] = field(default_factory=list)
    helpers: dict[str, Any] = field(default_factory=dict)
    ended: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Settled:
    """Read once the consumers stopped, before anything is dropped (:func:`lab.runner.phases.settle`):
    the WAL each slot decoded (``slots``) and run.json's ``vacuum`` block."""

    slots: dict[str, dict[str, Any]]
    vacuum: dict[str, Any] | None


@dataclass(frozen=True)
class Accounted:
    """A fault run's accounting (:mod:`lab.runner.accounting`) and what it was computed from: the web
    service's arrivals and every outbox row's ``created_at`` (epoch s), for the fault's analysis."""

    accounting: dict[str, Any]
    arrivals: dict[str, Any]
    created_at: dict[int, float]


@dataclass(frozen=True)
class Latency:
    """Every worked message's latency (:func:`lab.runner.phases.measure_latency`): the summaries,
    the wall times of every insert and work call (``flow``, the cost split's regressors) and, for a
    staircase, every row's ``created_at`` and the arrivals."""

    latency_ms: dict[str, Any] | None = None
    latency_from_due_ms: dict[str, Any] | None = None
    flow: tuple[list[float], list[float]] | None = None
    created_at: dict[int, float] | None = None
    arrivals: dict[str, Any] | None = None


@dataclass(frozen=True)
class Checked:
    """The verification (:func:`lab.runner.phases.check`): its counts (``checks``), a fault run's
    accounting and the latency of every worked message."""

    checks: dict[str, Any]
    accounted: Accounted | None
    latency: Latency


@dataclass(frozen=True)
class Finished:
    """A run's end: the record run.json is assembled from (:mod:`lab.runner.assembly`), the sampler's
    timeline (samples.csv) and the signal that ended it early, if one did."""

    record: dict[str, Any]
    samples: list[dict[str, Any]]
    interrupted: str | None
