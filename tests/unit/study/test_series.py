"""The series plan and its resume logic (no services: stored runs are written by hand)."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lab.runner
from lab.results import read_idle, write_run
from lab.scenario import Scenario
from lab.settings import Settings
from lab.study import series


def test_plan_is_warmup_then_every_cell_then_drift_probe() -> None:
    plan = series.plan("article", pipelines=["kafka", "rabbitmq", "wal", "wal-sharded"])
    warm, cells, drift = plan[0], plan[1:-1], plan[-1]
    assert (warm.pipeline, warm.consumers, warm.messages, warm.label) == ("kafka", 1, 20_000, "warmup") and warm.warmup
    assert [(s.pipeline, s.consumers) for s in cells] == [
        (p, n) for p in ("kafka", "rabbitmq", "wal", "wal-sharded") for n in (1, 2, 4, 8)]
    assert not any(s.warmup for s in cells) and {s.messages for s in cells} == {100_000}
    assert drift == cells[0].replace(warmup=True, label="drift")
    smoke = series.plan("smoke", pipelines=["kafka", "rabbitmq", "wal", "wal-sharded"])
    assert smoke[:-1] == [c.replace(messages=300, senders=20, cooldown_s=0.0) for c in cells if c.consumers < 4]
    assert smoke[-1] == smoke[0].replace(warmup=True, label="drift")  # no warm-up: its numbers are noise
    assert {s.cooldown_s for s in smoke} == {0.0}
    assert series.plan("full")[0].messages == 20_000  # 20 % of M, as the reference
    assert series.plan("quick")[0].messages == 5000  # never a cold JVM for the first cell


def test_profiles() -> None:
    quick, full = series.profile("quick"), series.profile("full")
    assert (quick.messages, quick.senders, quick.consumers) == (5000, 200, (1, 4, 16))
    assert series.profile("reference").consumers == (1, 4, 8, 16)  # N = 8 at the reference volume, not in quick
    assert len(series.plan("quick")) == 1 + 4 * 3 * 2 + 2 * 3 * 2 + 1  # 38 runs: its half hour on 2 cores
    assert quick.repeats == 2 and series.plan("quick")[1].seed == 1  # an interval per cell, shuffled
    # the headline's pair at 20,000 messages at every N of both blocks: F refitted block by block
    assert quick.arms == (series.Arm(20_000, (1, 4, 16), (0, 1), pipelines=("wal", "kafka")),)
    assert (full.messages, full.senders, full.cooldown_s, full.repeats) == (100_000, 200, 20.0, 3)
    assert set(quick.consumers) < set(full.consumers) and max(full.consumers) == 16  # measured, not extrapolated
    assert quick.idle_s == full.idle_s == 30.0
    full_plan = series.plan("full", pipelines=["wal", "kafka"])
    assert len(full_plan) == 1 + 2 * 6 * 3 + 2 * 2 * 2 + 1  # warm-up, 3 blocks, the volume arm in two, drift
    assert {s.seed for s in full_plan} == {1}  # repeats are shuffled, with the seed recorded
    with pytest.raises(ValueError, match="unknown profile"):
        series.plan("huge")


def test_repeats_are_blocks_and_the_volume_arm_rides_in_them() -> None:
    pipes = ["kafka", "rabbitmq", "wal"]
    plan = series.plan("quick", pipelines=pipes)
    body = plan[1:-1]
    cells = len(pipes) * len(series.QUICK_CONSUMERS)
    arm = {(p, n) for p in ("kafka", "wal") for n in series.QUICK_CONSUMERS}  # quick's arm: wal and kafka only
    per_block = cells + len(arm)  # in both blocks
    assert len(body) == 2 * per_block
    main = {(p, n) for p in pipes for n in series.QUICK_CONSUMERS}
    for block in (body[:per_block], body[per_block:]):  # every cell once per block, the arm's too
        assert sorted((s.pipeline, s.consumers) for s in block if not s.warmup) == sorted(main)
        volume = [s for s in block if s.label == "volume"]
        assert sorted((s.pipeline, s.consumers) for s in volume) == sorted(arm)
        assert all(s.warmup and s.messages == 20_000 for s in volume)  # no table pools them with M = 5,000
    assert body[:per_block] != body[per_block:]  # shuffled within each block, differently
    assert plan[-1].label == "drift" and plan[-1].messages == 5000
    full = series.plan("full", pipelines=pipes)[1:-1]  # full: the arm, every pipeline, in two of its three blocks
    assert sum(s.label == "volume" for s in full) == 2 * len(pipes) * 2
    assert not any(s.label == "volume" for s in series.plan("quick", pipelines=pipes, rate=500.0))
    assert not any(s.label == "volume" for s in series.plan("smoke", pipelines=pipes))

def test_a_subset_of_n_keeps_the_volume_arm_only_at_its_n() -> None:
    pipes = ["wal", "poll"]
    plan = series.plan("decision", pipelines=pipes, consumers=(1, 4))
    measured = [s for s in plan[1:-1] if not s.warmup]
    assert Counter((s.pipeline, s.consumers) for s in measured) == {(p, n): 2 for p in pipes for n in (1, 4)}
    assert {(s.pipeline, s.consumers) for s in plan if s.label == "volume"} == {(p, 1) for p in pipes}
    assert not any(s.label == "volume" for s in series.plan("decision", pipelines=pipes, consumers=(4,)))
    assert series.plan("decision", pipelines=pipes, consumers=series.DECISION_CONSUMERS) == \
        series.plan("decision", pipelines=pipes)
    assert series.default_series_id("decision", consumers=(1, 4), topology="ha") == "decision-c1+4-ha"
    assert series.default_series_id("decision", consumers=series.DECISION_CONSUMERS) == "decision"
    with pytest.raises(ValueError, match="at least 1"):
        series.plan("decision", consumers=(0,))


def test_article_profile_is_the_published_sweep() -> None:
    """the article's own sweep: warm-up kafka c1 20k, then kafka, rabbitmq, wal, wal-sharded at 1, 2, 4, 8
    in that order, then the drift probe (kafka c1, 100k): 18 runs, not shuffled."""
    plan = series.plan("article")
    assert len(plan) == 18
    assert (plan[0].pipeline, plan[0].consumers, plan[0].messages, plan[0].warmup) == ("kafka", 1, 20_000, True)
    cells = [(s.pipeline, s.consumers) for s in plan[1:-1]]
    assert cells == [(p, n) for p in ("kafka", "rabbitmq", "wal", "wal-sharded") for n in (1, 2, 4, 8)]
    assert {(s.messages, s.senders, s.cooldown_s, s.seed) for s in plan[1:]} == {(100_000, 200, 20.0, 0)}
    assert (plan[-1].pipeline, plan[-1].consumers, plan[-1].label, plan[-1].warmup) == ("kafka", 1, "drift", True)


def test_reference_profile_pairs_the_pipelines_at_each_n() -> None:
    """wal, kafka and rabbitmq at 100,000 messages, N = 1, 4, 8, 16, two blocks; inside a block the
    N come one by one, the three pipelines back to back in an order that alternates, the N's arm runs
    (5,000 messages at every N in the first block, 20,000 at N = 1, 4 and 16 in the second) after them."""
    plan = series.plan("reference")
    main = [s for s in plan if not s.warmup]
    assert Counter((s.pipeline, s.consumers) for s in main) == Counter(
        {(p, n): 2 for p in ("wal", "kafka", "rabbitmq") for n in (1, 4, 8, 16)})
    assert {s.messages for s in main} == {100_000}
    arm = [s for s in plan if s.label == "volume"]
    assert Counter((s.messages, s.consumers) for s in arm) == Counter(
        {**{(5_000, n): 3 for n in (1, 4, 8, 16)}, **{(20_000, n): 3 for n in (1, 4, 16)}})
    assert len(plan) == 1 + 24 + 21 + 1
    assert {s.cooldown_s for s in main} == {20.0} and {s.cooldown_s for s in arm} == {5.0}  # the arm rests as quick
    body = plan[1:-1]
    groups = [body[i:i + 3] for i in range(0, len(body), 3)]
    for g in groups:  # every group of three: one N, one volume, every pipeline once
        assert len({(s.consumers, s.messages) for s in g}) == 1
        assert sorted(s.pipeline for s in g) == ["kafka", "rabbitmq", "wal"]
        assert g[1].pipeline == "kafka"  # kafka always in the middle: adjacent to wal and to rabbitmq
    firsts = [g[0].pipeline for g in groups if g[0].messages == 100_000]
    assert Counter(firsts) == Counter({"wal": 4, "rabbitmq": 4})  # the order alternates
    block_ns = [[g[0].consumers for g in groups if g[0].messages == 100_000][b * 4:(b + 1) * 4] for b in (0, 1)]
    assert all(sorted(ns) == [1, 4, 8, 16] for ns in block_ns) and block_ns[0] != block_ns[1]
    assert series.plan("reference") == plan  # the shuffle is seeded


def test_steady_profile_pairs_wal_and_kafka_open_loop_at_its_rate() -> None:
    """A closed-loop warm-up, then wal and kafka at 200 msg/s, 10,000 messages, back to back at each
    of N = 1, 4, 16 (the order alternating), two blocks, and an open-loop drift probe: 14 runs."""
    plan = series.plan("steady")
    warm, body, drift = plan[0], plan[1:-1], plan[-1]
    assert (warm.pipeline, warm.consumers, warm.messages, warm.rate, warm.label) == ("kafka", 1, 5000, 0.0, "warmup")
    assert Counter((s.pipeline, s.consumers) for s in body) == {(p, n): 2 for p in ("wal", "kafka") for n in (1, 4, 16)}
    assert {(s.messages, s.rate) for s in body} == {(10_000, 200.0)} and not any(s.warmup for s in body)
    pairs = [body[i:i + 2] for i in range(0, len(body), 2)]
    assert all(a.consumers == b.consumers and {a.pipeline, b.pipeline} == {"wal", "kafka"} for a, b in pairs)
    assert Counter(a.pipeline for a, _ in pairs) == {"wal": 3, "kafka": 3}  # neither always runs first
    assert drift == body[0].replace(warmup=True, label="drift") and drift.rate == 200.0
    assert len(plan) == 14 and not any(s.label == "volume" for s in plan)
    assert {s.rate for s in series.plan("steady", rate=500.0)[1:]} == {500.0}  # --rate overrides
    assert {s.rate for s in series.plan("quick")} == {0.0}  # the others stay closed loop
    assert series.default_series_id("steady") == series.default_series_id("steady", rate=200.0) == "steady"
    assert series.default_series_id("steady", rate=500.0) == "steady-rate500"
    assert series.default_series_id("quick", rate=500.0) == "quick-rate500"


def test_series_and_sitting_take_the_steady_profile_and_report_does_not() -> None:
    from lab import cli

    parser = cli.build_parser()
    assert parser.parse_args(["series", "--profile", "steady"]).profile == "steady"
    assert parser.parse_args(["sitting", "steady", "--profile", "steady"]).profile == "steady"
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "--profile", "steady"])


PRUNED = series.Variant("wal", "claims pruned", (("claim_retention", "behind-slots"),))
POLL4 = series.Variant("poll", consumers=(4,), position=0)


def _cell(s: Scenario) -> tuple[str, int, str]:
    return s.pipeline, s.consumers, s.claim_retention


def test_row_at_places_each_variant_among_the_pipelines_at_its_n() -> None:
    def names(n: int, pipelines: list[str], variants: list[series.Variant]) -> list[tuple[str, str]]:
        return [(v.pipeline, v.condition) for v in series.row_at(pipelines, variants, n)]

    both = [PRUNED, POLL4]
    assert names(4, ["wal", "kafka"], both) == [("poll", ""), ("wal", ""), ("kafka", ""), ("wal", "claims pruned")]
    assert names(1, ["wal", "kafka"], both) == [("wal", ""), ("kafka", ""), ("wal", "claims pruned")]  # poll: 4 only
    assert names(4, ["poll", "kafka"], both) == [("poll", ""), ("kafka", ""), ("wal", "claims pruned")]  # no repeat
    assert names(4, ["wal", "kafka"], []) == [("wal", ""), ("kafka", "")]
    cell = PRUNED.cell(Scenario(messages=300), 4, 7)
    assert (cell.pipeline, cell.consumers, cell.seed, cell.claim_retention, cell.messages) == (
        "wal", 4, 7, "behind-slots", 300)


def test_conditions_profile_pairs_each_condition_with_kafka_and_poll_with_wal_at_four() -> None:
    prof = series.profile("conditions")
    assert (prof.messages, prof.senders, prof.cooldown_s, prof.consumers, prof.repeats, prof.paired) == (
        100_000, 200, 20.0, (1, 4, 16), 2, True)
    assert prof.warmup_messages == 20_000 and prof.variants == (PRUNED, POLL4)
    plan = series.plan("conditions")
    warm, everything, drift = plan[0], plan[1:-1], plan[-1]
    assert (warm.pipeline, warm.consumers, warm.messages, warm.label) == ("kafka", 1, 20_000, "warmup")
    assert len(plan) == 34
    # the volume arm: wal and kafka (never pruned) at 5,000 messages at every N of both blocks, each
    # right after the cells at its N, so F is refitted block by block
    arm = [s for s in everything if s.warmup]
    assert all(s.label == "volume" and s.messages == 5_000 and s.claim_retention == "never" for s in arm)
    assert Counter((s.pipeline, s.consumers) for s in arm) == Counter(
        {(p, n): 2 for p in ("wal", "kafka") for n in (1, 4, 16)})
    halves = (everything[:16], everything[16:])
    assert [sum(s.warmup for s in h) for h in halves] == [6, 6]
    for h in halves:
        for i, s in enumerate(h):
            if s.warmup:
                assert h[i - 1].consumers == s.consumers
    body = [s for s in everything if not s.warmup]
    assert len(body) == 20
    assert {(s.messages, s.senders, s.cooldown_s, s.seed) for s in body} == {(100_000, 200, 20.0, 1)}
    assert Counter(map(_cell, body)) == Counter(
        {**{(p, n, r): 2 for p, r in (("wal", "never"), ("kafka", "never"), ("wal", "behind-slots"))
            for n in (1, 4, 16)}, ("poll", 4, "never"): 2})
    reversed_order = []
    for block in (body[:10], body[10:]):
        ns = [n for n, _ in itertools.groupby(s.consumers for s in block)]
        assert sorted(ns) == [1, 4, 16]  # N by N: the cells at one N back to back
        for n in ns:
            at = [_cell(s) for s in block if s.consumers == n]
            kafka = at.index(("kafka", n, "never"))
            wal, pruned = at.index(("wal", n, "never")), at.index(("wal", n, "behind-slots"))
            assert abs(kafka - wal) == 1 and abs(kafka - pruned) == 1  # kafka next to both conditions
            if n == 4:
                assert len(at) == 4 and abs(at.index(("poll", 4, "never")) - wal) == 1  # poll next to plain wal
            else:
                assert len(at) == 3
            reversed_order.append(pruned == 0)
    assert reversed_order == [False, True, False, True, False, True]  # the order alternates N by N, block by block
    first_plain = next(s for s in body if s.claim_retention == "never" and s.pipeline in ("wal", "kafka"))
    assert drift == first_plain.replace(warmup=True, label="drift")  # the probe repeats a plain cell
    assert len(set(body)) == 10  # every cell its own scenario: a resume tells the conditions apart
    assert series.plan("conditions") == plan  # seeded
    # --pipelines keeps the variants of the pipelines named; --consumers their N among those given
    assert {_cell(s) for s in series.plan("conditions", pipelines=["wal", "kafka"])[1:-1]} == {
        (p, n, r) for p, r in (("wal", "never"), ("kafka", "never"), ("wal", "behind-slots")) for n in (1, 4, 16)}
    assert not any(s.pipeline == "poll" for s in series.plan("conditions", consumers=(1, 16)))
    assert series.default_series_id("conditions") == "conditions"


def test_a_variants_condition_is_the_one_its_runs_are_read_back_under() -> None:
    from dataclasses import asdict

    from lab.study import sitting

    for v in series.profile("conditions").variants:
        assert sitting.condition(asdict(v.cell(Scenario(), 4, 1))) == v.condition
    assert series.cell_label(PRUNED.cell(Scenario(), 4, 1)) == "wal c4 claims pruned"
    assert series.cell_label(Scenario(consumers=4)) == "wal c4"


def test_a_variant_resumes_as_a_cell_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    plan = series.plan("conditions")
    pruned = next(i for i, s in enumerate(plan) if s.claim_retention == "behind-slots")
    plain = plan.index(plan[pruned].replace(claim_retention="never"))
    _stored(settings, plan[pruned], "c", ok=True, stamp="2026-01-01T00")
    ran: list[int] = []

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None) -> dict[str, Any]:
        ran.append(int((meta or {})["series_index"]))
        return {"run_id": f"new-{len(ran)}", "scenario": scenario.as_parameters(), "success": True,
                "cpu_ms_per_msg": 1.0, "window_s": 1.0, **(meta or {})}

    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    asyncio.run(series.run_series(plan, settings, series_id="c"))
    assert pruned not in ran and plain in ran and len(ran) == len(plan) - 1


def test_a_plan_knows_the_block_of_every_run_and_the_series_stores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a shuffled block an arm run can come before the block's first measured run, where its
    place in the series alone would put it in the block before: the plan says which block each
    position is in, and every run of a block is stored with it."""
    plan = series.plan("quick")
    assert len(plan.blocks) == len(plan) and plan.blocks[0] is None and plan.blocks[-1] is None  # warm-up, drift
    for b in (0, 1):  # each block: every main cell once, the arm's wal and kafka at every N once
        block = [s for s, at in zip(plan, plan.blocks, strict=True) if at == b]
        assert Counter((s.pipeline, s.consumers, s.messages) for s in block) == Counter(
            {**{(p, n, 5_000): 1 for p in series.REFERENCE_PIPELINES for n in series.QUICK_CONSUMERS},
             **{(p, n, 20_000): 1 for p in ("wal", "kafka") for n in series.QUICK_CONSUMERS}})
    assert plan.blocks[1:-1] == tuple(sorted(plan.blocks[1:-1]))  # one block after the other
    assert series.plan("reference").blocks.count(1) == 4 * 3 + 3 * 3  # its second block: 20,000 at 1, 4, 16
    assert type(plan[1:]) is list  # a slice is a plain list: no blocks to misplace
    with pytest.raises(ValueError, match="blocks for"):
        series.Plan(plan, (0,))
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    stored: list[dict[str, Any]] = []

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None) -> dict[str, Any]:
        stored.append(dict(meta or {}))
        return {"run_id": f"r{len(stored)}", "scenario": scenario.as_parameters(), "success": True,
                "cpu_ms_per_msg": 1.0, "window_s": 1.0, **(meta or {})}

    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    asyncio.run(series.run_series(plan, settings, series_id="q"))
    assert [m.get("series_block") for m in stored] == list(plan.blocks)  # none for the warm-up and drift
    stored.clear()
    asyncio.run(series.run_series(list(plan), settings, series_id="q2"))  # a plain list: no blocks known
    assert not any("series_block" in m for m in stored) and len(stored) == len(plan)


