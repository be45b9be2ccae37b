"""docs/results.md and the README's opening, written from the ledger (``lab results``).

Nothing in them is typed by hand: every figure comes from the committed sitting records
(:mod:`lab.study.ledger`), so the text cannot drift from the data, and a unit test regenerates both
and compares. A figure stands in the README only when the ledger holds enough replication
(:data:`ENOUGH`); until then the opening says how much is missing.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from lab.study import crossover, ledger, sitting
from lab.study.summary import md_table

README_BEGIN = "<!-- results:begin (written by `lab results` from data/sittings; do not edit by hand) -->"
README_END = "<!-- results:end -->"
# what the README's figures need: quick and reference sittings, on this many machines or days
ENOUGH = {"quick": 3, "reference": 2, "machines_or_days": 2}
# the reference study's figures at its own volume (docs/reference.md): ms CPU per message
REFERENCE_STUDY = {("wal", 1): 1.19, ("kafka", 1): 2.35, ("wal", 8): 1.88, ("kafka", 8): 2.16,
                   ("rabbitmq", 1): 2.20, ("rabbitmq", 8): 2.21}
REFERENCE_PG_SLOPE = 0.094  # PostgreSQL's ms/msg per extra wal reader, the reference study's fan-out model
PART_NAMES = {"walsender": "PostgreSQL, one walsender (per reader)", "pg.claims": "PostgreSQL, the claims",
              "pg.inserts": "PostgreSQL, the outbox inserts", "consumers": "the consumers",
              "debezium": "Debezium", "kafka": "Kafka", "rabbitmq": "RabbitMQ", "web": "the web service",
              "senders": "the senders"}


def replication(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How much the ledger holds: sittings per profile, machines, days, and whether that is
    :data:`ENOUGH` for the README (with what is missing)."""
    by = {p: [r for r in records if r.get("profile") == p] for p in ("quick", "reference")}
    machines = {ledger.machine(r) for r in records}
    days = {str(r.get("day")) for r in records}
    missing = [f"{ENOUGH[p] - len(v)} more {p} sitting{'s' if ENOUGH[p] - len(v) > 1 else ''}"
               for p, v in by.items() if len(v) < ENOUGH[p]]
    if max(len(machines), len(days)) < ENOUGH["machines_or_days"]:
        missing.append("a second machine or day")
    return {"quick": len(by["quick"]), "reference": len(by["reference"]), "machines": len(machines),
            "days": sorted(days), "enough": not missing, "missing": missing}


def _finding_lines(found: Sequence[ledger.Finding]) -> list[str]:
    return [f"- **{f.question}** {f.sentence} *({f.kind}" + (f"; held in {f.held}" if f.held else "") + ")*"
            for f in found]


def readme_block(records: Sequence[Mapping[str, Any]]) -> str:
    """The README's opening: the answer's sentences and the state of their replication (of the
    closed-loop sittings; a sitting at a fixed rate answers the steady stream's question only)."""
    found = ledger.findings(records)
    records = ledger.comparable(records)
    rep = replication(records)
    head = (f"**What it found**, from {len(records)} committed sitting{'s' if len(records) != 1 else ''} "
            f"({rep['quick']} quick, "
            f"{rep['reference']} at the reference volume) on {rep['machines']} machine"
            f"{'s' if rep['machines'] != 1 else ''} and {len(rep['days'])} day{'s' if len(rep['days']) != 1 else ''}")
    if not rep["enough"]:
        head += (f". **Provisional**: a figure stands here for good after {ENOUGH['quick']} quick and "
                 f"{ENOUGH['reference']} reference sittings on {ENOUGH['machines_or_days']} machines or days; "
                 f"still missing: {', '.join(rep['missing'])}")
    lines = [README_BEGIN, head + ".", "", *_finding_lines(found), "",
             "Every figure, its spread over sittings and its conditions: [docs/results.md](docs/results.md).",
             README_END]
    return "\n".join(lines)


def with_readme_block(readme: str, block: str) -> str:
    """``readme`` with the text between the markers replaced by ``block``; ValueError when the
    markers are missing."""
    a, b = readme.find(README_BEGIN), readme.find(README_END)
    if a < 0 or b < a:
        raise ValueError("README.md has no results markers: add the two lines "
                         f"{README_BEGIN!r} and {README_END!r} where the answer goes")
    return readme[:a] + block + readme[b + len(README_END):]


