"""One sitting as a small record: what a report measured, kept for good (``data/sittings/<id>.json``).

A sitting is one series on one machine at one time: a sample of that machine, not of "the"
answer. The machine's speed moves within a sitting and machines differ 2–3× from day to day, so a
figure holds only when it holds across sittings (:mod:`lab.study.ledger` reads them together).
:func:`build` turns the stored runs of a series into a record of a few kB, no raw samples:

* ``machine`` and ``quiet`` — where and how undisturbed: CPU model, cores, memory, a hash of the
  machine id; steal, the ``unattributed`` residual, the speed probe's unit time (its spread within
  the sitting), the drift probe;
* ``runs`` — every successful measured and volume-arm run: cell, block, ms CPU per message (raw and
  speed-normalised), the run's own split (steady c, fixed F), the parts a team can carry to its own
  stack (PostgreSQL's walsenders and claims, consumers, Debezium, the broker), the claim table's size,
  autovacuum inside the run, and the run's ``condition`` read from its recorded scenario
  (:func:`condition`: ``""``, the plain one, or a second condition such as ``"claims pruned"``);
* ``cells`` — each cell (pipeline, condition, N, volume) with its median, its order-statistic
  interval and that interval's coverage;
* ``pairs`` and ``crossings`` — broker − direct in the same block at the same N (adjacent runs
  when the profile is paired), per condition, and the measured crossing read from them: between the
  two measured N whose difference changes sign, never beyond the measured N; on three bases: the
  whole window (``diff``), speed-normalised (``diff_norm``) and each run's steady part
  (``diff_steady``, the steady c of :mod:`lab.measure.steady`: no start cost, the basis of a sitting
  at a fixed rate; records written before it lack it). A second condition has cells and a crossing
  of its own beside the plain ones, which read as they did without it; a record written before
  conditions were kept apart reads as plain;
* ``model`` — from the plain condition's runs: the quick model (5,000 messages and a volume arm at
  20,000, F as a line in N) and its prediction for every cell measured at another volume, with the
  prediction error; the modelled N* by volume over the plausible models; N*∞ from each run's own
  timeline and from the fit across volumes;
* ``rates`` — the load staircases' floors (CPU/s = a + b·rate) when the report ran them.

Every number is rounded to what it can carry. Pure: the caller loads the runs
(:func:`lab.results.load_runs`) and the machine facts (:func:`lab.measure.provenance.machine_facts`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lab.study import costmodel, crossover, refit
from lab.study.costmodel import METRIC
from lab.study.intervals import order_coverage

SCHEMA = 1
NORM = "cpu_ms_per_msg_norm"
UNIT = "speed.unit_ms_median"
# The parts a team can carry to its own stack, ms CPU per message of the run (``cpu_s.<name>`` and
# PostgreSQL's backends ``pg.<group>``, lab.measure.pgbackends)
PARTS = ("postgres", "pg.walsenders", "pg.claims", "pg.prune", "pg.inserts", "consumers", "debezium", "kafka",
         "rabbitmq", "web", "senders", "relay")
CLAIM_TABLES = ("inbox_wal", "inbox")
RETENTION_WORDS = {"never": "never pruned (truncated before each run)",  # Scenario.claim_retention
                   "behind-slots": "pruned behind every slot's confirmed position (lab.workload.retention)"}
# A second condition of the answer, by the Scenario field and value that set it, and its short name:
# a run measured under it is a cell of its own ("" is the plain condition, the reference study's)
CONDITIONS = {("claim_retention", "behind-slots"): "claims pruned"}
PLAIN = ""
MODEL_VOLUME = 5_000  # the quick model's main volume; its arm is at 20,000 (lab.study.series)
PREDICT_AT = (100_000,)


def condition(scenario: Mapping[str, Any]) -> str:
    """The condition a run was measured under, from its recorded scenario (run.json's ``scenario``,
    or a row of :func:`lab.results.load_runs`): ``"claims pruned"`` under the claim retention
    ``behind-slots``, ``""`` (plain) without one or for a run stored before the field existed; a
    retention not named in :data:`CONDITIONS` gets ``"claims <mode>"``."""
    for (name, value), named in CONDITIONS.items():
        if scenario.get(name) == value:
            return named
    retention = scenario.get("claim_retention")
    return f"claims {retention}" if isinstance(retention, str) and retention not in ("", "never") else PLAIN


def _r(x: Any, digits: int = 4) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if not math.isfinite(v) else round(v, digits)


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    if runs.empty:
        return runs
    ok = runs[runs["success"].fillna(False).astype(bool)] if "success" in runs else runs
    return ok[ok[METRIC].notna()] if METRIC in ok else ok.iloc[0:0]


def _labels(runs: pd.DataFrame) -> pd.Series:
    return runs["label"].fillna("").astype(str) if "label" in runs else pd.Series("", index=runs.index)


def main_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The successful measured runs (no warm-up, drift probe or volume arm)."""
    return costmodel.measured(_ok(runs)) if not runs.empty else runs


