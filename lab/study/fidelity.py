"""Against the article: our runs beside the published tables, read the same way.

Every function takes runs as :func:`lab.results.load_runs` returns them; the published side is the
same computation applied to :func:`lab.study.costmodel.published_runs` (the 16 measured runs of the
reference's final sweep) or to ``load_reference("throughput")`` (the published throughput table), so a
definition cannot differ between the two columns. Cells are medians over a cell's successful,
non-warm-up runs (each participant and each rate separately).

* :func:`article_crossover` / :func:`crossover_table` — N* the article's way: the
  slope is PostgreSQL's CPU alone, (pg at N=8 - pg at N=1) / 7 per extra reader; the broker is its
  total at N=8; N* = 1 + (broker_c8 - direct_c1) / slope. Beside it, our own crossover
  (:func:`lab.study.compare.crossover_table`).
* :func:`throughput_table` — the published throughput table: send/s, drain-only/s, claim statements
  per message, send p95.
* :func:`participants_table` — the published per-participant table: ms CPU/msg per participant in the article's columns
  (:data:`MAPPING`: its ``test`` is our senders + consumers + runner).
* :func:`agreement` — "where we agree": each participant of the article's breakdown cells and the
  main proportions, ours beside published, the ratio and whether the gap is over 10 %.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from lab.results import load_reference
from lab.study import compare, costmodel, crossover
from lab.study.costmodel import METRIC, measured
from lab.study.series import REFERENCE_PIPELINES

# The article's participant columns -> the participants of ours they cover.
MAPPING: dict[str, tuple[str, ...]] = {
    "postgres": ("postgres",),
    "kafka": ("kafka",),
    "rabbitmq": ("rabbitmq",),  # the bench's `rmq` container
    "debezium": ("debezium",),  # its `dbz-kafka` / `dbz-quorum` container, whichever ran
    "web": ("web",),
    "test": ("senders", "consumers", "runner"),  # its one load-test process
}
SOURCES = {  # what each column is on the reference's stand
    "postgres": "postgres container", "kafka": "kafka container", "rabbitmq": "rmq container",
    "debezium": "dbz-kafka or dbz-quorum container", "web": "the ASP.NET web process",
    "test": "the .NET load-test process (senders and consumers as tasks)",
}
GAP = 0.10  # the article's noise level (a measured 10 % drift)


def mapping_table() -> pd.DataFrame:
    """The article's columns, what each was on its stand, and which of our participants it sums.
    ``unattributed`` (host CPU outside every participant) is in neither total."""
    return pd.DataFrame(
        [dict(article=k, reference_stand=SOURCES[k], ours=" + ".join(v)) for k, v in MAPPING.items()]
        + [dict(article="sum", reference_stand="all of the above",
                ours="cpu_ms_per_msg (all of the above)")]
    ).set_index("article")


def _ms(runs: pd.DataFrame, participant: str) -> pd.Series:
    """A column of the article (``MAPPING`` key) in ms CPU/msg per run; NaN where not recorded."""
    if f"cpu_s.{participant}" in runs:  # the published runs carry `test` as such
        cpu = pd.to_numeric(runs[f"cpu_s.{participant}"], errors="coerce")
    else:
        cols = [f"cpu_s.{p}" for p in MAPPING[participant] if f"cpu_s.{p}" in runs]
        cpu = runs[cols].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1) if cols else np.nan
    return pd.Series(cpu, index=runs.index, dtype=float) * 1000 / runs["messages"]


def cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N: runs, median total ms CPU/msg (``total``) and the median of each article column
    (ms CPU/msg), over the successful, non-warm-up runs."""
    ok = measured(runs)
    if ok.empty:
        return pd.DataFrame(columns=["pipeline", "consumers", "runs", "total", *MAPPING])
    per_run = ok[["pipeline", "consumers"]].assign(total=pd.to_numeric(ok[METRIC]),
                                                   **{p: _ms(ok, p) for p in MAPPING})
    out = per_run.groupby(["pipeline", "consumers"]).median()
    out.insert(0, "runs", per_run.groupby(["pipeline", "consumers"]).size())
    return out.reset_index()