def _table(df: pd.DataFrame) -> str:
    """``df`` as a Markdown table, its first column leading (no index column)."""
    return md_table(df.set_index(df.columns[0])) if not df.empty else "*(none)*"


def _fmt(x: Any, digits: int = 2) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def sittings_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per sitting: id, day, profile, machine, commit, wall minutes, runs measured/failed,
    steal (max %), unattributed (ms/msg), the speed probe's unit (median ms, max ÷ min), drift (%)."""
    rows = []
    for r in records:
        q = r.get("quiet") or {}
        unit = q.get("speed_unit_ms") or {}
        rows.append({"sitting": r["id"], "day": r.get("day"), "profile": r.get("profile"),
                     "machine": ledger.machine(r), "commit": r.get("commit"),
                     "wall_min": r.get("wall_min"), "measured": (r.get("counts") or {}).get("measured"),
                     "failed": (r.get("counts") or {}).get("failed"), "steal_max_pct": q.get("steal_pct_max"),
                     "unattributed_ms": q.get("unattributed_ms_median"), "probe_ms": unit.get("median"),
                     "probe_max_over_min": unit.get("max_over_min"), "drift_pct": q.get("drift_pct")})
    return pd.DataFrame(rows)


def _sittings_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    rep = sittings_table(records)
    r = replication(records)
    enough = ("enough for the README's figures" if r["enough"] else
              f"not yet enough for the README's figures to stand (missing: {', '.join(r['missing'])})")
    return ["## The sittings behind it", "",
            "A sitting is one `make report` (or `lab report`) on one machine at one time. The machine's speed "
            "moves within a sitting (the speed probe's unit time, `probe max/min`) and machines differ 2–3× "
            "from day to day, so a figure here holds only where it holds across sittings. "
            f"The ledger holds {r['quick']} quick and {r['reference']} reference sittings on {r['machines']} "
            f"machine(s) and {len(r['days'])} day(s): {enough}.", "",
            _table(rep.rename(columns={"wall_min": "wall (min)", "steal_max_pct": "steal max (%)",
                                         "unattributed_ms": "unattributed (ms/msg)", "probe_ms": "probe unit (ms)",
                                         "probe_max_over_min": "probe max/min", "drift_pct": "drift (%)"})), ""]


def _crossing_section(records: Sequence[Mapping[str, Any]], volume: int) -> list[str]:
    recs = ledger.sittings_with(records, volume)
    out: list[str] = []
    for broker in ledger.MAIN_BROKERS:
        rows = []
        for rec in recs:
            c = ledger.crossing(rec, ledger.MAIN_DIRECT, broker, volume)
            if c is None:
                continue
            norm = ledger.crossing(rec, ledger.MAIN_DIRECT, broker, volume, basis="diff_norm")
            row: dict[str, Any] = {"sitting": ledger.label(rec)}
            for n, d in sorted(c["diffs"].items()):
                row[f"N = {n}"] = ", ".join(f"{x:+.2f}" for x in d)
            row["crossing"] = _crossing_words(c)
            row["speed-normalised"] = _crossing_words(norm) if norm else ""
            rows.append(row)
        if rows:
            out += [f"**`{ledger.MAIN_DIRECT}` against {ledger.BROKER_NAMES[broker]}**, {volume:,} messages per "
                    f"start: broker − direct, ms CPU per message, one figure per pair of runs at the same N in "
                    f"the same block (a positive difference: the direct readers cost less).", "",
                    _table(pd.DataFrame(rows).fillna("")), ""]
    if not out:
        return []
    return [f"## The crossing at {volume:,} messages per start, measured", "", *out]


def _crossing_words(c: Mapping[str, Any]) -> str:
    if c.get("below"):
        return f"broker cheaper already at N = {c['ns'][0]}"
    if c.get("beyond"):
        return f"no crossing up to N = {c['ns'][-1]}"
    lo, hi = c["between"]
    return f"between {lo} and {hi} (≈ {c['at']:.1f})" + ("" if c.get("clear") else ", pairs straddle zero")


