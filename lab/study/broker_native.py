"""The broker-native experiment: what the transports cost without an outbox.

A separate stand in the reference: no web hop for the producer, no outbox, no Debezium. The
producers (:mod:`lab.pipelines.producers`) write every message straight into the Kafka topic, the RabbitMQ
quorum queue, or, for logical replication, the ``messages`` table; the N consumers are the usual
ones. Published at 8 consumers and 200,000 messages: Kafka 0.45, RabbitMQ quorum 0.58, logical
replication 2.22 ms CPU/msg. Here the arms are the pipelines ``kafka``, ``rabbitmq`` and ``wal``
with ``Scenario.producer = "direct"``.

:func:`plan` builds the series (a warm-up run first, as in the main study), :func:`select` picks
its runs, :func:`table` and :func:`figure` put ours beside the published numbers.

Example::

    plan = broker_native.plan(messages=20_000, consumers=8)
    results = await series.run_series(plan, settings, series_id=broker_native.SERIES_ID)
    runs = broker_native.select(load_runs(), broker_native.SERIES_ID)
    broker_native.table(runs, load_reference("broker_native"))
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from lab.scenario import Scenario
from lab.study.costmodel import METRIC, measured
from lab.study.plots import PARTICIPANT_COLORS, breakdown_figure, finding, outside_legend
from lab.study.series import matrix

ARMS = ("kafka", "rabbitmq", "wal")  # the published stand's three transports
SERIES_ID = "broker-native"
WARMUP_SHARE = 5  # the warm-up run has M / 5 messages, as the main series


def plan(*, messages: int = 20_000, consumers: int = 8, producers: int = 200, repeats: int = 1,
         cooldown_s: float = 5.0) -> list[Scenario]:
    """A warm-up run (kafka, M/5, marked ``warmup``), then every arm x ``repeats``."""
    base = Scenario(producer="direct", messages=messages, consumers=consumers, senders=producers,
                    cooldown_s=cooldown_s)
    warmup = base.replace(pipeline=ARMS[0], messages=max(1, messages // WARMUP_SHARE),
                          warmup=True, label="warmup")
    return [warmup, *matrix(base, pipelines=ARMS, consumers=[consumers], repeats=repeats)]


def select(runs: pd.DataFrame, series_id: str) -> pd.DataFrame:
    """The broker-native runs of ``series_id`` (every run of the series, failed ones included)."""
    if runs.empty or "series_id" not in runs or "producer" not in runs:
        return runs.iloc[:0]
    return runs[(runs["series_id"] == series_id) & (runs["producer"] == "direct")]


def _participants(runs: pd.DataFrame) -> list[str]:
    names = [c.removeprefix("cpu_s.") for c in runs.columns if c.startswith("cpu_s.")]
    order = list(PARTICIPANT_COLORS)
    names = [n for n in names if n != "unattributed"]
    return sorted(names, key=lambda n: order.index(n) if n in order else len(order))


def table(runs: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """One row per arm: runs, median ms CPU/msg (min-max), the published value and ours/published,
    then the median ms CPU/msg of every participant (``unattributed`` host CPU left out)."""
    ok = measured(runs, producer="direct")
    names = _participants(ok)
    pub = published.drop_duplicates("pipeline").set_index("pipeline")["ms_per_msg"]
    rows = []
    for arm in ARMS:
        g = ok[ok["pipeline"] == arm]
        if g.empty:
            continue
        ms = g[METRIC].astype(float)
        row = {
            "pipeline": arm, "consumers": int(g["consumers"].iloc[0]),
            "messages": int(g["messages"].iloc[0]), "runs": len(g),
            "ms_per_msg": round(ms.median(), 3), "min": round(ms.min(), 3),
            "max": round(ms.max(), 3), "published": pub.get(arm),
        }
        row["ours_over_published"] = (round(row["ms_per_msg"] / row["published"], 2)
                                      if row["published"] else None)
        for n in names:
            per = g[f"cpu_s.{n}"].fillna(0).astype(float) * 1000 / g["messages"]
            row[f"ms.{n}"] = round(per.median(), 4)
        rows.append(row)
    return pd.DataFrame(rows)


def figure(runs: pd.DataFrame, published: pd.DataFrame) -> Figure:
    """Stacked ms CPU/msg per participant for each arm (median over its runs), and the
    published total of that arm as a black marker; the title says which arm costs least."""
    fig = breakdown_figure(measured(runs, producer="direct"))
    ax = fig.axes[0]
    pub = published.drop_duplicates("pipeline").set_index("pipeline")["ms_per_msg"]
    legend: str | None = "published total"
    totals: dict[str, float] = {}
    heights = np.sum([[b.get_height() for b in c] for c in ax.containers], axis=0) if ax.containers else []
    for x, label, total in zip(ax.get_xticks(), ax.get_xticklabels(), heights, strict=False):
        arm = label.get_text().split(" ")[0]
        totals[arm] = float(total)
        value = pub.get(arm)
        if value is not None:
            ax.scatter([x], [value], marker="D", color="black", zorder=3, label=legend)
            legend = None
    top = max([ax.get_ylim()[1], *pub.tolist()])
    ax.set_ylim(0, top * 1.1)
    outside_legend(ax, title="participant")
    if totals:
        best = min(totals, key=lambda k: totals[k])
        title = f"Without the outbox, {best} costs least: {totals[best]:.2f} ms CPU per message"
        if best in pub:
            title += f" (published {pub[best]:.2f})"
    else:
        title = "No broker-native run"
    return finding(fig, title, "Producers write straight into the transport (no outbox, web service or Debezium); "
                               "bars: the median of each arm's runs per participant; ◆: the reference study's "
                               "published total of the arm.")