def _cell(c: pd.DataFrame, pipeline: str, n: int, col: str) -> float:
    hit = c[(c["pipeline"] == pipeline) & (c["consumers"] == n)]
    return float(hit[col].iloc[0]) if len(hit) and pd.notna(hit[col].iloc[0]) else math.nan


def article_crossover(runs: pd.DataFrame, direct: str = "wal", broker: str = "kafka", *,
                      lo: int = 1, hi: int = 8) -> dict[str, Any]:
    """N* the article's way from one set of runs.

    ``slope_pg`` = (PostgreSQL ms/msg at N=``hi`` - at N=``lo``) / (hi - lo) on the direct
    pipeline; ``level`` = the broker pipeline's total at N=``hi``; N* = lo + (level - direct total
    at N=lo) / slope_pg. ``slope_total`` is the same rise on the direct pipeline's total, for
    comparison. NaN where an input cell is missing (``missing`` names them) or the slope is not
    positive. Medians per cell.
    """
    c = cells(runs)
    got = dict(pg_lo=_cell(c, direct, lo, "postgres"), pg_hi=_cell(c, direct, hi, "postgres"),
               direct_lo=_cell(c, direct, lo, "total"), direct_hi=_cell(c, direct, hi, "total"),
               level=_cell(c, broker, hi, "total"))
    need = {"pg_lo": f"{direct} N={lo}", "pg_hi": f"{direct} N={hi}", "level": f"{broker} N={hi}"}
    missing = sorted({where for k, where in need.items() if math.isnan(got[k])})
    slope = (got["pg_hi"] - got["pg_lo"]) / (hi - lo)
    n_star = lo + (got["level"] - got["direct_lo"]) / slope if slope > 0 else math.nan
    return dict(direct=direct, broker=broker, **got, slope_pg=slope,
                slope_total=(got["direct_hi"] - got["direct_lo"]) / (hi - lo), n_star=n_star,
                missing=", ".join(missing) or None)


def crossover_table(runs: pd.DataFrame, *, crossing: pd.DataFrame | None = None, n_boot: int = 2000,
                    seed: int = 0) -> pd.DataFrame:
    """Direct x broker: N* the article's way, ours and published (with their inputs), beside our own
    crossover (``crossing`` = :func:`lab.study.compare.crossover_table` of ``runs``, computed when
    not given): N* fitted on N <= 8, on every N, and the first measured N where direct >= broker.
    One row per measured direct pipeline x each broker, measured or not; ``missing_ours``
    names the cells the article's recipe needed and did not find."""
    if crossing is None:
        crossing = compare.crossover_table(runs, n_boot=n_boot, seed=seed)
    mine = {(r["direct"], r["broker"]): r for r in crossing.to_dict("records")}
    published = costmodel.published_runs()
    have = set(measured(runs)["pipeline"]) if len(runs) else set()
    rows = []
    # ours beside the article's: every direct pipeline we measured against each broker it measured
    direct, brokers = crossover.sides(have)[0], crossover.sides(REFERENCE_PIPELINES)[1]
    for d, b in ((d, b) for d in direct for b in brokers):
        ours, pub = article_crossover(runs, d, b), article_crossover(published, d, b)
        row: dict[str, Any] = dict(direct=d, broker=b)
        for k in ("pg_lo", "pg_hi", "slope_pg", "slope_total", "direct_lo", "level", "n_star"):
            row[f"{k}_ours"], row[f"{k}_published"] = ours[k], pub[k]
        row["missing_ours"] = ours["missing"]
        row |= {k: mine.get((d, b), {}).get(k, math.nan)
                for k in ("n_star_upto8", "n_star_all", "first_measured_n", "verdict")}
        rows.append(row)
    return pd.DataFrame(rows)


# throughput and correctness (the published throughput table) ---------------------------------

RATES = ("send_per_s", "drain_only_per_s", "ops_per_msg", "send_p95_ms")