def test_seed_shuffles_reproducibly_and_is_recorded() -> None:
    pipes = ["kafka", "rabbitmq", "wal", "wal-sharded"]
    plain = series.plan("quick", pipelines=pipes)
    a, b = series.plan("quick", seed=7, pipelines=pipes), series.plan("quick", seed=7, pipelines=pipes)
    assert a == b and {s.seed for s in a} == {7} and {s.seed for s in plain} == {1}  # quick's own seed
    cells = lambda p: [(s.pipeline, s.consumers) for s in p[1:-1]]  # noqa: E731
    assert cells(a) != cells(plain) and Counter(cells(a)) == Counter(cells(plain))
    first = next(s for s in a[1:] if not s.warmup)  # the volume arm's runs are shuffled in with the cells
    assert a[-1] == first.replace(warmup=True, label="drift")  # the first cell as run


def test_repeats_pipelines_and_series_ids() -> None:
    plan = series.plan("smoke", repeats=2, pipelines=["wal"])
    assert Counter((s.pipeline, s.consumers) for s in plan[:-1]) == {("wal", 1): 2, ("wal", 2): 2}
    assert {s.seed for s in plan} == {1}  # more than one repeat and no seed given: shuffled with seed 1
    assert {s.seed for s in series.plan("smoke", pipelines=["wal"])} == {0}  # one repeat: reference order
    assert series.plan("quick", pipelines=["wal"])[0].label == "warmup"
    assert series.plan("quick", pipelines=["wal"])[0].pipeline == "wal"  # no kafka: the warm-up runs on the first
    assert series.default_series_id("quick") == "quick"
    assert series.default_series_id("quick", repeats=3, seed=5, pipelines=["wal"]) == "quick-r3-s5-wal"
    assert series.default_series_id("quick", repeats=2) == "quick"  # the profile's own repeats
    assert series.default_series_id("quick", topology="ha") == "quick-ha"  # never resumes a single series
    assert series.default_series_id("quick", topology="single") == "quick"
    assert series.parse_pipelines(" wal, kafka ,") == ["wal", "kafka"] and series.parse_pipelines("") is None
    with pytest.raises(ValueError, match="unknown pipeline"):
        series.parse_pipelines("wal,nats")