def _rate_section(records: Sequence[Mapping[str, Any]], rate: float) -> list[str]:
    """The sittings at ``rate``: each one's paired steady differences per N and its crossing, and
    beside them the staircases' model of the same differences; empty when no sitting ran at it."""
    direct, broker = ledger.HEADLINE_PAIR
    rows = []
    ns: set[int] = set()
    for rec in ledger.at_rate(records, rate):
        for c in ledger.rate_crossings(rec, direct, broker):
            row: dict[str, Any] = {"sitting": ledger.label(rec), "messages per run": f"{c['messages']:,}"}
            for n, d in sorted(c["diffs"].items()):
                row[f"N = {n}"] = ", ".join(f"{x:+.2f}" for x in d)
                ns.add(n)
            row["crossing"] = _crossing_words(c)
            rows.append(row)
    if not rows:
        return []
    closed = ledger.comparable(records)
    model: dict[str, Any] = {"sitting": "the load staircases' chord (modelled)", "messages per run": "—"}
    for n in sorted(ns):
        diffs = [float(eb["ms"]) - float(ed["ms"]) for rec in closed
                 if (eb := ledger.estimate(rec, broker, n, 0.0, rate)) is not None
                 and (ed := ledger.estimate(rec, direct, n, 0.0, rate)) is not None]
        if diffs:
            model[f"N = {n}"] = f"{statistics.median(diffs):+.2f}"
    chord = ledger.rate_chord(closed, rate)
    if chord is not None:
        model["crossing"] = f"N* {ledger.span(chord['vals'])}" if chord["vals"] else "no crossing"
    if len(model) > 2:
        rows.append(model)
    return [f"## N\\* at a steady {rate:,.0f} msg/s, measured", "",
            f"Open-loop series at {rate:,.0f} msg/s (`lab series --profile steady`): `{direct}` and "
            f"{ledger.BROKER_NAMES[broker]} at one N back to back, the order alternating, two blocks. Each figure "
            "is broker − direct, ms CPU per message over the two runs' steady parts (`lab.measure.steady`: from "
            "20 % of the messages inserted to 90 % delivered, so neither Debezium's start nor the drain is in it, "
            "as for a Debezium never restarted), one per pair (positive: the direct readers cost less). The last "
            "row is the model it checks: the closed-loop sittings' load staircases (CPU/s = a + b·rate) at this "
            "rate, 1000·a/R + b, broker − direct, linear in N between the staircases' N (median over sittings).",
            "", _table(pd.DataFrame(rows).fillna("")), ""]


def _cells_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    df = ledger.cells(records)
    df = df[df["condition"] == "main"]
    out = ["## Cost per message, cell by cell, over sittings", "",
           "Each cell: the median over sittings of each sitting's median [lowest, highest sitting], ms CPU per "
           "message, closed loop; `n` = sittings. Runs within a sitting are in its record.", ""]
    for volume, g in df.groupby("messages"):
        rows = []
        for (p, n), gg in g.groupby(["pipeline", "consumers"], sort=False):
            v = gg["median_ms"].astype(float).tolist()
            cell = (f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}] n = {len(v)}" if len(v) > 1
                    else f"{v[0]:.2f} (n = 1)")
            rows.append({"pipeline": f"`{p}`", "N": int(n), "cell": cell})
        wide = pd.DataFrame(rows).pivot(index="pipeline", columns="N", values="cell").fillna("")
        wide.columns = [f"N = {c}" for c in wide.columns]
        out += [f"**{int(volume):,} messages per start**", "", _table(wide.reset_index()), ""]
    return out


def _prediction_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    err = ledger.prediction_errors(records)
    if err.empty:
        return []
    summary = err.groupby("pipeline")["error_pct"].agg(lambda s: f"{s.min():+.0f} % to {s.max():+.0f} %")
    lines = ["## The quick model against the measurement", "",
             "The quick model fits the fixed cost per start F from 5,000- and 20,000-message runs (F as a line in N "
             "through the N where both volumes ran) and predicts c + F/M at 100,000 messages; the reference sittings "
             "measured that volume directly in the same sitting. A model figure is quoted only for a volume where "
             "this check held; its error per pipeline over every cell and sitting:", ""]
    lines += [f"- `{p}`: {s}" for p, s in summary.items()]
    show = err.assign(sitting=err["sitting"].str[:15], predicted=err["predicted"].map(_fmt),
                      measured=err["measured"].map(_fmt), error_pct=err["error_pct"].map(lambda x: f"{x:+.1f}"))
    return [*lines, "", _table(show.drop(columns=["day"])), ""]


# our parts against the reference study's participants (docs/reference.md): its `test` process ran
# the senders and the consumers together
PARTS_VS_REFERENCE = (("PostgreSQL", ("postgres",), "postgres"), ("Debezium", ("debezium",), "debezium"),
                      ("Kafka", ("kafka",), "kafka"), ("RabbitMQ", ("rabbitmq",), "rabbitmq"),
                      ("web service", ("web",), "web"), ("senders + consumers", ("senders", "consumers"), "test"))
