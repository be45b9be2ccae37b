"""The ledger: every committed sitting read together, and what holds across them.

A sitting (:mod:`lab.study.sitting`) is one sample of one machine at one time. A team acts on what
holds across sittings, so every figure here is given as the median and the range over sittings,
with each sitting's own value and the number of sittings a claim held in. Noise has levels: runs
within a sitting, sittings within a machine, machines;
:func:`lab.study.intervals.hierarchical_interval` resamples sittings and then runs within them (the
random-effects bootstrap of Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM
2013), so its interval widens with the spread between sittings, not only with the runs' own.

What is *measured* comes from runs at the stated conditions: a crossing read from paired runs at
the volume it names, a cost at the N and volume it names. What is *modelled* says so and names the
volume it was checked at, with the error the check showed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lab.study import sitting as sitting_mod

REFERENCE_VOLUME = 100_000
QUICK_VOLUME = 5_000
MAIN_BROKERS = ("kafka", "rabbitmq")
MAIN_DIRECT = "wal"
HEADLINE_PAIR = (MAIN_DIRECT, "kafka")  # the pair the never-restarted and steady-rate questions compare
STEADY_RATE = 200.0  # the slow steady stream's rate (the `steady` profile's, lab.study.series)
# the second condition: the direct readers' claim table pruned behind every slot ("claims pruned")
PRUNED = sitting_mod.CONDITIONS[("claim_retention", "behind-slots")]
BROKER_NAMES = {"kafka": "Kafka", "rabbitmq": "RabbitMQ", "kafka-share": "Kafka share groups"}


@dataclass(frozen=True)
class Finding:
    """One question a team asks, answered in one sentence."""

    question: str
    sentence: str
    kind: str  # "measured" | "modelled"
    held: str  # "2 of 3 sittings"; "" with one sitting


# -- reading records ----------------------------------------------------------------------------

def record_runs(record: Mapping[str, Any]) -> pd.DataFrame:
    """The sitting's runs of the plain condition: pipeline, consumers, messages, arm, block, index,
    ms, norm, steady_ms, fixed_cpu_s, parts, and ``cpu_ms_per_msg`` for the cost model."""
    return sitting_mod.runs_frame(sitting_mod.plain_rows(record.get("runs") or []))


def plain_cells(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The sitting's cells of the plain condition (a second condition's are read apart)."""
    return sitting_mod.plain_rows(record.get("cells") or [])


def condition_runs(record: Mapping[str, Any], condition: str) -> list[Mapping[str, Any]]:
    """The sitting's runs (record rows) under ``condition`` ("" the plain one)."""
    return [r for r in record.get("runs") or [] if (r.get("condition") or "") == condition]


def machine(record: Mapping[str, Any]) -> str:
    """The machine a sitting ran on: ``0035969ec53f AMD EPYC``, the hash of its machine id and its CPU
    model. Virtual machines cloned from one image share a machine id while their hosts differ (the
    same id has come with an AMD EPYC and an Intel Xeon), so the id alone does not tell machines
    apart; the CPU model beside it does, as far as the record can."""
    m = record.get("machine") or {}
    return f"{m.get('id')} {m.get('cpu_model') or '(CPU unknown)'}"


def label(record: Mapping[str, Any]) -> str:
    """``2026-12-06 quick on 003596 AMD EPYC``: the day, the profile and the machine."""
    m = record.get("machine") or {}
    return (f"{record.get('day')} {record.get('profile')} on {str(m.get('id'))[:6]}"
            f" {m.get('cpu_model') or '(CPU unknown)'}")


