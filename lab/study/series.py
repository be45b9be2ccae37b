"""The study as a series of runs: profiles, the plan, and a resumable executor.

A plan is a list of :class:`~lab.scenario.Scenario`: a warm-up run first (kafka c1, marked
``warmup``), then every cell pipeline x N, once per block (a repeat is a block: one whole pass over
the cells, optionally shuffled with a recorded seed, so that a drift of the sitting shows between
blocks instead of hiding inside one cell), then a drift probe (the first measured cell again, marked
``warmup`` with label ``drift``), as in the reference sweep. A profile with a *volume arm* adds, to
its first blocks, the same pipelines at a few N with another message count (label ``volume``,
marked ``warmup`` so that no table pools them with the main cells): the runs from which the fixed
cost per start F is fitted across volumes (:func:`lab.study.crossover.by_volume`). A profile may
also list *variants* (:class:`Variant`): a pipeline under a second condition (``wal`` with its claim
table pruned) or a pipeline at a few N only, each taking its place among the pipelines of a block,
so that in a paired block it runs back to back with the cells it is compared with.

The warm-up is 20 % of M as in the reference, but outside ``smoke`` at least 5,000 messages: at
M = 5,000 a 1,000-message warm-up left the JVMs cold, and the first kafka cell 29 % above the drift probe.

Every run of a series is stored with ``series_id`` (and its position ``series_index``, and for a
run of the blocks its block ``series_block``) in its run.json. Re-running a series skips each cell
that already has a successful run with the same scenario in that series (counting repeats), unless
``force``; so an interrupted series resumes where it stopped, and a failed cell is retried.

Example::

    plan = series.plan("quick", seed=7)
    results = asyncio.run(series.run_series(plan, settings, series_id="quick-s7"))
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from lab.measure.idle import measure_idle
from lab.results import iter_runs, read_idle, write_idle
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.proc import exclusive

log = logging.getLogger(__name__)

ORDER = ("kafka", "rabbitmq", "wal", "wal-sharded")  # the reference sweep's order; the others follow it
REFERENCE_PIPELINES = ORDER  # the four the reference study ran
REFERENCE_WARMUP = ORDER[0]  # the reference warmed up on its sweep's first; a series without it, on its own first
# The reference stopped at 8 and extrapolated the crossover; 12 and 16 measure it.
CONSUMERS = (1, 2, 4, 8, 12, 16)
# The default profile answers the article's question for its four pipelines within half an hour on 2
# cores: 3 N x 4 pipelines x 2 blocks + a volume arm of 2 pipelines x 3 N x 2 blocks = 36 runs, and a
# warm-up and a drift probe. Two runs per cell give the median's [min, max] at 50 % coverage
# (labelled so). N = 1 and 4 are the article's, 16 measures beyond its extrapolated crossover; its N = 8
# is the reference profile's (at the reference volume, where the crossings lie) and `full`'s. With
# N = 8 the quick report took 36.6 minutes on a fresh clone on 2026-12-07 (42 runs, 22.5 minutes of
# series), over its half hour; its 8 runs were the ones cut, not the blocks, the volume or the
# staircases. The volume arm (20,000 messages) gives the fixed cost per start F across volumes. It
# runs the headline's pair, wal and kafka, at every N of both blocks, so F is refitted block by block
# (lab.study.refit.by_block) and its error enters N*; the four pipelines at 3 N in both blocks would be
# 24 runs of 20,000 messages, over the half hour. RabbitMQ's start is fitted where RabbitMQ's question
# is measured, in the reference profile (three volumes); wal-sharded has no start. With this arm, 38
# runs, a fresh clone's `make report` took 24.3 minutes in all on 2026-12-07 (AMD EPYC host, probe
# unit 0.81 ms; 22.7 in `lab report`), against 24.1 with the earlier arm on the same host. The options the
# article never compared are in `decision` (every registered pipeline), which a default series of
# every pipeline would more than double.
QUICK_CONSUMERS = (1, 4, 16)
QUICK_ARM_PIPELINES = ("wal", "kafka")
DECISION_CONSUMERS = (1, 4, 16)
# The article's own sweep: N = 1, 2, 4, 8 once each, in its order
# (kafka, rabbitmq, wal, wal-sharded), a 20,000-message kafka c1 warm-up and a drift probe: 18 runs.
ARTICLE_CONSUMERS = (1, 2, 4, 8)
# The reference volume, measured: the question's three pipelines at 100,000 messages per Debezium
# start (the reference study's volume), in two blocks of paired cells, at N = 1, 4, 8, 16. With
# N = 12 as well the first sitting took 105.5 min on the 2-core machine, over the 90 a quiet sitting
# has; its cells at 12 (9 runs, about 20 min) are the ones cut, not the volume: the crossings lie
# between 1 and 8 (Kafka) and between 8 and 16 (RabbitMQ) in the sittings of 2026-12-06 and -07; its
# 5,000-message arm at every N is the quick profile's volume, so the quick model it checks is the one
# the quick sittings fit. The second block's 20,000-message arm at N = 1, 4 and 16 lets that block
# refit F at three N too: 47 runs, 54.7 min on 2026-12-07 (AMD EPYC host, probe unit 0.85 ms).
REFERENCE_VOLUME_PIPELINES = ("wal", "kafka", "rabbitmq")
REFERENCE_VOLUME_CONSUMERS = (1, 4, 8, 16)
# A slow steady stream, measured: `wal` and `kafka` open loop at 200 msg/s, paired at N = 1, 4, 16, in
# 2 blocks, each run's steady part (lab.measure.steady) as its figure, so no start cost is in it. 10,000
# messages are 50 s of sending: the steady part (20 % inserted to 90 % delivered) is ~35 s, ~70 samples
# at 0.5 s, several times Debezium's JIT warm-up (the first seconds of traffic, left out with the first
# 20 %); 5,000 would leave ~17 s and half the samples, 20,000 would add ~50 s to each of 14 runs.
# 12 measured runs of ~1-1.5 min, a closed-loop warm-up and a drift probe: 14.2 minutes on 2026-12-07 (Intel host).
STEADY_RATE = 200.0
STEADY_PIPELINES = ("wal", "kafka")
STEADY_CONSUMERS = (1, 4, 16)
# Two conditions of the answer at the reference volume, in one sitting: `wal` with its claim table
# never pruned (the reference study's) and pruned behind every slot (lab.workload.retention), each
# against kafka in paired runs, and `poll` at N = 4, where autovacuum of the outbox comes inside a
# 100,000-message run. 3 N x 3 cells + poll at 4 = 10 runs a block, 2 blocks, a 20,000-message
# warm-up and a drift probe: 22 runs, 21 of them at 100,000 messages, measured at 23.8 min on
# 2026-12-07 on a 2-core Intel Xeon host that ran the reference profile in 35.3. Its volume arm,
# wal and kafka at 5,000 messages after the cells at every N of both blocks (12 short runs, 34 in
# all), lets F be refitted block by block (lab.study.refit.by_block); with it, 38.6 min on an AMD
# EPYC host (probe unit 0.89 ms) on 2026-12-07.
CONDITIONS_PIPELINES = ("wal", "kafka")
CONDITIONS_CONSUMERS = (1, 4, 16)


@dataclass(frozen=True)
class Arm:
    """Runs of the profile's pipelines (those of them in ``pipelines``; empty: all) at another
    message count: at ``consumers`` (those of the plan's N), in the blocks numbered ``blocks`` (0 is
    the first). Labelled ``volume`` and marked ``warmup``, so that no table pools them with the main
    cells: they are what the fixed cost per start F is fitted from across volumes, and what the
    model is checked with."""

    messages: int
    consumers: tuple[int, ...]
    blocks: tuple[int, ...] = (0,)
    cooldown_s: float | None = None  # None: the profile's
    pipelines: tuple[str, ...] = ()  # empty: every pipeline of the plan

    def runs(self, pipeline: str) -> bool:
        return not self.pipelines or pipeline in self.pipelines


QUICK_ARM = Arm(20_000, QUICK_CONSUMERS, (0, 1), pipelines=QUICK_ARM_PIPELINES)


@dataclass(frozen=True)
class Variant:
    """A cell of every block beside the profile's pipelines: ``pipeline`` with the Scenario fields
    ``overrides`` changes (field and value pairs, e.g. ``(("claim_retention", "behind-slots"),)``),
    named ``condition`` ("claims pruned"; "" for the plain conditions, e.g. a pipeline measured at a
    few N only), at ``consumers`` (those of the plan's N; empty: every N), placed at ``position``
    among the cells at one N (None: after them), so that it runs next to the cell it is compared
    with. What a run was measured under is read back from its stored scenario
    (:func:`lab.study.sitting.condition`), not from this name."""

    pipeline: str
    condition: str = ""
    overrides: tuple[tuple[str, Any], ...] = ()
    consumers: tuple[int, ...] = ()
    position: int | None = None

    def cell(self, base: Scenario, consumers: int, seed: int) -> Scenario:
        return base.replace(pipeline=self.pipeline, consumers=consumers, seed=seed, **dict(self.overrides))

    def at(self, consumers: int) -> bool:
        return not self.consumers or consumers in self.consumers


def row_at(pipelines: Sequence[str], variants: Sequence[Variant], consumers: int) -> list[Variant]:
    """The cells at one N in their order: the pipelines, then each variant run at that N inserted
    at its position (in the order listed); a variant that repeats a cell already there is left out."""
    row = [Variant(p) for p in pipelines]
    for v in variants:
        if not v.at(consumers):
            continue
        if any((r.pipeline, r.overrides) == (v.pipeline, v.overrides) for r in row):
            continue
        row.insert(len(row) if v.position is None else v.position, v)
    return row


@dataclass(frozen=True)
class Profile:
    """How big a series is. ``quick`` is the default; ``reference`` measures the reference volume."""

    name: str
    messages: int
    senders: int
    consumers: tuple[int, ...]
    cooldown_s: float
    repeats: int
    warmup_messages: int  # the warm-up run's messages; 0: none (smoke, whose numbers are noise anyway)
    description: str
    idle_s: float = 30.0  # idle baseline before the series (lab.measure.idle); 0: none
    seed: int = 0  # shuffle seed when none is given; 0: reference order (1 with repeats > 1)
    arms: tuple[Arm, ...] = ()  # the volume arms (runs at other message counts)
    pipelines: tuple[str, ...] = ()  # the pipelines it runs by default; empty: every registered one
    # paired: a block runs N by N (the N in shuffled order), every pipeline at one N back to back in
    # an order that alternates from one N to the next, the N's arm runs right after them; so two
    # pipelines are compared in adjacent runs, which a machine whose speed drifts within a sitting
    # needs (lab.study.sitting reads the crossing from the pairs). Otherwise a block is shuffled whole.
    paired: bool = False
    rate: float = 0.0  # > 0: its measured cells are open loop at this many msg/s (`--rate` overrides)
    report: bool = True  # False: a series of its own (`lab series`, `lab sitting`), no `lab report`
    # cells beside the pipelines' own (Variant): a second condition, or a pipeline at a few N only
    variants: tuple[Variant, ...] = ()


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("smoke", 300, 20, (1, 2), 0.0, 1, 0,
                "tests: the article's four pipelines in tiny runs and no warm-up, numbers are noise (minutes)",
                idle_s=3.0,
                pipelines=REFERENCE_PIPELINES),
        Profile("quick", 5000, 200, QUICK_CONSUMERS, 5.0, 2, 5000,
                "the article's four pipelines at N = 1, 4, 16, 5,000 messages, in 2 shuffled "
                "blocks, so every cell has an interval; and wal and kafka at 20,000 messages at every N "
                "of both blocks, so the fixed cost per start is fitted across volumes, block by block", seed=1,
                arms=(QUICK_ARM,), pipelines=REFERENCE_PIPELINES),
        Profile("decision", 5000, 200, DECISION_CONSUMERS, 5.0, 2, 5000,
                "every registered pipeline, the article's four and the options it never compared, at "
                "N = 1, 4, 16, 5,000 messages, in 2 shuffled blocks; 20,000 messages at N = 1 and 16 in "
                "the first", seed=1, arms=(Arm(20_000, (1, 16), (0,)),)),
        Profile("reference", 100_000, 200, REFERENCE_VOLUME_CONSUMERS, 20.0, 2, 20_000,
                "wal, kafka and rabbitmq at the reference volume, 100,000 messages per start, N = 1, 4, "
                "8, 16, in 2 blocks of paired cells (the pipelines at one N back to back); in the "
                "first block 5,000 messages at every N and in the second 20,000 at N = 1, 4 and 16, from "
                "which the quick model predicts every 100,000-message cell", seed=1,
                # the arm's runs are the quick model's: they rest as long as the quick profile's (5 s)
                arms=(Arm(5_000, REFERENCE_VOLUME_CONSUMERS, (0,), 5.0), Arm(20_000, (1, 4, 16), (1,), 5.0)),
                pipelines=REFERENCE_VOLUME_PIPELINES, paired=True),
        Profile("conditions", 100_000, 200, CONDITIONS_CONSUMERS, 20.0, 2, 20_000,
                "two conditions of the answer at the reference volume, 100,000 messages per start: wal "
                "with its claim table never pruned and pruned behind every slot, each paired with kafka "
                "at N = 1, 4, 16, and poll at N = 4 (autovacuum inside the run), in 2 blocks of paired "
                "cells; wal and kafka at 5,000 messages at every N of both blocks, so F is refitted block by "
                "block; 34 runs, 39 min on a 2-core AMD EPYC host; `lab series` and `lab sitting` only", seed=1,
                pipelines=CONDITIONS_PIPELINES, paired=True, report=False,
                # F refitted block by block: wal and kafka at 5,000 messages at every N of both blocks
                arms=(Arm(5_000, CONDITIONS_CONSUMERS, (0, 1), 5.0),),
                # wal, kafka, wal pruned: kafka next to both; poll first at N = 4, next to plain wal
                variants=(Variant("wal", "claims pruned", (("claim_retention", "behind-slots"),)),
                          Variant("poll", consumers=(4,), position=0))),
        Profile("full", 100_000, 200, CONSUMERS, 20.0, 3, 20_000,
                "the reference's 100,000 messages, 200 senders, 20 s cooldown; N up to 16, "
                "3 shuffled blocks, and 20,000 messages at N = 1 and 16 in two of them (hours)", seed=1,
                arms=(Arm(20_000, (1, 16), (0, 1)),)),
        Profile("article", 100_000, 200, ARTICLE_CONSUMERS, 20.0, 1, 20_000,
                "the article's own sweep: N = 1, 2, 4, 8 once each in its order, 100,000 "
                "messages, 200 senders, 20 s cooldown, 18 runs (about 80 min on 2 cores)",
                pipelines=REFERENCE_PIPELINES),
        Profile("steady", 10_000, 200, STEADY_CONSUMERS, 5.0, 2, 5000,
                "wal and kafka open loop at 200 msg/s, 10,000 messages (50 s of sending) per run, N = 1, 4, "
                "16, in 2 blocks of paired cells; each run's steady part, start excluded, gives N* at that "
                "rate measured; a closed-loop warm-up and a drift probe, 14 runs (14 min on a 2-core machine "
                "that ran the reference in 35); "
                "`lab series` and `lab sitting` only", seed=1, pipelines=STEADY_PIPELINES, paired=True,
                rate=STEADY_RATE, report=False),
    )
}
REPORT_PROFILES = tuple(name for name, p in PROFILES.items() if p.report)  # what `lab report` runs


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}") from None


def available_pipelines() -> list[str]:
    """The registered pipelines: the reference's four in its order, then the others in registry order."""
    from lab.pipelines import PIPELINES

    return [p for p in ORDER if p in PIPELINES] + [p for p in PIPELINES if p not in ORDER]


def pipelines_of(name: str) -> list[str]:
    """The pipelines profile ``name`` runs by default: its own list (the article's four for smoke,
    quick and reference) among the registered ones, else every registered one."""
    prof = profile(name)
    available = available_pipelines()
    return [p for p in prof.pipelines if p in available] if prof.pipelines else available


def parse_pipelines(text: str | Sequence[str] | None) -> list[str] | None:
    """``"wal,kafka"`` → ``["wal", "kafka"]``; empty → None (every registered pipeline)."""
    from lab.pipelines import NAMES

    names = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text or [])
    names = [p for p in names if p]
    for name in names:
        if name not in NAMES:
            raise ValueError(f"unknown pipeline {name!r}: choose from {', '.join(NAMES)}")
    return names or None


