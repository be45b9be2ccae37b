"""The control experiment: slow work makes the transport irrelevant.

With ``work_delay_ms`` of waiting in every work call, N consumers manage about
N x 1000 / delay msg/s whatever carries the messages. :func:`throughput` tabulates msg/s per
pipeline x N from stored runs, :func:`checks` tests the two claims (linear in N, transports
indistinguishable) and :func:`figure` draws ours beside the published control table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.study.plots import finding, outside_legend

LINEAR_TOL = 0.15  # msg/s per consumer within ±15 % of its mean over N
SPREAD_TOL = 0.10  # (max - min) / mean across transports at one N (the reference: 4-6 %)


def throughput(runs: pd.DataFrame) -> pd.DataFrame:
    """Successful runs → one row per pipeline x N: median msg/s, runs, msg/s per consumer, ideal."""
    ok = runs[runs["success"].astype(bool)].copy()
    ok["msg_per_s"] = ok["messages"] / ok["window_s"]
    out = (ok.groupby(["pipeline", "consumers"], sort=True)
             .agg(msg_per_s=("msg_per_s", "median"), runs=("msg_per_s", "size"),
                  work_delay_ms=("work_delay_ms", "first"))
             .reset_index())
    out["per_consumer"] = out["msg_per_s"] / out["consumers"]
    out["ideal"] = out["consumers"] * 1000 / out["work_delay_ms"]
    out["of_ideal_pct"] = 100 * out["msg_per_s"] / out["ideal"]
    return out


def checks(table: pd.DataFrame) -> pd.DataFrame:
    """The two claims, one row per check with the measured value, the tolerance and ``ok``."""
    rows: list[dict[str, Any]] = []
    for pipeline, g in table.groupby("pipeline"):
        per = g["per_consumer"]
        dev = float((per / per.mean() - 1).abs().max()) if len(g) > 1 else float("nan")
        rows.append({"check": "linear in N", "subject": pipeline,
                     "value": f"max deviation of msg/s per consumer {100 * dev:.1f} %",
                     "tolerance": f"{100 * LINEAR_TOL:.0f} %", "ok": bool(dev <= LINEAR_TOL)})
    for n, g in table.groupby("consumers"):
        rate = g["msg_per_s"]
        spread = float((rate.max() - rate.min()) / rate.mean()) if len(g) > 1 else float("nan")
        rows.append({"check": "transports indistinguishable", "subject": f"N={n}",
                     "value": f"spread {100 * spread:.1f} % over {', '.join(g['pipeline'])}",
                     "tolerance": f"{100 * SPREAD_TOL:.0f} %", "ok": bool(spread <= SPREAD_TOL)})
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, published: pd.DataFrame | None = None, *,
           work_delay_ms: float) -> Any:
    """msg/s against N per pipeline (ours solid, published dashed), and the ideal rate."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    colors: dict[str, Any] = {}
    for pipeline, g in table.groupby("pipeline"):
        (line,) = ax.plot(g["consumers"], g["msg_per_s"], "o-", label=f"{pipeline} (ours)")
        colors[pipeline] = line.get_color()
    if published is not None and not published.empty:
        for pipeline, g in published.groupby("pipeline"):
            ax.plot(g["consumers"], g["msg_per_s"], "s--", alpha=0.6, color=colors.get(pipeline),
                    label=f"{pipeline} (published, {g['work_delay_ms'].iloc[0]:g} ms)")
    theirs = published["consumers"] if published is not None else []
    ns = sorted(set(table["consumers"]) | set(theirs))
    ax.plot(ns, [n * 1000 / work_delay_ms for n in ns], ":", color="grey",
            label=f"ideal: N x 1000 / {work_delay_ms:g} ms")
    ax.set(xlabel="consumers N", ylabel="messages per second (window)", xticks=ns)
    ax.grid(alpha=0.3)
    outside_legend(ax)
    by_n = table.groupby("consumers")["msg_per_s"]
    spread = float((100 * (by_n.max() - by_n.min()) / by_n.mean()).max()) if not table.empty else float("nan")
    title = (f"With {work_delay_ms:g} ms of work per message the transports stay within {spread:.0f} % of each "
             "other at every N" if np.isfinite(spread) else "No control run")
    return finding(fig, title, f"Throughput (messages ÷ run window) against N; dotted: the ideal N × 1000 / "
                               f"{work_delay_ms:g} ms; dashed: the reference study's published runs.")