def _stored(settings: Settings, s: Scenario, sid: str, *, ok: bool, stamp: str) -> dict[str, Any]:
    run = {"run_id": f"{stamp}-{s.pipeline}-c{s.consumers}", "started_at": stamp, "scenario": s.as_parameters(),
           "success": ok, "error": None if ok else "boom", "cpu_ms_per_msg": 1.0, "window_s": 1.0,
           "series_id": sid}
    write_run(run, settings=settings)
    return run


def test_run_series_skips_what_succeeded_in_this_series_and_reruns_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    cells = series.matrix(Scenario(messages=300, senders=20, cooldown_s=0.0), pipelines=["wal"],
                          consumers=(1, 2), repeats=2)  # c1, c2, c1, c2 in this order
    plan = [cells[0].replace(warmup=True, label="warmup"), *cells, cells[0].replace(warmup=True, label="drift")]
    done = _stored(settings, plan[1], "s1", ok=True, stamp="2026-01-01T00")  # first wal c1
    _stored(settings, plan[2], "s1", ok=False, stamp="2026-01-01T01")  # a failed wal c2: retried
    _stored(settings, plan[2], "other", ok=True, stamp="2026-01-01T02")  # another series: not ours
    ran: list[tuple[Scenario, dict[str, Any]]] = []

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None) -> dict[str, Any]:
        ran.append((scenario, {**(meta or {}), "idle": idle}))
        return {"run_id": f"new-{len(ran)}", "scenario": scenario.as_parameters(), "success": True,
                "cpu_ms_per_msg": 2.0, "window_s": 1.0, **(meta or {})}

    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    steps: list[series.Step] = []
    results = asyncio.run(series.run_series(plan, settings, series_id="s1", progress=steps.append))
    assert results[1]["run_id"] == done["run_id"]  # skipped: its stored result comes back
    assert [m["series_index"] for _, m in ran] == [0, 2, 3, 4, 5]  # the second wal c1 is a repeat: runs
    assert {m["series_id"] for _, m in ran} == {"s1"}
    assert [s.status for s in steps if s.status != "start"] == ["done", "skipped", "done", "done", "done", "done"]
    assert {m["idle"] for _, m in ran} == {None}  # no idle baseline asked for
    ran.clear()
    asyncio.run(series.run_series(plan, settings, series_id="s1", force=True))
    assert len(ran) == len(plan)