def matrix(base: Scenario, *, pipelines: Iterable[str], consumers: Iterable[int],
           repeats: int = 1, seed: int | None = None) -> list[Scenario]:
    """Every pipeline x N (x repeats) on ``base``; shuffled when ``seed`` (recorded in each) is set.

    ``seed`` None or 0 keeps the reference order, so a stored ``seed`` of 0 means "not shuffled".
    """
    return [cell for block in blocks(base, pipelines=pipelines, consumers=consumers, repeats=repeats, seed=seed)
            for cell in block]


def blocks(base: Scenario, *, pipelines: Iterable[str], consumers: Iterable[int], repeats: int = 1,
           seed: int | None = None, extra: Sequence[Sequence[Scenario]] = (),
           paired: bool = False, variants: Sequence[Variant] = ()) -> list[list[Scenario]]:
    """``repeats`` blocks, each one pass over every pipeline x N and every variant at its N
    (:func:`row_at`; plus ``extra[b]``, the cells a block adds, e.g. the volume arm), shuffled
    inside the block when ``seed`` is set: every cell's repeats fall in different blocks, so a drift
    of the sitting separates the blocks instead of piling up in one cell.

    ``paired``: a block goes N by N instead (the N shuffled when ``seed`` is set); at each N every
    cell runs back to back, in the row's order at the block's even positions and reversed at the
    odd ones, and block b + 1 starts the other way round from block b, so no cell always runs
    first; the block's extra cells at that N follow in the same order."""
    pipelines, consumers = list(pipelines), list(consumers)
    rng = random.Random(seed) if seed else None
    out = []
    for b in range(repeats):
        added = list(extra[b]) if b < len(extra) else []
        if paired:
            ns = list(consumers)
            if rng is not None:
                rng.shuffle(ns)
            block = []
            for i, n in enumerate(ns):
                row = row_at(pipelines, variants, n)
                order = row if (b + i) % 2 == 0 else row[::-1]
                names = [v.pipeline for v in order]
                block += [v.cell(base, n, seed or 0) for v in order]
                block += sorted((c for c in added if c.consumers == n),
                                key=lambda c: (c.messages, names.index(c.pipeline)))
            out.append(block)
            continue
        block = [base.replace(pipeline=p, consumers=n, seed=seed or 0) for p in pipelines for n in consumers]
        block += [v.cell(base, n, seed or 0) for v in variants for n in consumers
                  if any(r is v for r in row_at(pipelines, variants, n))]
        block += added
        if rng is not None:
            rng.shuffle(block)
        out.append(block)
    return out