OURS_ONLY = (("PostgreSQL: one walsender, per reader", "pg.walsenders"), ("PostgreSQL: the claims", "pg.claims"))


def _reference_parts() -> dict[tuple[str, int], dict[str, float]]:
    """The reference study's ms CPU per message by participant at 100,000 messages, per cell."""
    from lab.results import load_reference

    ref = load_reference("participants")
    ref = ref[(ref["messages"] == ledger.REFERENCE_VOLUME) & (~ref["warmup"].astype(bool))]
    return {(r.pipeline, int(r.consumers)): {k: float(getattr(r, k)) * 1000 / ledger.REFERENCE_VOLUME
                                             for _, _, k in PARTS_VS_REFERENCE if pd.notna(getattr(r, k))}
            for r in ref.itertuples()}


def _parts_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    recs = ledger.sittings_with(records, ledger.REFERENCE_VOLUME)
    if not recs:
        return []
    theirs = _reference_parts()
    rows = []
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for pipeline, n in sorted(REFERENCE_STUDY, key=lambda k: (k[0], k[1])):
        per: dict[str, list[float]] = {}
        for rec in recs:
            runs = [r for r in ledger.condition_runs(rec, "") if r["pipeline"] == pipeline and r["consumers"] == n
                    and r["messages"] == ledger.REFERENCE_VOLUME and not r.get("arm")]
            if not runs:
                continue
            per.setdefault("total", []).append(statistics.median(r["ms"] for r in runs))
            for name, ours, _ in PARTS_VS_REFERENCE:
                per.setdefault(name, []).append(statistics.median(
                    sum(r.get("parts", {}).get(k, 0.0) for k in ours) for r in runs))
            for name, key in OURS_ONLY:
                got = [r["parts"][key] / (n if key == "pg.walsenders" else 1) for r in runs
                       if r.get("parts", {}).get(key) is not None]
                if got:
                    per.setdefault(name, []).append(statistics.median(got))
        if not per:
            continue
        medians[(pipeline, n)] = {k: statistics.median(v) for k, v in per.items()}
        ref = theirs.get((pipeline, n), {})
        ref_total = REFERENCE_STUDY[(pipeline, n)]
        rows.append({"cell": f"`{pipeline}` N = {n}", "part": "**total**", "ours": _span(per["total"]),
                     "reference study": f"{ref_total:.3f}",
                     "ours ÷ theirs": f"{statistics.median(per['total']) / ref_total:.2f}"})
        for name, _, key in PARTS_VS_REFERENCE:
            v = per.get(name) or [0.0]
            if max(v) < 0.005 and ref.get(key, 0.0) < 0.005:
                continue
            r = ref.get(key)
            rows.append({"cell": "", "part": name, "ours": _span(v),
                         "reference study": f"{r:.3f}" if r is not None else "—",
                         "ours ÷ theirs": f"{statistics.median(v) / r:.2f}" if r else ""})
        for name, _ in OURS_ONLY:
            if per.get(name):
                rows.append({"cell": "", "part": name, "ours": _span(per[name]), "reference study": "—",
                             "ours ÷ theirs": ""})
    return ["## Per-component rates at the reference volume", "",
            "ms CPU per message at 100,000 messages per start, ours the median over sittings [range when more "
            "than one], part by part beside the reference study's (one run per cell, 16 threads, .NET senders, web "
            f"service and consumers; its PostgreSQL grew {REFERENCE_PG_SLOPE} ms/msg per extra `wal` reader). "
            "These are the rates a team can carry to its own stack. Read the parts, not the totals: the web "
            "service, the senders and the consumers are the clients (Python here, .NET there) and cost the same "
            "for every pipeline at one N but for the consumers; PostgreSQL, Debezium and the broker are the same "
            "servers on a machine of another speed; the claims are the claim table's (see below).", "",
            _table(pd.DataFrame(rows)), "", *parts_reading(medians, theirs)]


SERVER_PARTS = {"PostgreSQL": "postgres", "Debezium": "debezium"}
BROKER_PART = {"kafka": ("Kafka", "kafka"), "rabbitmq": ("RabbitMQ", "rabbitmq")}
CLIENT_PARTS = {"web service": "web", "senders + consumers": "test"}