def arm_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The successful runs of the volume arms."""
    return crossover.volume_arm(_ok(runs))


# -- runs ---------------------------------------------------------------------------------------

def _claim_table(run: Mapping[str, Any]) -> dict[str, Any]:
    """The claim table after the run (run.json's ``vacuum``): rows, dead tuples, heap and index
    bytes, the primary key's depth; and where the direct readers counted it
    (``pipeline_settings.claim_table``) the rows ``left`` exactly, the most it held and the claims
    pruned (``rows`` is PostgreSQL's estimate, which a prune leaves behind)."""
    vac = run.get("vacuum") if isinstance(run.get("vacuum"), Mapping) else {}
    end = ((vac or {}).get("tables") or {}).get("end") or {}
    sizes = (vac or {}).get("sizes") or {}
    counted = (run.get("pipeline_settings") or {}).get("claim_table") or {}
    for name in CLAIM_TABLES:
        t = end.get(name)
        if isinstance(t, Mapping) and t.get("n_live_tup"):
            out = {"table": name, "rows": int(t["n_live_tup"]), "dead": int(t.get("n_dead_tup") or 0)}
            if name == "inbox_wal" and isinstance(counted, Mapping) and counted.get("rows") is not None:
                out |= {"left": int(counted["rows"]), "rows_max": int(counted.get("rows_max") or 0),
                        "pruned": int(counted.get("pruned") or 0)}
            return out | {k: v for k, v in (sizes.get(name) or {}).items() if k in
                          ("index_bytes", "heap_bytes", "index_depth")}
    return {}


def _autovacuum(run: Mapping[str, Any]) -> dict[str, Any]:
    """Autovacuum from the gate to the consumers' exit (run.json's ``vacuum``): how many times it
    ran over the lab's tables and its workers' CPU-seconds as the polls saw them (a lower bound;
    None where not read); where the run read the server's log, the actions inside the window and
    the CPU PostgreSQL gave for them (``log_actions``, ``log_cpu_s``: exact to 10 ms an action)."""
    vac = run.get("vacuum") if isinstance(run.get("vacuum"), Mapping) else None
    if not vac or not isinstance(vac.get("delta"), Mapping):
        return {}
    count = sum(float((t or {}).get("autovacuum_count") or 0) for t in vac["delta"].values())
    auto = vac.get("autovacuum") or {}
    out = {"count": int(count), "cpu_s": _r(auto.get("cpu_s"), 3)}
    logged = auto.get("from_log")
    if isinstance(logged, Mapping):
        out |= {"log_actions": int(logged.get("actions") or 0), "log_cpu_s": _r(logged.get("cpu_s"), 3)}
    return out


def run_rows(runs: pd.DataFrame, raw: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The record's runs: measured and volume-arm runs in series order, each with its condition
    (:func:`condition`), its block (the how-many-th run of its cell), its figure, split and parts;
    ``raw`` (run id → run.json) adds the claim table's size and autovacuum inside the run."""
    ok = _ok(runs)
    labels = _labels(ok)
    keep = ok[(~ok["warmup"].fillna(False).astype(bool)) | (labels == "volume")] if "warmup" in ok else ok
    order = "series_index" if "series_index" in keep else "started_at"
    keep = keep.sort_values(order)
    seen: dict[tuple[Any, ...], int] = {}
    out = []
    for _, r in keep.iterrows():
        cond = condition(r)
        key = (r["pipeline"], int(r["consumers"]), int(r["messages"]), _labels(keep).get(r.name, ""), cond)
        block = seen.get(key, 0)
        seen[key] = block + 1
        m = float(r["messages"])
        parts = {p: _r(1000 * float(r[f"cpu_s.{p}"]) / m) for p in PARTS
                 if not p.startswith("pg.") and f"cpu_s.{p}" in r and pd.notna(r[f"cpu_s.{p}"])}
        parts |= {p: _r(1000 * float(r[p]) / m) for p in PARTS if p.startswith("pg.") and p in r and pd.notna(r[p])}
        parts = {k: v for k, v in parts.items() if v is not None and abs(v) >= 0.0005}  # idle brokers' crumbs
        placed = r.get("series_block")
        row = {
            "index": int(r[order]) if order == "series_index" and pd.notna(r[order]) else None,
            **({"series_block": int(placed)} if placed is not None and pd.notna(placed) else {}),
            "pipeline": r["pipeline"], "condition": cond, "consumers": int(r["consumers"]), "messages": int(m),
            "arm": bool(key[3] == "volume"), "block": block, "ms": _r(r[METRIC]),
            "norm": _r(r.get(NORM)), "unit_ms": _r(r.get(UNIT), 3),
            "steady_ms": _r(r.get("steady_ms_per_msg")), "fixed_cpu_s": _r(r.get("fixed_cpu_s"), 3),
            "window_s": _r(r.get("window_s"), 2), "parts": parts,
        }
        run = (raw or {}).get(str(r.get("run_id")), {})
        claim = _claim_table(run)
        if claim:
            row["claim_table"] = claim
        vacuumed = _autovacuum(run)
        if vacuumed:
            row["autovacuum"] = vacuumed
        out.append(row)
    return out


def plain_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows (runs, cells, pairs or crossings of a record) of the plain condition; a record
    written before conditions were kept apart has only those."""
    return [r for r in rows if not r.get("condition")]


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["condition"].fillna(PLAIN) == PLAIN] if "condition" in frame else frame


def runs_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The record's runs back as a frame with the column names the cost model reads
    (``cpu_ms_per_msg``, ``steady_ms_per_msg``, ``fixed_cpu_s``, ``label`` ``volume`` for the arm)."""
    df = pd.DataFrame(list(rows))
    if df.empty:
        return pd.DataFrame(columns=["pipeline", "consumers", "messages", METRIC, "success", "warmup", "label"])
    return df.assign(**{METRIC: df["ms"], "steady_ms_per_msg": df.get("steady_ms"),
                        "fixed_cpu_s": df.get("fixed_cpu_s"), NORM: df.get("norm"), "success": True,
                        "warmup": df["arm"], "label": np.where(df["arm"], "volume", "")})


# -- cells and pairs ----------------------------------------------------------------------------

def _conditioned(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``condition`` column (plain where missing: rows written before it)."""
    return frame.assign(condition=frame["condition"].fillna(PLAIN) if "condition" in frame else PLAIN)


def cells(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each cell (pipeline, condition, N, messages, arm): median of its runs, [min, max] and the
    coverage of that interval for the median (order statistics: 50 % with 2 runs, 75 % with 3)."""
    out: list[dict[str, Any]] = []
    if frame.empty:
        return out
    for (p, cond, n, m, arm), g in _conditioned(frame).groupby(["pipeline", "condition", "consumers", "messages",
                                                                 "arm"], sort=True):
        v = g["ms"].to_numpy(float)
        out.append({"pipeline": p, "condition": cond, "consumers": int(n), "messages": int(m), "arm": bool(arm),
                    "runs": len(v),
                    "median": _r(np.median(v)), "lo": _r(v.min()), "hi": _r(v.max()),
                    "coverage": _r(order_coverage(len(v), 1), 3) if len(v) > 1 else None})
    return out


def pairs(frame: pd.DataFrame, direct: Sequence[str], brokers: Sequence[str]) -> list[dict[str, Any]]:
    """broker − direct, ms CPU per message, for every block in which both ran at the same N and
    volume (main runs only), raw (``diff``), speed-normalised (``diff_norm``) and of the runs'
    steady parts (``diff_steady``: start and drain left out; None where a run has no split), per
    condition: a condition only one side ran under (the claims pruned: a direct reader's) is paired
    with the other side's plain run;
    ``gap`` is how many runs apart they ran (1: back to back)."""
    out = []
    main = _conditioned(frame[~frame["arm"]]) if not frame.empty else frame
    for (n, m, block), g in main.groupby(["consumers", "messages", "block"], sort=True):
        by = {(r["pipeline"], r["condition"]): r for _, r in g.iterrows()}
        for b, d, cond in itertools.product(brokers, direct, sorted({c for _, c in by})):
            rd, rb = by.get((d, cond)), by.get((b, cond))
            if cond != PLAIN and (rd is None) != (rb is None):  # one side's condition: the other's plain run
                rd = rd if rd is not None else by.get((d, PLAIN))
                rb = rb if rb is not None else by.get((b, PLAIN))
            if rd is None or rb is None:
                continue
            gap = (abs(int(rb["index"]) - int(rd["index"]))
                   if pd.notna(rb.get("index")) and pd.notna(rd.get("index")) else None)
            out.append({"direct": d, "broker": b, "condition": cond, "consumers": int(n), "messages": int(m),
                        "block": int(block), "diff": _r(rb["ms"] - rd["ms"]), "ratio": _r(rb["ms"] / rd["ms"], 3),
                        "diff_norm": _r(rb["norm"] - rd["norm"]) if pd.notna(rb.get("norm"))
                        and pd.notna(rd.get("norm")) else None,
                        "diff_steady": _r(rb["steady_ms"] - rd["steady_ms"]) if pd.notna(rb.get("steady_ms"))
                        and pd.notna(rd.get("steady_ms")) else None, "gap": gap})
    return out


def crossing_from(diffs: Mapping[int, Sequence[float]]) -> dict[str, Any]:
    """The measured crossing from broker − direct differences per measured N (each N's pairs):
    the broker pays off where the difference turns ≤ 0. ``between`` is the first pair of adjacent
    measured N whose median differences change sign from > 0 to ≤ 0, ``at`` the linear
    interpolation of those medians' zero between them; ``below`` when the broker is already cheaper
    at the smallest N; ``beyond`` when it is dearer at every measured N (no crossing up to the
    largest). ``clear``: every pair at both ends of ``between`` has the sign of its median (the runs'
    spread does not reach across zero). ``monotone``: the sign changes once at most."""
    ns = sorted(n for n, v in diffs.items() if len(v))
    med = {n: float(np.median(diffs[n])) for n in ns}
    out: dict[str, Any] = {"ns": ns, "median_diff": {str(n): _r(med[n]) for n in ns},
                           "between": None, "at": None, "below": False, "beyond": False, "clear": None,
                           "monotone": True}
    if not ns:
        return out
    signs = [med[n] > 0 for n in ns]
    out["monotone"] = sum(a != b for a, b in _pairs(signs)) <= 1
    if not signs[0]:
        out["below"] = True
        out["clear"] = all(x <= 0 for x in diffs[ns[0]])
        return out
    for lo, hi in _pairs(ns):
        if med[lo] > 0 >= med[hi]:
            out["between"] = [lo, hi]
            out["at"] = _r(lo + (hi - lo) * med[lo] / (med[lo] - med[hi]), 2)
            out["clear"] = all(x > 0 for x in diffs[lo]) and all(x <= 0 for x in diffs[hi])
            return out
    out["beyond"] = True
    out["clear"] = all(x > 0 for x in diffs[ns[-1]])
    return out


def _pairs(seq: Sequence[Any]) -> list[tuple[Any, Any]]:
    return list(itertools.pairwise(seq))


def crossings(pair_rows: Iterable[Mapping[str, Any]], *, key: str = "diff") -> list[dict[str, Any]]:
    """:func:`crossing_from` for every (direct, broker, messages, condition) among ``pair_rows`` on
    the basis ``key``; none where no pair has it (a record written before the basis existed)."""
    df = pd.DataFrame(list(pair_rows))
    out: list[dict[str, Any]] = []
    if df.empty or key not in df:
        return out
    df = _conditioned(df.dropna(subset=[key]))
    for (d, b, m, cond), g in df.groupby(["direct", "broker", "messages", "condition"], sort=False):
        diffs = {int(n): gg[key].astype(float).tolist() for n, gg in g.groupby("consumers")}
        out.append({"direct": d, "broker": b, "messages": int(m), "condition": cond, "basis": key,
                    **crossing_from(diffs)})
    return out


# -- the model ----------------------------------------------------------------------------------

def model_base(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The quick model's inputs in this sitting: its runs at :data:`MODEL_VOLUME` (the main runs of
    a quick sitting, the arm's of a reference one) and its arm at any other volume but the main one;
    both empty where the sitting has no such pair of volumes."""
    runs = runs_frame(frame.to_dict("records")) if not frame.empty else runs_frame([])
    main = runs[~runs["warmup"]]
    arm = runs[runs["warmup"]]
    main_volume = int(main["messages"].mode().iloc[0]) if not main.empty else MODEL_VOLUME
    if main_volume == MODEL_VOLUME:
        return main, arm[arm["messages"] != MODEL_VOLUME]
    base = arm[arm["messages"] == MODEL_VOLUME].assign(warmup=False, label="")
    rest = arm[(arm["messages"] != MODEL_VOLUME)]
    if rest.empty:  # an arm at 5,000 messages alone (the conditions profile's) is not the quick model
        return base.iloc[0:0], rest
    return base, rest


def predictions(frame: pd.DataFrame, *, volumes: Sequence[float] = PREDICT_AT) -> tuple[list[dict[str, Any]],
                                                                                       list[dict[str, Any]]]:
    """The quick model's F lines (F(N) = f0 + f1·(N − 1) CPU-s per start) and its prediction of every
    (pipeline, N) at ``volumes``: the median over the model's runs of c + F(N)/M, beside the measured
    median at that volume when this sitting measured it, and the error in %."""
    base, arm = model_base(frame)
    if base.empty or arm.empty:
        return [], []
    lines = crossover.fixed_lines(base, arm)
    if lines.empty:
        return [], []
    fixed = [{"pipeline": r.pipeline, "f0": _r(r.f0, 3), "f1": _r(r.f1, 4), "fitted_at": list(r.fitted_at),
              "volumes": sorted({int(MODEL_VOLUME), *(int(x) for x in arm["messages"].unique())})}
             for r in lines.itertuples()]
    main = frame[~frame["arm"]] if not frame.empty else frame
    out = []
    for m in volumes:
        moved = crossover.at_volume_lines(base, lines, m)
        for (p, n), g in moved.groupby(["pipeline", "consumers"]):
            row = {"pipeline": p, "consumers": int(n), "messages": int(m), "predicted": _r(g[METRIC].median())}
            meas = main[(main["pipeline"] == p) & (main["consumers"] == n) & (main["messages"] == m)]
            if not meas.empty:
                mv = float(meas["ms"].median())
                row |= {"measured": _r(mv), "error_pct": _r(100 * (row["predicted"] - mv) / mv, 1)}
            out.append(row)
    return fixed, out


def _answers(answers: Iterable[crossover.Answer]) -> list[dict[str, Any]]:
    out = []
    for a in answers:
        r = a.range
        out.append({"direct": a.direct, "broker": a.broker, "condition": a.condition,
                    "range": [None if r is None or math.isinf(r[0]) else _r(r[0], 2),
                              None if r is None or math.isinf(r[1]) else _r(r[1], 2)],
                    "never": bool(r is not None and math.isinf(r[1])), "inside": a.measured,
                    "n_range": list(a.n_range), "models": len(a.models)})
    return out


def refitted(record: Mapping[str, Any], direct: str, broker: str) -> dict[float, tuple[float, float]]:
    """N*'s interval at each of :data:`lab.study.crossover.VOLUMES` with the quick model's F refitted
    in every draw (:mod:`lab.study.refit`), from the record's own runs; empty where F cannot be
    refitted (no arm for the pair). The plain condition's runs only, as the model's."""
    frame = pd.DataFrame(plain_rows(record.get("runs") or []))
    if frame.empty:
        return {}
    base, arm = model_base(frame)
    both = [direct, broker]
    b, a = base[base["pipeline"].isin(both)], arm[arm["pipeline"].isin(both)]
    if b.empty or set(a["pipeline"]) != set(both):
        return {}
    return refit.intervals(b, a, direct, broker, crossover.VOLUMES)


def series_blocks(rows: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """The block of the series each run ran in: the block the series stored with it
    (``series_block``) where it did. Otherwise a measured run's ``block``, the how-many-th run of its
    cell, is its series block (every block runs each cell once); an arm run's counts only its arm
    cell, so it is placed by its series index instead: in the last block begun before it (right for
    paired blocks, where a block's arm runs follow its cells at their N, and for an arm in the first
    block only; records written before ``series_block`` was kept are of those kinds). None where the
    index is missing too."""
    starts: dict[int, int] = {}
    for r in rows:
        if not r.get("arm") and r.get("index") is not None:
            b = int(r["block"])
            starts[b] = min(starts.get(b, int(r["index"])), int(r["index"]))
    out: list[int | None] = []
    for r in rows:
        if r.get("series_block") is not None:
            out.append(int(r["series_block"]))
        elif not r.get("arm"):
            out.append(int(r["block"]))
        elif r.get("index") is None or not starts:
            out.append(None)
        else:
            out.append(max((b for b, s in starts.items() if s <= int(r["index"])), default=min(starts)))
    return out


def refitted_by_block(record: Mapping[str, Any], direct: str, broker: str) -> dict[str, Any]:
    """N* at each of :data:`lab.study.crossover.VOLUMES` with F refitted from each block's own
    volumes and by a block bootstrap (:func:`lab.study.refit.by_block`), from the record's plain
    runs; empty unless two or more blocks ran both pipelines at two volumes (a reference sitting: its
    5,000-message arm in one block and 20,000 in the other; a conditions or a quick sitting: its arm
    in both)."""
    rows = [dict(r) for r in plain_rows(record.get("runs") or [])]
    if not rows:
        return {}
    for r, b in zip(rows, series_blocks(rows), strict=True):
        r["block"] = b
    frame = runs_frame(rows)
    return refit.by_block(frame, direct, broker, crossover.VOLUMES)


def modelled(frame: pd.DataFrame, direct: Sequence[str], brokers: Sequence[str], *, n_boot: int,
             seed: int) -> dict[str, list[dict[str, Any]]]:
    """The modelled N*: by volume with the quick model (its F lines), at ∞ from each main run's own
    timeline, and at ∞ from the fit across volumes where every cell ran at two or more volumes."""
    base, arm = model_base(frame)
    out: dict[str, list[dict[str, Any]]] = {"by_volume": [], "steady_in_runs": [], "steady_across_volumes": []}
    runs = runs_frame(frame.to_dict("records")) if not frame.empty else runs_frame([])
    main = runs[~runs["warmup"]]
    for b in brokers:
        for d in direct:
            with contextlib.suppress(ValueError, KeyError):
                if not base.empty:
                    out["by_volume"] += _answers(crossover.by_volume(base, d, b, arm=arm, n_boot=n_boot, seed=seed))
            with contextlib.suppress(ValueError, KeyError):
                steady = crossover.at_volume(main, math.inf)
                if not steady.empty:
                    out["steady_in_runs"] += _answers([crossover.crossings(
                        steady, d, b, condition="M = ∞, each run's own timeline", n_boot=n_boot, seed=seed)])
            with contextlib.suppress(ValueError, KeyError):
                both = runs.assign(warmup=False)
                fits = crossover.volume_fit(both[both["pipeline"].isin([d, b])])
                cells_n = both[both["pipeline"].isin([d, b])].groupby(["pipeline", "consumers"]).ngroups
                if not fits.empty and len(fits) == cells_n:
                    out["steady_across_volumes"] += _answers([crossover.crossings(
                        crossover.at_volume_fit(fits, math.inf), d, b, condition="M = ∞, fitted across volumes",
                        n_boot=n_boot, seed=seed)])
    return out


# -- quietness ----------------------------------------------------------------------------------

def quiet(runs: pd.DataFrame) -> dict[str, Any]:
    """How undisturbed the sitting was: steal (%), the unattributed residual (ms/msg), the speed
    probe's unit (ms: median, min, max and max ÷ min over the sitting's runs), the runs flagged slow,
    the load average, the drift probe's change (%)."""
    ok = _ok(runs)
    out: dict[str, Any] = {}
    if ok.empty:
        return out
    if "steal_pct" in ok:
        steal = pd.to_numeric(ok["steal_pct"], errors="coerce").dropna()
        out |= {"steal_pct_median": _r(steal.median(), 2), "steal_pct_max": _r(steal.max(), 2)} if len(steal) else {}
    if "cpu_s.unattributed" in ok:
        un = 1000 * pd.to_numeric(ok["cpu_s.unattributed"], errors="coerce") / ok["messages"].astype(float)
        out["unattributed_ms_median"] = _r(un.median())
    if UNIT in ok:
        unit = pd.to_numeric(ok[UNIT], errors="coerce").dropna()
        if len(unit):
            out["speed_unit_ms"] = {"median": _r(unit.median(), 3), "min": _r(unit.min(), 3),
                                    "max": _r(unit.max(), 3), "max_over_min": _r(unit.max() / unit.min(), 2)}
            out["slow_runs"] = int((unit > 1.25 * unit.median()).sum())
    if "loadavg_1m" in ok:
        out["loadavg_1m_max"] = _r(pd.to_numeric(ok["loadavg_1m"], errors="coerce").max(), 2)
    with contextlib.suppress(KeyError, ValueError, ZeroDivisionError):
        # the probe repeats a plain cell; a second condition's runs are never pooled with it (lab.study.groups)
        d = costmodel.drift(ok[[condition(r) == PLAIN for _, r in ok.iterrows()]])
        if not d.empty:
            out["drift_pct"] = _r(d["cpu_change_pct"].iloc[0], 1)
    return out


# -- the record ---------------------------------------------------------------------------------

def build(runs: pd.DataFrame, *, sitting_id: str, profile: str, series_id: str, machine: Mapping[str, Any],
          raw: Mapping[str, Mapping[str, Any]] | None = None, capacity: Iterable[Mapping[str, Any]] = (),
          wall_min: float | None = None, n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """The sitting record of one series' stored runs (:func:`lab.results.load_runs` rows of that
    series, failed and warm-up runs included: they are counted, not used). ``capacity``: the run.json
    of the load staircases run beside it (their floors per second)."""
    from lab.study.crossover import rate_lines, sides

    all_ok = _ok(runs)
    rows = run_rows(runs, raw)
    frame = pd.DataFrame(rows)
    direct, brokers = sides(frame["pipeline"]) if not frame.empty else ([], [])
    pair_rows = pairs(frame, direct, brokers) if not frame.empty else []
    # the model is the plain condition's: a second condition's runs are cells, pairs and crossings of their own
    plain = _plain(frame)
    plain_sides = sides(plain["pipeline"]) if not plain.empty else ([], [])
    fixed, predicted = predictions(plain) if not plain.empty else ([], [])
    main = frame[~frame["arm"]] if not frame.empty else frame
    beside = sorted({str(c) for c in main["condition"]} - {PLAIN}) if not main.empty else []
    started = runs["started_at"].dropna().astype(str) if "started_at" in runs else pd.Series([], dtype=str)
    first = runs.iloc[0] if not runs.empty else pd.Series(dtype=object)
    git = {"commit": str(first.get("git_sha") or "")[:12] or None,
           "dirty": bool(runs["git_dirty"].fillna(False).astype(bool).any()) if "git_dirty" in runs else None}
    # the conditions are the measured runs': a series at a fixed rate warms up in closed loop
    measured_runs = all_ok[~all_ok["warmup"].fillna(False).astype(bool)] if "warmup" in all_ok else all_ok
    cond = measured_runs.iloc[0] if not measured_runs.empty else first
    scen = {k: cond.get(k) for k in ("senders", "rate", "consumer_layout", "reset", "claim", "producer",
                                     "work_delay_ms") if k in cond}
    record: dict[str, Any] = {
        "schema": SCHEMA, "id": sitting_id, "profile": profile, "series_id": series_id,
        "started_at": started.min()[:19] if len(started) else None,
        "ended_at": started.max()[:19] if len(started) else None,
        "day": started.min()[:10] if len(started) else None, "wall_min": _r(wall_min, 1),
        **git, "machine": dict(machine),
        "conditions": {**{k: (v.item() if hasattr(v, "item") else v) for k, v in scen.items()},
                       "backend": first.get("backend"), "topology": first.get("topology") or "single",
                       "claim_retention": RETENTION_WORDS.get(str(first.get("claim_retention") or "never"),
                                                              str(first.get("claim_retention"))),
                       "volumes": sorted({int(x) for x in main["messages"]}) if not main.empty else [],
                       "beside": beside},
        "counts": {"runs": len(runs), "successful": len(all_ok),
                   "failed": len(runs) - len(all_ok), "measured": len(main)},
        "quiet": quiet(runs),
        "runs": rows,
        "cells": cells(frame),
        "pairs": pair_rows,
        "crossings": [c for key in ("diff", "diff_norm", "diff_steady") for c in crossings(pair_rows, key=key)],
        "model": {"fixed": fixed, "predictions": predicted,
                  **modelled(plain, *plain_sides, n_boot=n_boot, seed=seed)},
    }
    lines = rate_lines(capacity)
    if not lines.empty:
        record["rates"] = [{"pipeline": r.pipeline, "consumers": int(r.consumers), "a_cpu_per_s": _r(r.a_cpu_per_s),
                            "b_ms_per_msg": _r(r.b_ms_per_msg)} for r in lines.itertuples()]
    return record


def from_store(series_id: str, *, profile: str, sitting_id: str, capacity_series_id: str = "",
               wall_min: float | None = None, settings: Any = None, n_boot: int = 200) -> dict[str, Any]:
    """:func:`build` on the stored runs of ``series_id`` (and the staircases of
    ``capacity_series_id``), with this machine's facts: the record a report writes."""
    from lab.measure.provenance import machine_facts
    from lab.results import iter_runs, load_runs

    runs = load_runs(settings=settings)
    if runs.empty or "series_id" not in runs or not (runs["series_id"] == series_id).any():
        raise ValueError(f"no stored run belongs to series {series_id!r}: nothing to record")
    runs = runs[runs["series_id"] == series_id].reset_index(drop=True)
    raw = {str(r["run_id"]): r for r in iter_runs(settings=settings)
           if r.get("series_id") in (series_id, capacity_series_id)}
    capacity = [r for r in raw.values() if capacity_series_id and r.get("series_id") == capacity_series_id]
    return build(runs, sitting_id=sitting_id, profile=profile, series_id=series_id, machine=machine_facts(),
                 raw=raw, capacity=capacity, wall_min=wall_min, n_boot=n_boot)