class Plan(list[Scenario]):
    """A series in order: a list of scenarios that also knows ``blocks``, the block each position
    runs in (0 is the first; None for the warm-up and the drift probe). :func:`run_series` stores it
    with every run (``series_block``): in a shuffled block an arm run may come before the block's
    first measured run, so its place in the series alone does not say which block it ran in. A
    slice or a filtered copy is a plain list and carries no blocks."""

    def __init__(self, scenarios: Iterable[Scenario] = (), blocks: Iterable[int | None] = ()) -> None:
        super().__init__(scenarios)
        self.blocks: tuple[int | None, ...] = tuple(blocks)
        if self.blocks and len(self.blocks) != len(self):
            raise ValueError(f"{len(self.blocks)} blocks for {len(self)} scenarios")


def plan(name: str = "quick", *, repeats: int | None = None, seed: int | None = None,
         pipelines: Sequence[str] | None = None, rate: float = 0.0,
         consumers: Sequence[int] | None = None) -> Plan:
    """The series for profile ``name``: warm-up (none when the profile has no warm-up messages), the
    matrix, drift probe.

    ``rate > 0`` makes every measured cell (and the drift probe) open-loop at ``rate`` msg/s
    (latency mode, :mod:`lab.measure.latency`); the warm-up stays closed-loop, and there is no
    volume arm. ``rate`` 0 takes the profile's (``steady``: 200 msg/s; the others: closed loop).

    ``repeats`` defaults to the profile's; a non-zero ``seed`` (recorded in every scenario)
    shuffles the measured cells (none or 0: the profile's seed; with more than one repeat and no
    profile seed, 1 — repeats in the reference order would put one cell's repeats side by side);
    ``pipelines`` defaults to the profile's, else every registered one, in the reference order;
    ``consumers`` (a subset of N, e.g. to repeat a few cells under another topology) defaults to the
    profile's, and each volume arm keeps only its N among them. The profile's variants
    (:class:`Variant`) ride in every block at their N among those; with ``pipelines`` given, only
    the variants of the pipelines named.
    """
    prof = profile(name)
    ns = tuple(consumers or prof.consumers)
    if any(n < 1 for n in ns):
        raise ValueError(f"consumers must be at least 1, got {', '.join(map(str, ns))}")
    pipes = list(pipelines or pipelines_of(name))
    if not pipes:
        raise ValueError("no pipeline to run")
    if repeats is not None and repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate must be a finite number of at least 0, got {rate}")
    rate = rate or prof.rate
    reps = repeats or prof.repeats
    if not seed:  # the profile's; repeats are shuffled so that drift spreads over the cells
        seed = prof.seed or (1 if reps > 1 else 0)
    base = Scenario(messages=prof.messages, senders=prof.senders, cooldown_s=prof.cooldown_s)
    arm: list[list[Scenario]] = [[] for _ in range(reps)]
    for a in prof.arms if not rate else ():
        rest = base.cooldown_s if a.cooldown_s is None else a.cooldown_s
        for b in (b for b in a.blocks if b < reps):
            arm[b] += [base.replace(pipeline=p, consumers=n, messages=a.messages, seed=seed or 0, warmup=True,
                                    label="volume", cooldown_s=rest)
                       for p in pipes if a.runs(p) for n in a.consumers if n in ns]
    variants = [v for v in prof.variants if not pipelines or v.pipeline in pipelines]
    main = base.replace(rate=float(rate))
    placed = [(c, b) for b, block in enumerate(blocks(main, pipelines=pipes, consumers=ns, repeats=reps, seed=seed,
                                                      extra=arm, paired=prof.paired, variants=variants))
              for c in block]
    cells = [c for c, _ in placed]
    first = REFERENCE_WARMUP if REFERENCE_WARMUP in pipes else pipes[0]
    warmup = [base.replace(pipeline=first, consumers=1, warmup=True, label="warmup", seed=seed or 0,
                           messages=prof.warmup_messages)] if prof.warmup_messages else []
    # the drift probe repeats the first cell of the profile's own pipelines, never a variant's
    drift = next(c for c in cells if not c.warmup and c.pipeline in pipes
                 and c == main.replace(pipeline=c.pipeline, consumers=c.consumers, seed=seed or 0))
    return Plan([*warmup, *cells, drift.replace(warmup=True, label="drift")],
                [*(None for _ in warmup), *(b for _, b in placed), None])