def throughput_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Per measured run, the columns of the reference's throughput table, defined the same way:

    ``produce_s`` = last send - first send (the senders' monotonic clock), ``send_per_s`` = sent /
    produce_s; ``drain_s`` = last work - first send (= our window); ``drain_only_s`` = last work -
    last send and ``drain_only_per_s`` = **all** processed / drain_only_s, the reference's
    definition (not a capacity: it grows as the tail shrinks); ``ops_per_msg`` = claim statements
    / processed; ``send_p95_ms`` = the senders' p95 of successful sends.
    """
    ok = measured(runs)

    def col(name: str) -> pd.Series:
        return pd.to_numeric(ok[name], errors="coerce") if name in ok else pd.Series(np.nan, index=ok.index)

    produce = col("senders.last_send_mono") - col("senders.first_send_mono")
    drain = col("window_s")
    tail = (drain - produce).where(lambda s: s > 0)
    processed = col("processed")
    return pd.DataFrame({
        "run_id": ok["run_id"], "pipeline": ok["pipeline"], "consumers": ok["consumers"],
        "produce_s": produce, "send_per_s": col("sent") / produce.where(produce > 0),
        "drain_s": drain, "drain_per_s": processed / drain, "drain_only_s": tail,
        "drain_only_per_s": processed / tail, "ops_per_msg": col("db_ops") / processed.clip(lower=1),
        "send_p95_ms": col("senders.send_p95_ms"),
    }).reset_index(drop=True)


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N: our median of each published throughput column beside the published value (one run per cell,
    100,000 messages) and their ratio (``<col>``, ``<col>_published``, ``<col>_ratio``)."""
    t = throughput_runs(runs)
    ours = t.groupby(["pipeline", "consumers"]).median(numeric_only=True)
    ours.insert(0, "runs", t.groupby(["pipeline", "consumers"]).size())
    ref = load_reference("throughput")
    ref = ref[~ref["warmup"].astype(bool)].set_index(["pipeline", "consumers"])
    cols = ["produce_s", "send_per_s", "drain_s", "drain_per_s", "drain_only_s", "drain_only_per_s",
            "ops_per_msg", "send_p95_ms"]
    out = ours[["runs"]].copy()
    for c in cols:
        out[c] = ours[c]
        out[f"{c}_published"] = ref[c].reindex(out.index)
        out[f"{c}_ratio"] = out[c] / out[f"{c}_published"]
    return out.reset_index()


# CPU per participant (the published per-participant table) -----------------------------------

def participants_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Pipeline x N x article column (plus ``sum``): our median ms CPU/msg beside the published one
    (published CPU-seconds / 100,000 messages), their ratio, and which of our participants it sums."""
    ours, pub = cells(runs), cells(costmodel.published_runs())
    key = ["pipeline", "consumers"]
    both = ours.merge(pub, on=key, how="left", suffixes=("", "_published"))
    rows = []
    for r in both.to_dict("records"):
        for col, name in [*((p, p) for p in MAPPING), ("total", "sum")]:
            mine, theirs = r[col], r[f"{col}_published"]
            rows.append(dict(pipeline=r["pipeline"], consumers=r["consumers"], participant=name,
                             ours=mine, published=theirs, ratio=mine / theirs if theirs else math.nan,
                             ours_from=" + ".join(MAPPING.get(col, ("all",)))))
    return pd.DataFrame(rows, columns=["pipeline", "consumers", "participant", "ours", "published", "ratio",
                                       "ours_from"])


def participants_wide(long: pd.DataFrame, *, digits: int = 2) -> pd.DataFrame:
    """:func:`participants_table` as one row per pipeline x N and a column per participant, each
    cell "ours (published)" in ms CPU/msg; "-" where a side has no value."""
    def fmt(v: float) -> str:
        return "-" if pd.isna(v) else f"{v:.{digits}f}"

    pairs = zip(long["ours"], long["published"], strict=True)
    text = long.assign(cell=[f"{fmt(a)} ({fmt(b)})" for a, b in pairs])
    order = list(dict.fromkeys(long["participant"]))
    return text.pivot(index=["pipeline", "consumers"], columns="participant", values="cell")[order]


# Where we agree --------------------------------------------------------------------------------

# the article's per-participant breakdown cells (wal c1 and kafka c1) and the quorum
# arm's, with the participants that do work there (an idle broker's few CPU-seconds are no ratio)
BREAKDOWN = {("wal", 1): ("postgres", "web", "test"),
             ("kafka", 1): ("postgres", "debezium", "kafka", "web", "test"),
             ("rabbitmq", 1): ("postgres", "debezium", "rabbitmq", "web", "test")}


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def _proportions(c: pd.DataFrame) -> list[tuple[str, str, str, float]]:
    """(quantity, its definition, unit, value) for the main proportions of a cell table."""
    def v(p: str, n: int, col: str = "total") -> float:
        return _cell(c, p, n, col)

    return [
        ("Debezium→Kafka infra over direct WAL, c1", "kafka c1 total − wal c1 total", "ms/msg",
         v("kafka", 1) - v("wal", 1)),
        ("Debezium→Kafka against direct WAL, c1", "kafka c1 total / wal c1 total", "×",
         _div(v("kafka", 1), v("wal", 1))),
        ("Debezium + Kafka broker, kafka c1", "debezium + kafka", "ms/msg",
         v("kafka", 1, "debezium") + v("kafka", 1, "kafka")),
        ("Debezium against the Kafka broker, kafka c1", "debezium / kafka", "×",
         _div(v("kafka", 1, "debezium"), v("kafka", 1, "kafka"))),
        ("PostgreSQL's growth with N, wal c1→c8", "postgres c8 / postgres c1", "×",
         _div(v("wal", 8, "postgres"), v("wal", 1, "postgres"))),
        ("PostgreSQL per extra reader, wal c1→c8", "(postgres c8 − c1) / 7", "ms/msg",
         (v("wal", 8, "postgres") - v("wal", 1, "postgres")) / 7),
        ("Whole wal pipeline per extra reader, c1→c8", "(total c8 − c1) / 7", "ms/msg",
         (v("wal", 8) - v("wal", 1)) / 7),
        ("RabbitMQ arm against Kafka arm, c1", "rabbitmq c1 total / kafka c1 total", "×",
         _div(v("rabbitmq", 1), v("kafka", 1))),
        ("RabbitMQ arm against Kafka arm, c8", "rabbitmq c8 total / kafka c8 total", "×",
         _div(v("rabbitmq", 8), v("kafka", 8))),
        ("RabbitMQ broker against Kafka broker, own arms c1", "rabbitmq (rabbitmq c1) / kafka (kafka c1)",
         "×", _div(v("rabbitmq", 1, "rabbitmq"), v("kafka", 1, "kafka"))),
    ]


def _quantities(c: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for (p, n), parts in BREAKDOWN.items():
        for part in (*parts, "total"):
            rows.append(dict(kind="participant", quantity=f"{'sum' if part == 'total' else part}, {p} c{n}",
                             definition=" + ".join(MAPPING.get(part, ("all participants",))), unit="ms/msg",
                             value=_cell(c, p, n, part)))
    for name, definition, unit, value in _proportions(c):
        rows.append(dict(kind="proportion", quantity=name, definition=definition, unit=unit, value=value))
    return rows


def agreement(runs: pd.DataFrame, *, gap: float = GAP) -> pd.DataFrame:
    """Each participant of the article's breakdown cells (wal, kafka, rabbitmq at N=1) and the main
    proportions (Debezium→Kafka against direct WAL, PostgreSQL's growth with N, Debezium against the
    Kafka broker, the RabbitMQ arm against Kafka) plus N* the article's way: ours, published,
    ours / published, and ``over_gap``: |ratio - 1| > ``gap`` (NA where ours is missing)."""
    ours, pub = _quantities(cells(runs)), _quantities(cells(costmodel.published_runs()))
    x_ours, x_pub = article_crossover(runs), article_crossover(costmodel.published_runs())
    extra = dict(kind="proportion", quantity="N* the article's way, wal vs kafka",
                 definition="1 + (kafka c8 − wal c1) / PostgreSQL's slope", unit="N")
    ours.append({**extra, "value": x_ours["n_star"]})
    pub.append({**extra, "value": x_pub["n_star"]})
    out = pd.DataFrame(ours).rename(columns={"value": "ours"})
    out["published"] = [r["value"] for r in pub]
    out["ratio"] = out["ours"] / out["published"]
    flag = (out["ratio"] - 1).abs() > gap
    out["over_gap"] = flag.astype("boolean").where(out["ratio"].notna())
    return out