def parts_reading(ours: Mapping[tuple[str, int], Mapping[str, float]],
                  theirs: Mapping[tuple[str, int], Mapping[str, float]]) -> list[str]:
    """What the per-component table says, in words: the ratio ours ÷ the reference study's of each
    server (PostgreSQL, Debezium, the cell's own broker: the machine and the versions) and of the
    clients (web service, senders and consumers: Python here, .NET there), each as a range over the
    cells; the claim's cost at the fewest and the most `wal` readers measured; and PostgreSQL's growth
    per extra `wal` reader beside the reference study's. ``ours`` maps a cell to its median per part
    (the table's names, "total" and the claims' line); ``theirs`` a cell to the reference study's per
    part (its participant keys). Empty when no cell has both."""
    ratios: dict[str, list[float]] = {}
    for cell, mine in ours.items():
        ref = theirs.get(cell, {})
        keys = {**SERVER_PARTS, **CLIENT_PARTS}
        if cell[0] in BROKER_PART:
            name, key = BROKER_PART[cell[0]]
            keys[name] = key
        for name, key in keys.items():
            if mine.get(name) and ref.get(key):
                ratios.setdefault(name, []).append(mine[name] / ref[key])
    servers = [n for n in (*SERVER_PARTS, *(b for b, _ in BROKER_PART.values())) if n in ratios]
    clients = [n for n in CLIENT_PARTS if n in ratios]
    if not servers or not clients:
        return []

    def span(names: Sequence[str]) -> str:
        return ", ".join(f"{n} {min(ratios[n]):.2f}–{max(ratios[n]):.2f}×" if len(ratios[n]) > 1
                         else f"{n} {ratios[n][0]:.2f}×" for n in names)

    out = [f"**Where the differences come from** (ours ÷ the reference study's, over the cells). The "
           f"servers, the same programs on another machine and in other versions: {span(servers)}. The "
           f"clients, Python here and .NET there: {span(clients)}. The clients weigh most where every "
           "reader is a client, so they lift `wal` more than the options with a broker."]
    wal = sorted(n for p, n in ours if p == "wal")
    claims = "PostgreSQL: the claims"
    if len(wal) > 1 and all(ours[("wal", n)].get(claims) is not None for n in (wal[0], wal[-1])):
        lo, hi = wal[0], wal[-1]
        slope = (ours[("wal", hi)].get("PostgreSQL", 0.0) - ours[("wal", lo)].get("PostgreSQL", 0.0)) / (hi - lo)
        out.append(f" The claim table: `wal`'s claims cost {ours[('wal', lo)][claims]:.3f} ms/msg at N = {lo} "
                   f"and {ours[('wal', hi)][claims]:.3f} at N = {hi}, because the table grows through the run "
                   f"(below); PostgreSQL here grows {slope:.3f} ms/msg per extra `wal` reader between them, "
                   f"against the reference study's {REFERENCE_PG_SLOPE}.")
    return ["".join(out), ""]


def _span(v: Sequence[float]) -> str:
    return f"{statistics.median(v):.3f}" + (f" [{min(v):.3f}, {max(v):.3f}]" if len(v) > 1 else "")


def _volume(condition: str) -> float | None:
    """The messages per start of a by-volume condition ("M = 100,000, F fitted ...": 100000.0; "M = ∞": inf)."""
    found = re.match(r"M = (∞|\d[\d,]*)", condition)
    if found is None:
        return None
    return math.inf if found[1] == "∞" else float(found[1].replace(",", ""))