def default_series_id(name: str, *, repeats: int | None = None, seed: int | None = None,
                      pipelines: Sequence[str] | None = None, rate: float = 0.0,
                      topology: str = "single", consumers: Sequence[int] | None = None) -> str:
    """A stable id, so that running the same series again resumes it (``-rate500``: open loop;
    ``-c1+4``: a subset of N; ``-ha``: the fault-tolerant topology, so an ``ha`` series never
    resumes a ``single`` one). A profile's own rate adds nothing (``steady``, not ``steady-rate200``)."""
    parts = [name]
    if repeats is not None and repeats != profile(name).repeats:
        parts.append(f"r{repeats}")
    if seed:
        parts.append(f"s{seed}")
    if pipelines and list(pipelines) != pipelines_of(name):
        parts.append("+".join(pipelines))
    if consumers and tuple(consumers) != profile(name).consumers:
        parts.append("c" + "+".join(map(str, consumers)))
    if rate and rate != profile(name).rate:
        parts.append(f"rate{rate:g}")
    if topology != "single":
        parts.append(topology)
    return "-".join(parts)


def cell_label(s: Scenario) -> str:
    """``wal c4``, ``wal c4 claims pruned``, ``kafka c1 warmup``."""
    from lab.study.sitting import condition

    tag = f" {s.label}" if s.label else (" warmup" if s.warmup else "")
    named = condition(asdict(s))
    return f"{s.pipeline} c{s.consumers}{' ' + named if named else ''}{tag}"