def test_run_series_measures_the_idle_baseline_once_and_hands_it_to_every_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    plan = series.plan("smoke", pipelines=["wal"])
    measured: list[float] = []
    got: list[Any] = []

    def fake_idle(settings: Settings, *, seconds: float, say: Any = None) -> dict[str, Any]:
        measured.append(seconds)
        return {"measured_at": "t", "seconds": seconds, "cpu_s_per_s": {"postgres": 0.001}, "rss_mb": {}}

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None) -> dict[str, Any]:
        got.append(idle)
        return {"run_id": f"r{len(got)}", "scenario": scenario.as_parameters(), "success": False, **(meta or {})}

    monkeypatch.setattr(series, "measure_idle", fake_idle)
    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    steps: list[series.Step] = []
    asyncio.run(series.run_series(plan, settings, series_id="i1", idle_s=4.0, progress=steps.append))
    assert measured == [4.0] and steps[0].status == "idle"
    assert read_idle("i1", settings=settings)["cpu_s_per_s"] == {"postgres": 0.001}
    assert len(got) == len(plan) and all(g is not None and g["seconds"] == 4.0 for g in got)
    asyncio.run(series.run_series(plan, settings, series_id="i1", idle_s=4.0))  # resumed: kept
    assert measured == [4.0]
    asyncio.run(series.run_series(plan, settings, series_id="i1", idle_s=4.0, force=True))  # forced: again
    assert measured == [4.0, 4.0]