def _modelled_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for rec in records:
        model = rec.get("model") or {}
        refits: dict[str, dict[float, tuple[float, float]]] = {}
        for kind in ("by_volume", "steady_in_runs", "steady_across_volumes"):
            for a in model.get(kind) or []:
                if a["direct"] != ledger.MAIN_DIRECT or a["broker"] not in ledger.MAIN_BROKERS:
                    continue
                if kind == "by_volume" and a["condition"].endswith(crossover.SPLIT_ONLY):
                    continue  # no arm for the pair: a run's own split, biased at 5,000 messages
                rng = _n_range(*a["range"])
                refit = "—"
                if kind == "by_volume" and "F fitted across volumes at N" in a["condition"]:
                    if a["broker"] not in refits:
                        refits[a["broker"]] = sitting.refitted(rec, a["direct"], a["broker"])
                    ci = refits[a["broker"]].get(_volume(a["condition"]) or -1.0)
                    if ci is not None:
                        refit = _n_range(*(None if math.isinf(x) else x for x in ci))
                rows.append({"sitting": ledger.label(rec), "pair": f"`wal` vs {a['broker']}",
                             "condition": a["condition"], "N* (range over models)": rng,
                             "flat broker, F refitted (95 % bootstrap)": refit,
                             "inside the measured N": "yes" if a["inside"] else "no"})
    if not rows:
        return []
    return ["## N\\* from a model, where nothing was measured", "",
            "Modelled, not measured: the quick model's N\\*(M) (F fitted across 5,000 and 20,000 messages), and "
            "N\\*∞ (a Debezium never restarted) from the runs' own timelines and, in the reference sittings, from "
            "the fit across the three volumes. Each range is over the plausible models (direct line straight or "
            "curved, broker flat or sloped). Beside it, for the quick model's N\\*(M), the straight-direct, "
            "flat-broker N\\* with its fixed cost per start refitted in every bootstrap draw (runs resampled "
            "within each pipeline, N and volume; `lab.study.refit`): F's own error, which the range over models "
            "leaves out, and with two runs per cell an interval whose real coverage is below its nominal 95 %. "
            "Quote one only beside the prediction error above. Where a sitting ran no volume arm for a pair "
            "(RabbitMQ in the quick sittings whose arm is `wal` and `kafka` only), its N\\*(M) is left out: a "
            "run's own cost split is biased at 5,000 messages, where Debezium's warm-up outlasts the start.", "",
            _table(pd.DataFrame(rows)), ""]


def _block_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """F refitted block by block (:func:`lab.study.sitting.refitted_by_block`), where a sitting ran a
    volume arm in two or more blocks: each block's N* and the block bootstrap's interval."""
    at = (5_000, 1_000_000, math.inf)
    rows = []
    for rec in records:
        for broker in ledger.MAIN_BROKERS:
            fit = sitting.refitted_by_block(rec, ledger.MAIN_DIRECT, broker)
            if not fit:
                continue
            blocks = fit["blocks"]
            row = {"sitting": ledger.label(rec), "pair": f"`wal` vs {broker}",
                   "F fitted from": "; ".join(
                       f"block {b['block'] + 1}: {', '.join(f'{v:,}' for v in b['volumes'])} messages at N = "
                       + ", ".join(map(str, b["fitted_at"])) for b in blocks)}
            for v in at:
                name = "∞" if math.isinf(v) else f"{v:,}"
                row[f"N* at {name}, each block"] = ", ".join(_n_at(b["n_star"][v]) for b in blocks)
                ci = fit["intervals"].get(v)
                row[f"at {name}, block bootstrap"] = (
                    _n_range(*(None if math.isinf(x) else x for x in ci)) if ci is not None else "—")
            row["real coverage"] = f"about {100 * fit['coverage']:.0f} %"
            rows.append(row)
    if not rows:
        return []
    return ["### The fixed cost per start, refitted block by block", "",
            "Where a sitting ran its volume arm in more than one block, F is fitted from each block's own runs "
            "(its main volume and its arm's, at the N where the block has both), and a block bootstrap draws "
            "whole blocks with replacement and refits F in every draw (`lab.study.refit.by_block`): the drift "
            "between blocks and F's own error are in the interval together. With two blocks the draws take three "
            "values, so the interval is about the two blocks' own range and covers the truth about half the time, "
            "not 95 %. N\\* here is the straight-direct, flat-broker model's, not a measured crossing.", "",
            _table(pd.DataFrame(rows)), ""]


def _n_at(x: float) -> str:
    """One N*: ``4.5``, ``below 1``, ``never`` (``inf``: the broker never cheaper)."""
    return _n_range(None, None) if math.isinf(x) else _n_range(x, x)


def _n_range(lo: float | None, hi: float | None) -> str:
    """``9.1–12.4``, ``12.0 to never``, ``below 1`` (the broker cheaper at every N)."""
    def one(x: float | None) -> str:
        return "never" if x is None else ("below 1" if x < 1 else f"{x:.1f}")

    if lo is None:
        return "never"
    if one(lo) == one(hi):
        return one(lo)
    return f"{one(lo)} to {one(hi)}" if hi is None or lo < 1 else f"{lo:.1f}–{hi:.1f}"


