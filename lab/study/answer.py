"""``lab answer``: a team's own point — N readers, M messages per start, a rate — against the ledger.

For every pipeline the cost per message at that point in every sitting that measured the pipeline
(:func:`lab.study.ledger.estimate`: exact at a measured cell; between measured N linear in N;
between measured volumes the line F + c·M through the two nearest; at a fixed rate the runs' steady
parts of the sittings at that rate where there are any, ``rate: measured``, else the load
staircases' floors), then the median and range over those sittings; the cheapest option, the one
no other beats head to head (:func:`lab.study.ledger.leader`), with every other as a ratio to it
within each sitting (machines differ two- to three-fold in speed, the ratios far less); and whether
the point lies inside what was measured or beyond it — volume, N or rate named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lab.study import ledger


def text(records: Sequence[Mapping[str, Any]], consumers: int, messages: float, rate: float = 0.0) -> str:
    """The answer as lines a terminal shows."""
    recs = ledger.comparable(records) + ledger.at_rate(records, rate)  # at a rate, its own sittings too
    where = f"N = {consumers}, {messages:,.0f} messages per start, " + (
        f"{rate:,.0f} msg/s" if rate > 0 else "closed loop")
    if not recs:
        return f"{where}: the ledger (data/sittings) holds no sitting to answer from; run `make report` first.\n"
    table = ledger.answer(recs, consumers, messages, rate)
    if table.empty:
        return f"{where}: no sitting measured a pipeline at a {('fixed rate' if rate > 0 else 'closed loop')}.\n"
    best = table.iloc[0]
    lines = [f"{where}: ms CPU per message, median over the sittings that measured each pipeline [their range]; "
             f"× {best.pipeline}: its cost ÷ {best.pipeline}'s in the same sitting [range over sittings]",
             f"{'pipeline':<13} {'ms/msg':>7}  {'range':<15} {'sittings':>8}  {'× ' + str(best.pipeline):<22}"
             f"where the point lies"]
    for i, r in enumerate(table.itertuples()):
        rng = f"[{r.lo:.2f}, {r.hi:.2f}]" if r.sittings > 1 else "(one sitting)"
        x = ("1" if i == 0 else "—" if r.x is None or r.x != r.x else
             f"{r.x:.2f}" + (f" [{r.x_lo:.2f}, {r.x_hi:.2f}]" if r.x_sittings > 1 else " (one sitting)"))
        lines.append(f"{r.pipeline:<13} {r.ms_per_msg:7.2f}  {rng:<15} {r.sittings:8d}  {x:<22}{r.where}"
                     f" (volume: {r.volume}; N: {r.n}; rate: {r.rate})")
    contested = int(table["wins"].sum())  # the sittings that estimated two pipelines or more
    verdict = f"cheapest: {best.pipeline}"
    if contested:
        verdict += f" (cheapest in {best.wins} of {contested} sittings"
        cheaper = [f"{r.pipeline} (×{r.x_lo:.2f})" for r in table.iloc[1:].itertuples()
                   if r.x_lo is not None and r.x_lo == r.x_lo and r.x_lo <= 1.0]
        verdict += (f"; not a clear winner: cheaper than it in some sitting: {', '.join(cheaper)})" if cheaper
                    else "; cheaper than every other in every sitting that measured both)")
    if best["where"] != "inside what was measured":
        verdict += f"; {best['where']}: an extrapolation, not a measurement"
    lines += [verdict, ""]
    return "\n".join(lines)