def test_outcome_lines() -> None:
    assert series.outcome({"success": True, "cpu_ms_per_msg": 1.23456, "window_s": 3.0}).startswith("1.235 ms")
    assert series.outcome({"success": False, "error": "boom"}) == "FAILED: boom"


def test_failed_cells_lists_only_cells_that_never_succeeded(tmp_path: Path) -> None:
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    base = Scenario(messages=300, senders=20, cooldown_s=0.0)
    wal1, wal2, kafka1 = base, base.replace(consumers=2), base.replace(pipeline="kafka")
    _stored(settings, wal1, "f", ok=False, stamp="2026-01-01T00")
    _stored(settings, wal1, "f", ok=True, stamp="2026-01-01T01")  # retried: fine now
    _stored(settings, wal2, "f", ok=False, stamp="2026-01-01T02")
    _stored(settings, kafka1, "other", ok=False, stamp="2026-01-01T03")  # another series
    assert series.failed_cells("f", settings) == ["wal c2"]
    assert series.failed_cells("nothing", settings) == []


def test_one_stack_serves_one_lab_process_at_a_time(tmp_path: Path) -> None:
    """A second series (another process) on the same stack fails at once with one line."""
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from lab.study import series\n"
        "from lab.settings import Settings\n"
        "from lab.stack.base import StackError\n"
        f"s = Settings().replace(data_dir=Path({str(tmp_path)!r}), stack_dir=Path({str(tmp_path / 'stack')!r}))\n"
        "try:\n"
        "    asyncio.run(series.run_series([], s, series_id='x'))\n"
        "except StackError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    from lab.stack.proc import exclusive

    with exclusive(settings.run_lock, "the stack"):
        with exclusive(settings.run_lock, "the stack"):  # re-entrant in this process
            pass
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        assert other.returncode == 3, other.stderr
        assert "is in use by `" in other.stdout and f"(pid {os.getpid()})" in other.stdout  # its command, its pid
        # a child of the holder that is told so runs under its lock (a report's notebook kernel) ...
        child = code.replace("s = Settings()", f"s = Settings(lock_owner={os.getpid()})")
        ran = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=False)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        # ... and naming another owner than the holder gets nothing (pid 1 is everyone's ancestor)
        foreign = code.replace("s = Settings()", "s = Settings(lock_owner=1)")
        assert subprocess.run([sys.executable, "-c", foreign], capture_output=True, check=False).returncode == 3
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert free.returncode == 0, free.stdout + free.stderr  # released: the empty series runs
    with pytest.raises(ValueError, match="idle_s"):
        asyncio.run(series.run_series([], settings, series_id="x", idle_s=-1))