@dataclass
class Step:
    """A progress event of :func:`run_series`.

    ``status``: ``idle`` (the idle baseline is being measured; ``index`` is -1), ``start`` (a run
    begins), ``phase`` (the run moved on; ``phase`` says where),
    ``skipped`` (a successful run exists) or ``done`` (``result`` is the run.json content).
    """

    index: int
    total: int
    scenario: Scenario
    status: str
    phase: str = ""
    result: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def cell(self) -> str:
        return cell_label(self.scenario)


def _existing(series_id: str, settings: Settings) -> dict[Scenario, list[dict[str, Any]]]:
    """Successful runs of this series on this topology, per scenario, oldest first."""
    out: dict[Scenario, list[dict[str, Any]]] = defaultdict(list)
    names = set(Scenario.field_names())
    for run in sorted(iter_runs(settings=settings), key=lambda r: str(r.get("started_at"))):
        if run.get("series_id") != series_id or not run.get("success"):
            continue
        if (run.get("topology") or "single") != settings.topology:
            continue  # a series id given by hand for both topologies: not the same cell
        params = run.get("scenario") or {}
        if not set(params) <= names:
            continue  # stored by another version of Scenario: not the same cell
        # a field added later takes its default (e.g. producer="web" for runs stored before it),
        # except the layout: runs stored before it existed ran one process per consumer, and the
        # default is now auto (tasks), so they are not cells of a series planned today
        params = {"consumer_layout": "processes", **params}
        try:
            out[Scenario(**params)].append(run)
        except (TypeError, ValueError):
            continue
    return out