def _claims_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for rec in records:
        for r in ledger.condition_runs(rec, ""):  # the never-pruned table; pruned: the next section
            if r["pipeline"] == ledger.MAIN_DIRECT and r.get("parts", {}).get("pg.claims") is not None:
                rows.append({"sitting": rec["id"], "N": r["consumers"], "messages": r["messages"],
                             "claims": r["parts"]["pg.claims"], "rows": (r.get("claim_table") or {}).get("rows")})
    if not rows:
        return []
    df = pd.DataFrame(rows)
    g = df.groupby(["messages", "N"])["claims"].median().unstack("N").round(3)
    g.columns = [f"N = {c}" for c in g.columns]
    return ["## The claim table grows with the run", "",
            "PostgreSQL's claim backends, ms CPU per message (median over every `wal` run in the ledger) by the "
            "messages per run: the claim table (`inbox_wal`, never pruned within a run, autovacuum off as in the "
            "reference study) holds every claimed position, so a longer run claims into a bigger table.", "",
            _table(g.reset_index().rename(columns={"messages": "messages per run"})), ""]


SECOND_TITLE = "## A second condition: the claim table pruned"
CONDITION_WORDS = {"": "never pruned", ledger.PRUNED: "pruned behind every slot"}
POLL_N = 4  # where the conditions profile measures `poll` at the reference volume (lab.study.series)


def _main_runs(rec: Mapping[str, Any], pipeline: str, condition: str) -> list[Mapping[str, Any]]:
    return [r for r in ledger.condition_runs(rec, condition) if r["pipeline"] == pipeline
            and r["messages"] == ledger.REFERENCE_VOLUME and not r.get("arm")]