def test_a_run_stored_before_the_layout_field_is_not_a_cell_of_todays_plan(tmp_path: Path) -> None:
    # such a run had one process per consumer; today's default (auto) runs tasks
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack")
    cell = Scenario(pipeline="wal", consumers=2, messages=300)
    old = _stored(settings, cell, "s1", ok=True, stamp="2026-01-01T00")
    params = dict(old["scenario"])
    del params["consumer_layout"]
    write_run({**old, "run_id": old["run_id"] + "-old", "scenario": params}, settings=settings)
    found = series._existing("s1", settings)
    assert len(found[cell]) == 1  # only the run that recorded auto
    assert len(found[cell.replace(consumer_layout="processes")]) == 1


def test_a_series_resumes_only_runs_of_its_own_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings().replace(data_dir=tmp_path, stack_dir=tmp_path / "stack", topology="ha")
    cell = Scenario(messages=300, senders=20, cooldown_s=0.0, pipeline="rabbitmq", consumers=2)
    write_run({"run_id": "single-run", "started_at": "2026-01-01T00", "scenario": cell.as_parameters(),
               "success": True, "cpu_ms_per_msg": 1.0, "series_id": "same-id", "topology": "single"},
              settings=settings)  # the same id given by hand to a single-topology series
    ran: list[Scenario] = []

    async def recorder(scenario: Scenario, settings: Settings, *, progress: Any = None,
                       meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None) -> dict[str, Any]:
        ran.append(scenario)
        return {"run_id": "new", "scenario": scenario.as_parameters(), "success": True, "topology": "ha",
                "cpu_ms_per_msg": 1.0, "window_s": 1.0,
                **(meta or {})}

    monkeypatch.setattr(lab.runner, "run_scenario", recorder)
    asyncio.run(series.run_series([cell], settings, series_id="same-id"))
    assert ran == [cell]  # the single run is not this cell's
    ran.clear()
    asyncio.run(series.run_series([cell], settings.replace(topology="single"), series_id="same-id"))
    assert ran == []  # under single it is
