"""The answer a report opens with, in words: which pipeline is cheapest at each N,
where the direct lines cross the brokers (with the interval, measured or extrapolated, against
the article's N ≈ 11), how far the intervals can be trusted, and how noisy the machine was.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.study import compare, costmodel, speed
from lab.study.costmodel import measured
from lab.study.intervals import coverage_label

ARTICLE_N_STAR = 11  # the reference's extrapolated crossover (from N ≤ 8)


def _span(v: np.ndarray) -> str:
    lo, hi = int(v.min()), int(v.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def md_table(df: pd.DataFrame) -> str:
    """A small DataFrame (index included) as a Markdown table."""
    flat = df.reset_index()
    cells = [[("" if pd.isna(v) else f"{v:g}" if isinstance(v, float) else str(v)) for v in row]
             for row in flat.itertuples(index=False)]
    head = [str(c).strip() for c in flat.columns]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in cells])


def cheapest_table(head: pd.DataFrame) -> pd.DataFrame:
    """Per N: the cheapest pipeline, the runner-up, and whether they are within noise."""
    rows = []
    for n, g in head.groupby("consumers", sort=True):
        g = g.sort_values("median")
        best = g.iloc[0]
        row = {"consumers N": int(n), "cheapest": best["pipeline"],
               "its ms CPU per message": round(float(best["median"]), 3)}
        if len(g) > 1:
            nxt = g.iloc[1]
            tie = costmodel.within_noise(best, nxt)
            row |= {"next cheapest": nxt["pipeline"], "its ms CPU per message ": round(float(nxt["median"]), 3),
                    "verdict": "within noise of each other" if tie else "clearly cheaper"}
        rows.append(row)
    return pd.DataFrame(rows).set_index("consumers N")


# costmodel.Crossover.ci_method -> words for the report
INTERVAL_NAMES = {"bootstrap": "bootstrap interval", "parametric-t": "parametric interval (one run per N)",
                  "none": "interval"}


def crossover_sentences(runs: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> list[str]:
    table = compare.crossover_table(runs, upto=8, n_boot=n_boot, seed=seed)
    out = []
    for r in table.itertuples():
        lo, hi = r.lo_all, r.hi_all
        if pd.notna(r.n_star_all):
            where = "inside the measured N (measured)" if r.inside_all else "outside the measured N (extrapolated)"
            ci = f"{lo:.1f}–{hi:.1f}" if math.isfinite(hi) else f"{lo:.1f}–never"
            kind = INTERVAL_NAMES.get(str(getattr(r, "interval_all", "")), "interval")
            n_star = (f"the fit puts the crossing at **N\\* ≈ {r.n_star_all:.1f}** (95 % {kind} {ci}), "
                      f"{where}, against the broker's {r.broker_model or 'flat level'}")
        else:
            n_star = "the fitted direct line does not rise towards the broker (no crossing)"
        cells = str(r.verdict).split("; the fit")[0]
        out.append(f"**{r.direct} vs {r.broker}**: in the measured cells, {cells}; {n_star}. "
                   f"The article extrapolated N ≈ {ARTICLE_N_STAR} from N ≤ 8.")
    return out


def markdown(runs: pd.DataFrame, group_name: str, *, n_boot: int = 2000, seed: int = 0) -> str:
    """The report's opening section as Markdown."""
    ok = measured(runs)
    if ok.empty:
        return f"## The answer\n\nNo measured runs in {group_name}."
    head = costmodel.headline(ok)
    ns = sorted(head["consumers"].unique())
    per_cell = head["n"].to_numpy()
    cov = head.groupby("n")["coverage"].first().sort_index()
    lines = ["## The answer", "", f"Analysed: {group_name}. Consumers measured: {', '.join(map(str, ns))}; "
             f"{len(ok)} measured runs, {_span(per_cell)} per cell.", ""]
    cheap = cheapest_table(head)
    lines += ["**Cheapest pipeline at each N** (median ms of CPU per message, all participants):", "",
              md_table(cheap), ""]
    lines += [f"- {s}" for s in crossover_sentences(runs, n_boot=n_boot, seed=seed)] + [""]
    lines.append(
        "**How far to trust the intervals.** A cell's interval is the order-statistic interval of its "
        "median, labelled with its exact coverage; here "
        + ", ".join(f"{coverage_label(c)} for cells of {n} run{'s' if n > 1 else ''}" for n, c in cov.items())
        + " (6 runs are needed for 95 %; without an interval only the article's 10 % rule separates "
          "noise from a difference). Crossover intervals are 95 % intervals of the fitted lines: a bootstrap "
          "of the runs with 3 or more runs at every N, and with fewer the least-squares fit's own t "
          "distribution (a parametric bootstrap, which assumes the line is right).")
    lines.append("")
    load = pd.to_numeric(ok.get("loadavg_1m", pd.Series(dtype=float)), errors="coerce")
    steal = pd.to_numeric(ok.get("steal_pct", pd.Series(dtype=float)), errors="coerce")
    unatt = pd.to_numeric(ok.get("cpu_s.unattributed", pd.Series(dtype=float)), errors="coerce") * 1000 / ok["messages"]
    machine = []
    if load.notna().any():
        machine.append(f"load average (1 min) {np.nanmedian(load):.1f} (median over runs)")
    if steal.notna().any():
        machine.append(f"steal {np.nanmedian(steal):.1f} % of CPU time")
    if unatt.notna().any():
        machine.append(f"unattributed host CPU {np.nanmedian(unatt):.2f} ms per message (other jobs)")
    if machine:
        lines.append("**The machine during the runs**: " + "; ".join(machine) + ".")
    if speed.has_probe(ok):
        slow = speed.slow_runs(ok)
        lines.append(f"The speed probe flagged {len(slow)} of {len(ok)} runs as taken while the machine was "
                     "unusually slow (its fixed unit of work took > 1.25 × the median time)"
                     + (": " + ", ".join(f"{r.pipeline} N={r.consumers} ({r.times_median:.2f} ×)"
                                         for r in slow.itertuples()) if len(slow) else "") + ".")
    return "\n".join(lines)