def _second_condition_section(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """`wal` with its claim table pruned beside never pruned, each against Kafka in the same
    sitting, and `poll` at the reference volume beside the `wal` run paired with it; one line when
    no sitting measured either."""
    recs = ledger.sittings_with(records, ledger.REFERENCE_VOLUME)
    pruned = [r for r in recs if _main_runs(r, ledger.MAIN_DIRECT, ledger.PRUNED)]
    polled = [r for r in recs if any(x["consumers"] == POLL_N for x in _main_runs(r, "poll", ""))]
    if not pruned and not polled:
        return [SECOND_TITLE, "",
                f"No committed sitting has measured it yet: none holds `{ledger.MAIN_DIRECT}` with its claim table "
                f"pruned or `poll` at {ledger.REFERENCE_VOLUME:,} messages per start (`lab series --profile "
                "conditions`, then `lab sitting`).", ""]
    out = [SECOND_TITLE, "",
           "The reference study never prunes the direct readers' claim table (`inbox_wal`, above), so their claim "
           "cost grows with the run. The `conditions` profile measures `wal` with the table pruned behind every "
           "slot (`--claim-retention behind-slots`, docs/method.md) beside `wal` with it never pruned, each "
           f"paired with Kafka in the same blocks at {ledger.REFERENCE_VOLUME:,} messages per start, and `poll` "
           f"at N = {POLL_N} next to `wal`, where autovacuum of the outbox comes inside the run.", ""]
    if pruned:
        rows = []
        for rec in pruned:
            for cond in CONDITION_WORDS:
                c = ledger.crossing(rec, ledger.MAIN_DIRECT, "kafka", ledger.REFERENCE_VOLUME, condition=cond)
                if c is None:
                    continue
                row: dict[str, Any] = {"sitting": ledger.label(rec), "claims": CONDITION_WORDS[cond]}
                for n, d in sorted(c["diffs"].items()):
                    row[f"N = {n}"] = ", ".join(f"{x:+.2f}" for x in d)
                row["crossing"] = _crossing_words(c)
                rows.append(row)
        out += [f"**The crossing, measured, claims never pruned and pruned**: Kafka − `{ledger.MAIN_DIRECT}`, ms "
                "CPU per message, one figure per pair of runs at the same N in the same block.", "",
                _table(pd.DataFrame(rows).fillna("")), "", *_claims_by_condition(pruned)]
    if polled:
        out += _poll_rows(polled)
    return out


def _claims_by_condition(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The claims' cost per condition and N (PostgreSQL's ``claims`` + ``prune`` backends) and the
    claim table's rows at the run's end, the median over each sitting's runs."""
    rows = []
    for rec in records:
        for cond, words in CONDITION_WORDS.items():
            by_n: dict[int, list[Mapping[str, Any]]] = {}
            for r in _main_runs(rec, ledger.MAIN_DIRECT, cond):
                by_n.setdefault(int(r["consumers"]), []).append(r)
            for n, runs in sorted(by_n.items()):
                parts = [r.get("parts") or {} for r in runs]
                claims = [p.get("pg.claims", 0.0) + p.get("pg.prune", 0.0) for p in parts]
                tables = [r.get("claim_table") or {} for r in runs]
                left = [t.get("left", t.get("rows")) for t in tables]  # counted by the readers, else estimated
                kept = [x for x in left if x is not None]
                rows.append({"sitting": ledger.label(rec), "claims": words, "N": n,
                             "claims + prune (ms/msg)": _span(claims),
                             "of which prune": _span([p.get("pg.prune", 0.0) for p in parts]),
                             "rows at the end": f"{statistics.median(kept):,.0f}" if kept else "—"})
    return ["**The claims' cost** per condition and N: PostgreSQL's claim backends plus the pruner's (`pg.claims` "
            "+ `pg.prune`), ms CPU per message, the median over the sitting's runs [range], and the claim table's "
            "rows when the consumers exited.", "", _table(pd.DataFrame(rows)), ""]


def _poll_rows(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """`poll` at N = 4 and the reference volume beside the `wal` run of the same block (never
    pruned), with autovacuum inside each `poll` run where the record carries it."""
    rows = []
    for rec in records:
        wal = {int(r["block"]): r for r in _main_runs(rec, ledger.MAIN_DIRECT, "") if r["consumers"] == POLL_N}
        for r in _main_runs(rec, "poll", ""):
            if r["consumers"] != POLL_N:
                continue
            w = wal.get(int(r["block"]))
            av = r.get("autovacuum") or {}
            apart = (abs(int(r["index"]) - int(w["index"])) if w is not None and r.get("index") is not None
                     and w.get("index") is not None else None)
            rows.append({"sitting": ledger.label(rec), "block": int(r["block"]), "`poll`": _fmt(r["ms"], 3),
                         "`wal`": _fmt(w["ms"], 3) if w is not None else "—",
                         "poll − wal": f"{r['ms'] - w['ms']:+.3f}" if w is not None else "—",
                         "runs apart": apart if apart is not None else "—",
                         "autovacuum runs": av.get("count", "—"),
                         "autovacuum CPU (s)": _autovacuum_cpu(av)})
    return [f"**`poll` at N = {POLL_N}, {ledger.REFERENCE_VOLUME:,} messages per start**, beside the `wal` run of "
            "the same block (claims never pruned), ms CPU per message; autovacuum from the gate to the consumers' "
            "exit over the lab's tables. Its CPU is the one PostgreSQL logged for every action inside the window "
            "where the run read the server's log; otherwise what polls of its workers saw, a lower bound (`≥`; "
            "`lab.measure.vacuum`).", "",
            _table(pd.DataFrame(rows)), ""]


def _autovacuum_cpu(av: Mapping[str, Any]) -> str:
    """The logged CPU of a run's autovacuum actions (``3 actions, 0.42``), else the polls' lower bound."""
    if av.get("log_cpu_s") is not None:
        n = int(av.get("log_actions") or 0)
        return f"{n} action{'s' if n != 1 else ''}, {_fmt(av['log_cpu_s'], 2)}"
    return f"≥ {_fmt(av['cpu_s'], 2)}" if av.get("cpu_s") is not None else "—"


def results_markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """docs/results.md, whole."""
    found = ledger.findings(records)
    at_rate = _rate_section(records, ledger.STEADY_RATE)
    records = ledger.comparable(records)
    lines = ["# Results: the current answer and its conditions", "",
             "*Written by `lab results` from the committed sitting records in `data/sittings/`; edit "
             "`lab/study/published.py`, not this page.*", "",
             "## The answer", "", *_finding_lines(found), "",
             "*Measured* means read from runs at the stated volume, N and rate (a crossing lies between two "
             "measured N); *modelled* means a model over N or volume, with the check that allows it. "
             "`held in k of n sittings`: the same result in that many of the sittings that measured it.", ""]
    for section in (_sittings_section(records), _crossing_section(records, ledger.REFERENCE_VOLUME),
                    _prediction_section(records), _crossing_section(records, ledger.QUICK_VOLUME), at_rate,
                    _cells_section(records), _parts_section(records), _claims_section(records),
                    _second_condition_section(records), _modelled_section(records),
                    _block_section(records)):
        lines += section
    lines += ["## Studies outside the ledger", "",
              "Single sittings from before the ledger existed (the decision space of every pipeline, the `ha` "
              "topology, faults, hosts and link delay) are in [history](history/README.md), each with its date, "
              "command and machine; they were not replicated and carry no weight here.", ""]
    return "\n".join(lines)