def cells(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (sitting, pipeline, consumers, messages, condition): sitting, day, machine,
    profile, pipeline, consumers, messages, condition (``main``, ``volume arm``, or a second
    condition's name such as ``claims pruned``), median_ms, lo_ms, hi_ms, runs."""
    rows = []
    for rec in records:
        for c in rec.get("cells") or []:
            rows.append({"sitting": rec["id"], "day": rec.get("day"), "machine": machine(rec),
                         "profile": rec.get("profile"), "pipeline": c["pipeline"], "consumers": c["consumers"],
                         "messages": c["messages"],
                         "condition": c.get("condition") or ("volume arm" if c.get("arm") else "main"),
                         "median_ms": c["median"], "lo_ms": c["lo"], "hi_ms": c["hi"], "runs": c["runs"]})
    cols = ["sitting", "day", "machine", "profile", "pipeline", "consumers", "messages", "condition", "median_ms",
            "lo_ms", "hi_ms", "runs"]
    return pd.DataFrame(rows, columns=cols)


def crossing(record: Mapping[str, Any], direct: str, broker: str, messages: int,
             basis: str = "diff", condition: str = "") -> dict[str, Any] | None:
    """The measured crossing of one sitting (:func:`lab.study.sitting.crossing_from`) with the
    paired differences per N: ``{"between", "at", "below", "beyond", "clear", "diffs": {n: [...]}}``;
    ``condition`` "" the plain one (a record written before conditions has only that), else e.g.
    ``"claims pruned"``."""
    want = (direct, broker, messages, condition)
    for c in record.get("crossings") or []:
        if ((c["direct"], c["broker"], c["messages"], c.get("condition") or "") == want
                and c.get("basis", "diff") == basis):
            diffs: dict[int, list[float]] = {}
            for p in record.get("pairs") or []:
                if (p["direct"], p["broker"], p["messages"], p.get("condition") or "") == want \
                        and p.get(basis) is not None:
                    diffs.setdefault(int(p["consumers"]), []).append(float(p[basis]))
            return {**c, "diffs": diffs}
    return None


def comparable(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The sittings the answer reads: the study's own conditions (single topology, closed loop,
    the study's profiles; a smoke report's numbers are noise)."""
    return [r for r in records if r.get("profile") not in ("smoke", None)
            and (r.get("conditions") or {}).get("topology", "single") == "single"
            and not (r.get("conditions") or {}).get("rate")]


def sittings_with(records: Sequence[Mapping[str, Any]], messages: int) -> list[Mapping[str, Any]]:
    """The sittings whose main cells were measured at ``messages`` per start."""
    return [r for r in records if messages in ((r.get("conditions") or {}).get("volumes") or [])]


def held(k: int, n: int) -> str:
    return f"{k} of {n} sitting{'s' if n != 1 else ''}"


def span(values: Sequence[float], digits: int = 1) -> str:
    """``5.1`` or ``4.6–5.5``."""
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}–{hi:.{digits}f}"


# -- the measured crossing across sittings ------------------------------------------------------

def crossing_summary(records: Sequence[Mapping[str, Any]], direct: str, broker: str,
                     messages: int, condition: str = "") -> dict[str, Any] | None:
    """The measured crossing over the sittings at ``messages`` (under ``condition``, "" the plain
    one): each sitting's result, the median and range of ``at`` over those that crossed inside the
    measured N, and how many found the same bracket of measured N. None when no sitting paired the
    two at that volume."""
    per = []
    for rec in sittings_with(records, messages):
        c = crossing(rec, direct, broker, messages, condition=condition)
        if c is not None and c.get("ns"):
            per.append((rec, c))
    return _summary(direct, broker, messages, per, condition)


def _summary(direct: str, broker: str, messages: int,
             per: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], condition: str = "") -> dict[str, Any] | None:
    if not per:
        return None
    ats = [float(c["at"]) for _, c in per if c.get("at") is not None]
    brackets = [tuple(c["between"]) if c.get("between") else ("below" if c["below"] else "beyond") for _, c in per]
    common, split = common_bracket(brackets)
    return {"direct": direct, "broker": broker, "messages": messages, "condition": condition, "sittings": len(per),
            "per_sitting": [{"sitting": r["id"], "day": r.get("day"), "machine": machine(r),
                             "between": c.get("between"), "at": c.get("at"),
                             "below": c["below"], "beyond": c["beyond"], "clear": c.get("clear"),
                             "max_n": max(c["ns"]), "min_n": min(c["ns"])} for r, c in per],
            "median_at": statistics.median(ats) if ats else None, "ats": ats,
            "common": common, "common_count": brackets.count(common), "split": split}


def _overlaps(a: Any, b: Any) -> bool:
    """Two sittings' results can both be true: equal, or brackets of measured N that overlap (a
    sitting without N = 8 finds 4 to 16 where another finds 4 to 8)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return max(a[0], b[0]) < min(a[1], b[1])
    return a == b


def common_bracket(brackets: Sequence[Any]) -> tuple[Any, bool]:
    """The result most sittings found (a bracket ``(lo, hi)`` of measured N, ``below`` or
    ``beyond``), and whether others were found as often (``split``). A tie goes to the result the
    most sittings' results overlap (:func:`_overlaps`), then to the fewest readers: never to the
    order a set happens to iterate in."""
    counts = {b: brackets.count(b) for b in brackets}
    top = max(counts.values())

    def key(b: Any) -> tuple[int, float, float]:
        lo, hi = (0.0, 0.0) if b == "below" else (math.inf, math.inf) if b == "beyond" else b
        return (-sum(_overlaps(b, o) for o in brackets), lo, hi)

    tied = sorted((b for b, k in counts.items() if k == top), key=key)
    return tied[0], len(tied) > 1


def outcome_words(p: Mapping[str, Any]) -> str:
    """One sitting's result in a few words: ``between N = 4 and 16 (≈ 7.6)``, ``no crossing up to
    N = 16``, ``the broker cheaper already at N = 1``."""
    if p.get("between"):
        lo, hi = p["between"]
        return f"between N = {lo} and {hi}" + (f" (≈ {float(p['at']):.1f})" if p.get("at") is not None else "")
    if p.get("below"):
        return f"the broker cheaper already at N = {p['min_n']}"
    return f"no crossing up to N = {p['max_n']}"


def split_words(s: Mapping[str, Any]) -> str:
    """`` No bracket was found more often than another: …`` with each sitting's result and machine, where no result was
    found more often than another (:func:`common_bracket`); else nothing."""
    if not s.get("split"):
        return ""
    return " No bracket was found more often than another: " + "; ".join(
        f"{outcome_words(p)} on {p.get('machine') or 'a machine'} ({str(p.get('day'))[5:]})"
        for p in s["per_sitting"]) + "."



# -- at a fixed rate ----------------------------------------------------------------------------

def at_rate(records: Sequence[Mapping[str, Any]], rate: float) -> list[Mapping[str, Any]]:
    """The sittings whose measured runs were open loop at ``rate`` msg/s (single topology, not
    ``smoke``; :func:`comparable` keeps them out of the closed-loop answer): what N* at that rate
    is measured from. Empty for ``rate`` 0."""
    if not rate > 0:
        return []
    return [r for r in records if r.get("profile") not in ("smoke", None)
            and (r.get("conditions") or {}).get("topology", "single") == "single"
            and float((r.get("conditions") or {}).get("rate") or 0.0) == float(rate)]


def rate_crossings(record: Mapping[str, Any], direct: str, broker: str) -> list[dict[str, Any]]:
    """One sitting's measured crossings on its runs' steady parts (``diff_steady``), one per volume
    it ran at (:func:`crossing`); none in a record written before that basis existed."""
    vols = (record.get("conditions") or {}).get("volumes") or []
    return [c for m in vols if (c := crossing(record, direct, broker, int(m), basis="diff_steady")) is not None
            and c.get("ns")]


def rate_crossing_summary(records: Sequence[Mapping[str, Any]], direct: str, broker: str,
                          rate: float) -> dict[str, Any] | None:
    """:func:`crossing_summary` over the sittings at ``rate`` (:func:`at_rate`), each read from its
    paired runs' steady parts: no start cost, like a Debezium never restarted. None when no such
    sitting paired the two."""
    per = [(rec, c) for rec in at_rate(records, rate) for c in rate_crossings(rec, direct, broker)]
    s = _summary(direct, broker, int(per[0][1]["messages"]) if per else 0, per)
    return None if s is None else {**s, "rate": rate, "ns": sorted({n for _, c in per for n in c["ns"]})}


def rate_chord(records: Sequence[Mapping[str, Any]], rate: float) -> dict[str, Any] | None:
    """N* of :data:`HEADLINE_PAIR` at ``rate`` modelled from the load staircases' floors of every
    record that ran them (CPU/s = a + b·rate at two or more N, a chord between them): ``vals`` (the
    ranges' finite ends), ``n`` (sittings), ``beyond`` (how many lie beyond the staircases' N) and
    ``ns`` (the staircases' N). None when no record has both pipelines' floors."""
    from lab.study import crossover

    vals: list[float] = []
    n = 0
    beyond = 0
    for r in records:
        lines = pd.DataFrame(r.get("rates") or [])
        if lines.empty or not set(HEADLINE_PAIR) <= set(lines["pipeline"]):
            continue
        try:
            (a,) = crossover.by_rate(lines.assign(steps=0, rates=None), *HEADLINE_PAIR, rates=(rate,))
        except ValueError:
            continue
        n += 1
        rr = a.range
        if rr is None:
            continue
        vals += [x for x in rr if math.isfinite(x)]
        beyond += int(not a.measured)
    if not n:
        return None
    ns = sorted({int(x["consumers"]) for r in records for x in r.get("rates") or []})
    return {"vals": vals, "n": n, "beyond": beyond, "ns": ns}


def _steady_cells(record: Mapping[str, Any], pipeline: str) -> dict[int, float]:
    """N → the median steady part (ms CPU per message) of the pipeline's measured runs at N."""
    per: dict[int, list[float]] = {}
    for r in record.get("runs") or []:
        if r["pipeline"] == pipeline and not r.get("arm") and r.get("steady_ms") is not None:
            per.setdefault(int(r["consumers"]), []).append(float(r["steady_ms"]))
    return {n: statistics.median(v) for n, v in per.items()}


def crossing_sentence(s: Mapping[str, Any]) -> str:
    """One sentence for :func:`crossing_summary` (the direct side named with its condition, if any:
    "`wal` (claims pruned)")."""
    b = BROKER_NAMES.get(s["broker"], s["broker"])
    who = f"`{s['direct']}`" + (f" ({s['condition']})" if s.get("condition") else "")
    vol = f"{s['messages']:,} messages per Debezium start, closed loop"
    n = s["sittings"]
    common = s["common"]
    max_n = max(p["max_n"] for p in s["per_sitting"])
    if common == "beyond":
        return (f"{b} costs more than {who} at every N measured up to {max_n} "
                f"({vol}): no crossing up to N = {max_n}." + split_words(s))
    if common == "below":
        first = min(p["min_n"] for p in s["per_sitting"])
        return f"{b} costs less than {who} already at N = {first} ({vol})." + split_words(s)
    lo, hi = common
    at = s["ats"]
    where = (f"N* ≈ {s['median_at']:.1f}" + (f" (range {span(at)} over {n} sittings)" if len(at) > 1 else "")
             if at else "")
    return (f"{b} costs less than {who} from between N = {lo} and {hi} on: {where}, read from paired "
            f"runs at {vol}." + split_words(s))


# -- costs at a point ---------------------------------------------------------------------------

def _volume_curve(points: Mapping[int, float], m: float) -> tuple[float, str]:
    """A cell's cost at ``m`` messages per start from its costs at the measured volumes: exact at
    a measured volume, else the line F + c·M through the two nearest volumes (linear in 1/M),
    ``beyond`` outside the measured volumes."""
    vols = sorted(points)
    exact = [v for v in vols if v == m]
    if exact:
        return points[exact[0]], "measured"
    if len(vols) == 1:
        return points[vols[0]], "beyond"
    lo_side = [v for v in vols if v < m]
    hi_side = [v for v in vols if v > m]
    if lo_side and hi_side:
        a, b, how = lo_side[-1], hi_side[0], "inside"
    elif hi_side:  # below the smallest volume
        a, b, how = vols[0], vols[1], "beyond"
    else:
        a, b, how = vols[-2], vols[-1], "beyond"
    # a run's whole CPU (ms) is F + c·M: the line through both volumes, then c + F/m per message
    ya, yb = points[a] * a, points[b] * b
    c = (yb - ya) / (b - a)
    f = ya - c * a
    return (c + f / m if math.isfinite(m) else c), how


def _n_curve(points: Mapping[int, float], n: int) -> tuple[float, str]:
    """A cost at ``n`` readers from the costs at the measured N: exact, linear between the two
    nearest, or the line through the two nearest outside them (``beyond``)."""
    ns = sorted(points)
    if n in points:
        return points[n], "measured"
    if len(ns) == 1:
        return points[ns[0]], "beyond"
    lo = [x for x in ns if x < n]
    hi = [x for x in ns if x > n]
    if lo and hi:
        a, b, how = lo[-1], hi[0], "inside"
    else:
        a, b, how = (ns[0], ns[1], "beyond") if hi else (ns[-2], ns[-1], "beyond")
    return points[a] + (points[b] - points[a]) * (n - a) / (b - a), how


def estimate(record: Mapping[str, Any], pipeline: str, consumers: int, messages: float,
             rate: float = 0.0) -> dict[str, Any] | None:
    """One sitting's cost of ``pipeline`` at (N, M, rate), ms CPU per message, and where the
    point lies against what the sitting measured: ``volume``, ``n``, ``rate`` each ``measured``,
    ``inside`` (interpolated) or ``beyond`` (extrapolated). Closed loop (rate 0) from the plain
    cells' medians at every volume (main and arm); at a fixed rate from the runs' steady parts where the
    sitting ran at that rate (``rate`` then ``measured``), else from the staircases' floors
    (1000·a/rate + b); neither carries a start cost. None when the sitting has no such pipeline, or
    ran at a fixed rate and the point is closed loop."""
    sat = float((record.get("conditions") or {}).get("rate") or 0.0)
    if rate > 0 and sat == rate and (steady := _steady_cells(record, pipeline)):
        value, how_n = _n_curve(steady, consumers)
        return {"ms": value, "n": how_n, "volume": "not used (each run's steady part: no start cost)",
                "rate": "measured"}
    if rate > 0:
        lines = [r for r in record.get("rates") or [] if r["pipeline"] == pipeline]
        if not lines:
            return None
        per_n = {int(r["consumers"]): 1000 * r["a_cpu_per_s"] / rate + r["b_ms_per_msg"] for r in lines}
        value, how_n = _n_curve(per_n, consumers)
        return {"ms": value, "n": how_n, "volume": "not used (no start cost at a fixed rate)",
                "rate": "inside" if 50 <= rate <= 800 else "beyond"}
    if sat > 0:  # its cells are open loop: no closed-loop cost
        return None
    by_n: dict[int, dict[int, float]] = {}
    for c in plain_cells(record):
        if c["pipeline"] == pipeline:
            by_n.setdefault(int(c["consumers"]), {})[int(c["messages"])] = float(c["median"])
    if not by_n:
        return None
    at_n: dict[int, float] = {}
    hows: dict[int, str] = {}
    for n, vols in by_n.items():
        at_n[n], hows[n] = _volume_curve(vols, messages)
    value, how_n = _n_curve(at_n, consumers)
    ns = sorted(at_n)
    near = {max((n for n in ns if n <= consumers), default=ns[0]),
            min((n for n in ns if n >= consumers), default=ns[-1])}
    how_v = {hows[n] for n in near}
    volume = "measured" if how_v == {"measured"} else ("beyond" if "beyond" in how_v else "inside")
    return {"ms": value, "n": how_n, "volume": volume, "rate": "closed loop"}


def answer(records: Sequence[Mapping[str, Any]], consumers: int, messages: float, rate: float = 0.0) -> pd.DataFrame:
    """Every pipeline's cost at (N, M, rate) over the sittings that measured it: the median of the
    sittings' estimates, their range, how many sittings, and whether the point lies inside what
    was measured (volume, N, rate) or beyond it. At a fixed rate a pipeline measured at that rate (a
    sitting at that rate) is read from those sittings only, the staircases' model where it was not;
    a pipeline some sittings measured at the point (or around it) is read from those alone, not from
    the extrapolations of sittings that ran one volume or a few N.
    The leader comes first: the pipeline no other beats head to head (:func:`leader`; ``wins``, the
    sittings each was cheapest in); each other row
    carries ``x``, its cost ÷ the leader's in the same sitting (within a sitting only the pipelines
    read as closely in volume as its best, measured before interpolated before extrapolated, are set
    against each other; median over the ``x_sittings`` that
    estimated both; ``x_lo``, ``x_hi`` their range), ordered by it."""
    out = []
    per_sitting: dict[str, dict[str, float]] = {}  # sitting → pipeline → its estimate there
    volume_how: dict[str, dict[str, str]] = {}  # sitting → pipeline → measured, inside or beyond in volume
    pipelines = list(dict.fromkeys(c["pipeline"] for r in records for c in r.get("cells") or []))
    for p in pipelines:
        ests = [(r, e) for r in records if (e := estimate(r, p, consumers, messages, rate)) is not None]
        ests = [(r, e) for r, e in ests if e["rate"] == "measured"] or ests
        # where some sittings measured the point (or lie around it), those alone: a sitting that ran
        # one volume or a few N only would add its extrapolation to their measurements
        ests = [(r, e) for r, e in ests if "beyond" not in (e["volume"], e["n"], e["rate"])] or ests
        if not ests:
            continue
        for r, e in ests:
            if e["n"] != "beyond":  # outside a sitting's measured N nothing is set against a measured cost
                per_sitting.setdefault(str(r.get("id")), {})[p] = float(e["ms"])
                volume_how.setdefault(str(r.get("id")), {})[p] = e["volume"]
        v = [e["ms"] for _, e in ests]
        where = {k: sorted({e[k] for _, e in ests}) for k in ("volume", "n", "rate")}
        beyond = [k for k, vals in where.items() if "beyond" in vals]
        out.append({"pipeline": p, "ms_per_msg": statistics.median(v), "lo": min(v), "hi": max(v),
                    "sittings": len(v), "volume": "/".join(where["volume"]), "n": "/".join(where["n"]),
                    "rate": "/".join(where["rate"]),
                    "where": (f"beyond what was measured ({', '.join(beyond)})" if beyond
                              else "inside what was measured")})
    cols = ["pipeline", "ms_per_msg", "lo", "hi", "sittings", "volume", "n", "rate", "where", "wins", "x", "x_lo",
            "x_hi", "x_sittings"]
    df = pd.DataFrame(out, columns=cols[:9])
    if df.empty:
        return pd.DataFrame(columns=cols)
    # the leader is the pipeline no other beats head to head (leader; ties: the most sittings won,
    # then the lower median cost); every other is given as its cost ÷ the leader's in the same
    # sitting, which a machine three times faster than another leaves alone, where the pooled costs do not
    # within a sitting, like with like: where some pipeline was measured at that volume, one carried
    # there from another volume is not set against it (poll run at 100,000 only, against wal at 5,000)
    rank = {"measured": 0, "inside": 1}
    for sid, costs in per_sitting.items():
        hows = volume_how[sid]
        best = min(rank.get(h, 2) for h in hows.values())
        per_sitting[sid] = {p: v for p, v in costs.items() if rank.get(hows[p], 2) == best}
    contested = [c for c in per_sitting.values() if len(c) > 1]
    wins = [min(c, key=lambda k: c[k]) for c in contested]
    df["wins"] = [wins.count(p) for p in df["pipeline"]]
    df = df.sort_values(["wins", "ms_per_msg"], ascending=[False, True]).reset_index(drop=True)
    first = leader(contested, [str(p) for p in df["pipeline"]])
    df = pd.concat([df[df["pipeline"] == first], df[df["pipeline"] != first]]).reset_index(drop=True)
    ratios = same_sitting_ratios(contested, first)
    df["x"] = [statistics.median(ratios[p]) if p in ratios else None for p in df["pipeline"]]
    df["x_lo"] = [min(ratios[p]) if p in ratios else None for p in df["pipeline"]]
    df["x_hi"] = [max(ratios[p]) if p in ratios else None for p in df["pipeline"]]
    df["x_sittings"] = [len(ratios.get(p, [])) for p in df["pipeline"]]
    df.loc[0, ["x", "x_lo", "x_hi"]] = 1.0
    lead, rest = df.iloc[:1], df.iloc[1:]
    rest = rest.assign(_k=rest["x"].fillna(float("inf"))).sort_values(["_k", "ms_per_msg"]).drop(columns="_k")
    return pd.concat([lead, rest]).reset_index(drop=True)[cols]


# -- prediction errors --------------------------------------------------------------------------

def prediction_errors(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The quick model's prediction of every cell measured at another volume, per sitting:
    sitting, day, pipeline, consumers, messages, predicted, measured, error_pct."""
    rows = [{"sitting": r["id"], "day": r.get("day"), **p}
            for r in records for p in (r.get("model") or {}).get("predictions") or [] if p.get("measured") is not None]
    return pd.DataFrame(rows, columns=["sitting", "day", "pipeline", "consumers", "messages", "predicted", "measured",
                                       "error_pct"])


# -- the findings -------------------------------------------------------------------------------

def _cheapest(records: Sequence[Mapping[str, Any]], consumers: int, messages: int) -> tuple[str, str, str] | None:
    recs = sittings_with(records, messages)
    if not recs:
        return None
    table = answer(recs, consumers, messages)
    table = table[table["n"] == "measured"]
    if table.empty:
        return None
    wins = []
    per_sitting = []
    for r in recs:
        costs = {c["pipeline"]: c["median"] for c in plain_cells(r)
                 if c["consumers"] == consumers and c["messages"] == messages and not c.get("arm")}
        if costs:
            wins.append(min(costs, key=lambda k: costs[k]))
            per_sitting.append(costs)
    # the option no other beats head to head leads (the medians of costs pooled over machines of
    # different speeds can favour another, and so can counting sittings won when some options ran in
    # fewer sittings); then the others as answer() ordered them
    first_p = leader(per_sitting, [str(p) for p in table["pipeline"]])
    table = pd.concat([table[table["pipeline"] == first_p], table[table["pipeline"] != first_p]])
    first = table.iloc[0]
    others = ", ".join(f"`{row.pipeline}` {row.ms_per_msg:.2f}" for row in table.iloc[1:].itertuples())
    n = len(recs)
    k = int(first.sittings)  # the sittings that measured the leader there
    w = wins.count(first.pipeline)
    rng = f" (range {first.lo:.2f}–{first.hi:.2f} over {k} sittings)" if k > 1 else ""
    most = (f" in {w} of the {k} sittings that measured it (of {n})" if k < n
            else f" in {w} of {n} sittings" if n > 1 else "")
    sentence = (f"At N = {consumers} and {messages:,} messages per start, `{first.pipeline}` costs least{most}: "
                f"{first.ms_per_msg:.2f} ms CPU per message{rng}, against {others}.")
    ratios = same_sitting_ratios(per_sitting, str(first.pipeline))
    if n > 1 and ratios:
        sentence += (f" Machines differ in speed, so the ratio within each sitting is what carries over "
                     f"(× `{first.pipeline}`'s cost, median and range over sittings): "
                     + ", ".join(f"`{p}` ×{statistics.median(v):.2f} ({span(v, 2)})" for p, v in ratios.items())
                     + ".")
    return sentence, "measured", held(w, k) if k > 1 else ""


def leader(per_sitting: Sequence[Mapping[str, float]], order: Sequence[str]) -> str:
    """The option that costs least over sittings (``per_sitting``: pipeline → cost, a mapping per
    sitting; ``order`` the candidates, ties going to the earlier): one that no other beats head to head,
    i.e. is cheaper than it in more than half of the sittings that measured both, and among those the
    one cheapest in the most sittings. Counting sittings won alone favours an option measured in more
    sittings: `wal`, cheapest in 3 of 6, over `poll`, cheaper than `wal` in both sittings that ran it.
    With no unbeaten option (a cycle), the one cheapest in the most sittings."""
    wins = [min(c, key=lambda k: c[k]) for c in per_sitting if c]

    def beaten(p: str) -> bool:
        for q in order:
            shared = [c for c in per_sitting if p in c and q in c] if q != p else []
            if shared and 2 * sum(c[q] < c[p] for c in shared) > len(shared):
                return True
        return False

    pool = [p for p in order if not beaten(p)] or list(order)
    return min(pool, key=lambda p: (-wins.count(p), list(order).index(p)))


def same_sitting_ratios(per_sitting: Sequence[Mapping[str, float]], base: str) -> dict[str, list[float]]:
    """Each pipeline's cost ÷ ``base``'s in the same sitting, one value per sitting that measured
    both (``per_sitting``: pipeline → cost, a mapping per sitting): the figure that survives a
    machine two or three times faster than another, where the costs themselves do not."""
    out: dict[str, list[float]] = {}
    for costs in per_sitting:
        b = costs.get(base)
        if not b:
            continue
        for p, v in costs.items():
            if p != base and v is not None:
                out.setdefault(p, []).append(float(v) / float(b))
    return out


def findings(records: Sequence[Mapping[str, Any]], current: Mapping[str, Any] | None = None) -> list[Finding]:
    """The answer, one sentence per question, from the ledger (``current``, a record not yet in
    ``records``, is added to it). The closed-loop questions read :func:`comparable` sittings; the
    steady stream's also the sittings at :data:`STEADY_RATE` (:func:`at_rate`)."""
    everything = list(records) + ([current] if current is not None and current.get("id") not in
                                  {r.get("id") for r in records} else [])
    recs = comparable(everything)
    out: list[Finding] = []
    for volume in (REFERENCE_VOLUME, QUICK_VOLUME):
        for broker in MAIN_BROKERS:
            s = crossing_summary(recs, MAIN_DIRECT, broker, volume)
            if s is None:
                continue
            q = f"From which N does {BROKER_NAMES[broker]} pay off at {volume:,} messages per start?"
            out.append(Finding(q, crossing_sentence(s), "measured",
                               held(s["common_count"], s["sittings"]) if s["sittings"] > 1 else ""))
    pruned = _pruned_finding(recs)
    if pruned is not None:
        out.append(pruned)
    for volume in (REFERENCE_VOLUME, QUICK_VOLUME):
        c = _cheapest(recs, 4, volume)
        if c is not None:
            out.append(Finding(f"Which option costs least at N = 4, {volume:,} messages per start?", *c))
    check = _model_check_finding(recs)
    if check is not None:
        out.append(check)
    steady = _steady_finding(recs)
    if steady is not None:
        out.append(steady)
    rate = _rate_finding(recs, STEADY_RATE, measured=at_rate(everything, STEADY_RATE))
    if rate is not None:
        out.append(rate)
    return out


def _pruned_finding(records: Sequence[Mapping[str, Any]]) -> Finding | None:
    """The crossing with `wal`'s claim table pruned (:data:`PRUNED`), read from paired runs at the
    reference volume, beside the never-pruned crossing of the same sittings; None when no sitting
    measured it. ``held``: the sittings that found the common bracket, out of those that measured it."""
    s = crossing_summary(records, MAIN_DIRECT, HEADLINE_PAIR[1], REFERENCE_VOLUME, condition=PRUNED)
    if s is None:
        return None
    same = [r for r in records if r["id"] in {p["sitting"] for p in s["per_sitting"]}]
    plain = crossing_summary(same, MAIN_DIRECT, HEADLINE_PAIR[1], REFERENCE_VOLUME)
    text = crossing_sentence(s)
    if plain is not None:
        text += (" With the claims never pruned, in the same sitting" + ("s" if plain["sittings"] > 1 else "")
                 + ": " + _bracket_words(plain) + ".")
    b = BROKER_NAMES[HEADLINE_PAIR[1]]
    return Finding(f"And with the claim table pruned, from which N does {b} pay off at "
                   f"{REFERENCE_VOLUME:,} messages per start?", text, "measured",
                   held(s["common_count"], s["sittings"]))


def _bracket_words(s: Mapping[str, Any]) -> str:
    """``between N = 4 and 16, N* ≈ 9.1``, ``cheaper already at N = 1``, ``no crossing up to N = 16``."""
    common = s["common"]
    if s.get("split"):
        return ", ".join(outcome_words(p) for p in s["per_sitting"])
    if common == "beyond":
        return f"no crossing up to N = {max(p['max_n'] for p in s['per_sitting'])}"
    if common == "below":
        return f"the broker cheaper already at N = {min(p['min_n'] for p in s['per_sitting'])}"
    at = f", N* ≈ {s['median_at']:.1f}" if s.get("median_at") is not None else ""
    return f"between N = {common[0]} and {common[1]}{at}"


def _model_check_finding(records: Sequence[Mapping[str, Any]]) -> Finding | None:
    """How far the quick model (5,000 and 20,000 messages) missed the measured 100,000-message cells."""
    err = prediction_errors(sittings_with(records, REFERENCE_VOLUME))
    err = err[err["messages"] == REFERENCE_VOLUME]
    if err.empty:
        return None
    parts = []
    for p, g in err.groupby("pipeline", sort=False):
        e = g["error_pct"].astype(float)
        parts.append(f"`{p}` {e.min():+.0f} % to {e.max():+.0f} %")
    n = err["sitting"].nunique()
    text = ("The quick model (F fitted across 5,000 and 20,000 messages) predicted the measured 100,000-message "
            f"cells of the same sitting{'s' if n > 1 else ''} with errors of " + ", ".join(parts)
            + " (every N): a model figure at that volume is good only to that error.")
    return Finding("How far off is the model at 100,000 messages?", text, "measured", "")


def _steady_finding(records: Sequence[Mapping[str, Any]]) -> Finding | None:
    """N*∞ (a Debezium never restarted) from the runs' own timelines at the reference volume."""
    vals = []
    never = 0
    n = 0
    for r in sittings_with(records, REFERENCE_VOLUME):
        for a in (r.get("model") or {}).get("steady_in_runs") or []:
            if (a["direct"], a["broker"]) == HEADLINE_PAIR:
                n += 1
                if a["range"][0] is not None:
                    vals += [x for x in a["range"] if x is not None]
                never += int(a["never"])
    if not n:
        return None
    text = (f"A Debezium that is never restarted (steady costs from each 100,000-message run's own timeline): "
            f"`wal` meets Kafka at N*∞ {span(vals)}" if vals else "no crossing")
    text += f"{', and under some model never' if never else ''}; a model over N, not a measured crossing."
    return Finding("And for a Debezium that is never restarted?", text, "modelled", held(n - never, n) if n > 1 else "")


def _rate_finding(records: Sequence[Mapping[str, Any]], rate: float,
                  measured: Sequence[Mapping[str, Any]] = ()) -> Finding | None:
    """N* at a fixed rate: *measured* where sittings at that rate (``measured``) paired the two
    pipelines, read from their runs' steady parts, with the staircases' chord of ``records`` beside
    it as the model it checks (and where the two disagree); else that chord alone, *modelled*."""
    question = f"And for a slow steady stream ({rate:,.0f} msg/s)?"
    chord = rate_chord(records, rate)
    s = rate_crossing_summary(measured, *HEADLINE_PAIR, rate)
    if s is not None:
        # the model is checked where it was measured: the chords of the same machines; those of
        # other machines are named apart (machines differ two- to three-fold, and so may N*)
        where = {machine(r) for r in measured}
        if s.get("split") and len(where) > 1:
            return Finding(question, _rate_by_machine(records, measured, rate, sorted(where)), "measured",
                           held(s["common_count"], s["sittings"]))
        same = rate_chord([r for r in records if machine(r) in where], rate)
        other = rate_chord([r for r in records if machine(r) not in where], rate)
        text = rate_sentence(s) + (f"; on the same machine {chord_check(s, same)}" if same is not None else "")
        if other is not None:
            text += ("; on other machines the chord put N* at " + span(other["vals"]) if other["vals"]
                     else "; on other machines the chord found no crossing")
        return Finding(question, text + ".", "measured",
                       held(s["common_count"], s["sittings"]) if s["sittings"] > 1 else "")
    if chord is None:
        return None
    vals, n, beyond = chord["vals"], chord["n"], chord["beyond"]
    text = (f"At a steady {rate:,.0f} msg/s, from the load staircases at N = {', '.join(map(str, chord['ns']))}: "
            + (f"`wal` meets Kafka at N* {span(vals)}" if vals else "`wal` and Kafka do not meet")
            + (" (beyond the measured N in " + held(beyond, n) + ")" if beyond else "") + ".")
    return Finding(question, text, "modelled", held(n, n) if n > 1 else "")


def _rate_by_machine(records: Sequence[Mapping[str, Any]], measured: Sequence[Mapping[str, Any]], rate: float,
                     machines: Sequence[str]) -> str:
    """The measured crossing at ``rate`` machine by machine, each beside its own staircases' chord:
    what the finding says when the machines found different results as often."""
    lead = f"At a steady {rate:,.0f} msg/s, measured: "
    parts = []
    for m in machines:
        mine = rate_crossing_summary([r for r in measured if machine(r) == m], *HEADLINE_PAIR, rate)
        if mine is None:
            continue
        chord = rate_chord([r for r in records if machine(r) == m], rate)
        parts.append(f"On {m}: " + rate_sentence(mine).removeprefix(lead)
                     + (f"; {chord_check(mine, chord)}" if chord is not None else "") + ".")
    return f"At a steady {rate:,.0f} msg/s the machines disagree, each measured. " + " ".join(parts)


def rate_sentence(s: Mapping[str, Any]) -> str:
    """The measured crossing at a fixed rate (:func:`rate_crossing_summary`), without a full stop."""
    b = BROKER_NAMES.get(s["broker"], s["broker"])
    d = f"`{s['direct']}`"
    how = (f"paired runs at {s['rate']:,.0f} msg/s at N = {', '.join(map(str, s['ns']))}, start excluded "
           "(each run's steady part)")
    lead = f"At a steady {s['rate']:,.0f} msg/s, measured: "
    common = s["common"]
    if common == "beyond":
        max_n = max(p["max_n"] for p in s["per_sitting"])
        return f"{lead}{b} costs more than {d} at every N up to {max_n}, no crossing, in {how}"
    if common == "below":
        first = min(p["min_n"] for p in s["per_sitting"])
        return f"{lead}{b} costs less than {d} already at N = {first}, in {how}"
    lo, hi = common
    at = s["ats"]
    near = (f" (≈ {s['median_at']:.1f}" + (f", range {span(at)} over {len(at)} sittings" if len(at) > 1 else "")
            + ")") if at else ""
    return f"{lead}{d} meets {b} between N = {lo} and {hi}{near}, {how}"


def chord_check(s: Mapping[str, Any], chord: Mapping[str, Any]) -> str:
    """The staircases' chord (:func:`rate_chord`) set beside the measured crossing ``s``: what the
    model says and whether it agrees with the measured bracket of N, or where it does not."""
    model = (f"the load staircases' chord through N = {', '.join(map(str, chord['ns']))} (the model this checks) "
             + (f"put N* at {span(chord['vals'])}" if chord["vals"] else "found no crossing"))
    vals, common = chord["vals"], s["common"]
    if common == "beyond":
        max_n = max(p["max_n"] for p in s["per_sitting"])
        return model + (f", beyond N = {max_n} as well: they agree" if not vals or min(vals) > max_n
                        else ", inside the measured N where the runs found none: they disagree")
    if common == "below":
        min_n = min(p["min_n"] for p in s["per_sitting"])
        return model + (f", below N = {min_n} as well: they agree" if vals and max(vals) < min_n
                        else f", where the runs found the broker cheaper already at N = {min_n}: they disagree")
    lo, hi = common
    if not vals:
        return model + f", where the runs cross between N = {lo} and {hi}: they disagree"
    mlo, mhi = min(vals), max(vals)
    if lo <= mlo and mhi <= hi:
        return model + ", inside the measured bracket: they agree"
    if mhi < lo:
        return model + ", below the measured bracket: they disagree (the model crosses at fewer readers)"
    if mlo > hi:
        return model + ", above the measured bracket: they disagree (the model needs more readers)"
    return model + f", reaching outside the measured bracket of {lo} to {hi}: they agree only in part"


def by_sitting(values: Iterable[tuple[Mapping[str, Any], float]]) -> str:
    """``0.91 (12-06 quick), 0.95 (12-07 quick)``: each sitting's own value."""
    return ", ".join(f"{v:.2f} ({str(r.get('day'))[5:]} {r.get('profile')})" for r, v in values)