async def run_series(
    plan: Sequence[Scenario], settings: Settings, *, series_id: str, force: bool = False,
    progress: Callable[[Step], None] | None = None, idle_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Run every scenario of ``plan`` in order; return each one's run.json content.

    Resumable: a scenario with a successful run in ``series_id`` is skipped (its stored result
    is returned) unless ``force``. Failed runs are stored and the series goes on.
    ``idle_s > 0``: first the idle baseline (:func:`lab.measure.idle.measure_idle`) over that many
    seconds, stored with the series (kept when resuming, measured again with ``force``); every
    run then carries its cost without it.
    """
    if idle_s < 0:
        raise ValueError(f"idle_s must not be negative, got {idle_s}")
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        return await _run_series(plan, settings, series_id=series_id, force=force, progress=progress,
                                 idle_s=idle_s)


async def _run_series(
    plan: Sequence[Scenario], settings: Settings, *, series_id: str, force: bool,
    progress: Callable[[Step], None] | None, idle_s: float,
) -> list[dict[str, Any]]:
    from lab.runner import run_scenario

    report = progress or (lambda step: None)
    idle = None
    if idle_s > 0 and plan:
        idle = None if force else read_idle(series_id, settings=settings)
        if idle is None:
            report(Step(-1, len(plan), plan[0], "idle"))
            idle = await asyncio.to_thread(measure_idle, settings, seconds=idle_s,
                                           say=lambda line: log.info("%s", line))
            write_idle(series_id, idle, settings=settings)
        log.info("idle baseline (cpu s/s): %s", idle["cpu_s_per_s"])
    done = {} if force else _existing(series_id, settings)
    placed = plan.blocks if isinstance(plan, Plan) else ()
    seen: Counter[Scenario] = Counter()
    results = []
    total = len(plan)
    for i, scenario in enumerate(plan):
        k = seen[scenario]
        seen[scenario] += 1
        if k < len(done.get(scenario, ())):
            result = done[scenario][k]
            log.info("[%d/%d] %s: skipped, done in run %s", i + 1, total, cell_label(scenario),
                     result["run_id"])
            report(Step(i, total, scenario, "skipped", result=result))
            results.append(result)
            continue
        report(Step(i, total, scenario, "start"))

        def on_phase(phase: str, info: dict[str, Any], i: int = i, s: Scenario = scenario) -> None:
            report(Step(i, total, s, "phase", phase=phase))

        meta: dict[str, Any] = {"series_id": series_id, "series_index": i}
        if placed and placed[i] is not None:
            meta["series_block"] = placed[i]
        result = await run_scenario(scenario, settings, progress=on_phase, idle=idle, meta=meta)
        log.info("[%d/%d] %s: %s", i + 1, total, cell_label(scenario), outcome(result))
        report(Step(i, total, scenario, "done", result=result))
        results.append(result)
    return results


def failed_cells(series_id: str, settings: Settings) -> list[str]:
    """Cells of a series whose every run failed (a cell retried successfully is not listed)."""
    ok: set[tuple[Any, ...]] = set()
    bad: dict[tuple[Any, ...], str] = {}
    for run in iter_runs(settings=settings):
        if run.get("series_id") != series_id:
            continue
        s = run.get("scenario") or {}
        key = tuple(sorted((k, str(v)) for k, v in s.items()))
        if run.get("success"):
            ok.add(key)
        else:
            bad[key] = f"{s.get('pipeline')} c{s.get('consumers')}{' ' + s['label'] if s.get('label') else ''}"
    return sorted(label for key, label in bad.items() if key not in ok)


def outcome(result: dict[str, Any]) -> str:
    """One line: ``1.234 ms CPU/msg`` or ``FAILED: <error>``."""
    if result.get("success"):
        return f"{result['cpu_ms_per_msg']:.3f} ms CPU/msg in {result['window_s']:.1f} s"
    return f"FAILED: {result.get('error')}"


def plan_table(plan: Sequence[Scenario]) -> pd.DataFrame:
    """The plan as a table: one row per run, in order."""
    cols = ["pipeline", "consumers", "messages", "senders", "cooldown_s", "warmup", "label", "seed"]
    return pd.DataFrame([{c: getattr(s, c) for c in cols} for s in plan])


def outcome_table(results: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """What a series did: one row per run (run id, cell, success, ms CPU/msg, window, error)."""
    rows = []
    for r in results:
        s = r.get("scenario", {})
        rows.append({
            "run_id": r.get("run_id"), "pipeline": s.get("pipeline"),
            "consumers": s.get("consumers"), "claim_retention": s.get("claim_retention", "never"),
            "messages": s.get("messages"), "warmup": s.get("warmup"), "label": s.get("label"),
            "success": r.get("success"), "cpu_ms_per_msg": r.get("cpu_ms_per_msg"),
            "window_s": r.get("window_s"), "error": r.get("error"),
        })
    return pd.DataFrame(rows)
