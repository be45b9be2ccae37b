"""The claim's cost against the claim table's size, as pure functions: the positions and batches
``lab bench claims`` claims (:mod:`lab.study.claim_table`), what an ``EXPLAIN`` of the claim says,
and the model of a run's claim cost the cells give.

**The model.** The claim's second branch (the claims the slot already owns) joins the batch with
``inbox_wal``. While the table is small the planner reads all of it for that join (a hash join over
a sequential scan): each statement costs a + b·K for a table of K rows. From some size on
(:func:`lab.study.claim_table.plan_switch`) it looks the batch up in the primary key instead, and the
cost stops growing (``flat``). A run's table grows from 0 to M rows, so the mean claim of a run
of M messages costs (:func:`run_cost`) a + b·M/2 when M stays below the switch S, and
(S·(a + b·S/2) + (M − S)·flat) / M beyond it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lab.workload.retention import TABLE

BATCH = 100  # the readers' batch
STEP = 400  # bytes of WAL between two claimed positions, about a run's per message
BASE = 1 << 32  # the first position, 1/0
VOLUMES = (5_000, 20_000, 100_000)  # run volumes the model is read at


def positions(first: int, count: int) -> list[int]:
    """``count`` claim positions (LSNs) from the ``first``-th on, :data:`STEP` bytes apart."""
    return [BASE + (first + i) * STEP for i in range(count)]


def batches(items: Sequence[int], size: int, first: int) -> list[list[int]]:
    """``items`` cut into batches of ``size``, the first of ``first`` (1..size): claimer j of N
    starts with ``size − j·size // N``, so no two claimers' batches line up."""
    first = min(max(1, first), size)
    out = [list(items[:first])] if items else []
    out += [list(items[i:i + size]) for i in range(first, len(items), size)]
    return out


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares y = a + b·x over ``points``; None below two distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    n = len(points)
    mx, my = sum(xs) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def run_cost(line: tuple[float, float] | None, flat: float | None, switch: int | None,
             messages: int) -> float | None:
    """The claim's mean cost per message over a run of ``messages`` (module docstring): ``line``
    (a, b per row) below ``switch`` rows, ``flat`` from it (``switch`` None: the whole table is
    read at every size). None where a part it needs is missing."""
    below = messages if switch is None else min(messages, switch)
    if below <= 0:
        return flat
    if line is None:
        return None
    a, b = line
    part = below * (a + b * below / 2)
    if below == messages:
        return part / messages
    return None if flat is None else (part + (messages - below) * flat) / messages


def _nodes(node: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield node
    for child in node.get("Plans") or ():
        yield from _nodes(child)


def plan_summary(explained: Any) -> dict[str, Any]:
    """The parts of an ``EXPLAIN (FORMAT JSON)`` of the claim that say what it did: its joins (node
    types), each node on the claim table (type, relation or index, whether it looked the batch up
    by key (``keyed``: an index condition); with ``ANALYZE`` the rows it returned over its loops,
    and its loops) and the shared buffers the statement touched (hit +
    read, the top node's totals, which include its children's), with the planning and execution
    times (0 without ``ANALYZE``)."""
    top = explained[0] if isinstance(explained, list) else explained
    plan = top["Plan"]
    nodes = list(_nodes(plan))
    joins = [n["Node Type"] for n in nodes if n["Node Type"] in ("Hash Join", "Nested Loop", "Merge Join")]
    on_table = [
        {"node": n["Node Type"], "on": n.get("Index Name") or n.get("Relation Name"), "keyed": "Index Cond" in n,
         "rows": int(n.get("Actual Rows", 0) * n.get("Actual Loops", 1)), "loops": int(n.get("Actual Loops", 1))}
        for n in nodes if n.get("Relation Name") == TABLE and n["Node Type"] != "ModifyTable"]
    return {
        "joins": joins, "on_table": on_table,
        "shared_buffers": int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)),
        "planning_ms": round(float(top.get("Planning Time", 0.0)), 3),
        "execution_ms": round(float(top.get("Execution Time", 0.0)), 3),
    }


def reads_whole_table(summary: Mapping[str, Any]) -> bool:
    """Whether the claim read all of the claim table: a scan of it without a condition on its key
    (a sequential scan, or a whole index scanned in order)."""
    return any(not n["keyed"] for n in summary["on_table"])


def shape(summary: Mapping[str, Any]) -> str:
    """One line for the printed table: the joins, then how the claim table was read."""
    reads = ", ".join(f"{n['node']} {n['on']} ({n['rows']} rows)" for n in summary["on_table"])
    return f"{'+'.join(summary['joins']) or 'no join'}: {reads or 'no read of the table'}"


def fits(cells: Sequence[Mapping[str, Any]], switches: Mapping[str, int | None]) -> list[dict[str, Any]]:
    """Per condition and N: the line over the cells whose claim read the whole table, the median of
    the others (``flat``), the condition's switch, and the mean claim cost of a run at each of
    :data:`VOLUMES` (:func:`run_cost`, ms per message as run.json's ``postgres_backends``)."""
    out = []
    for cond in dict.fromkeys(c["condition"] for c in cells):
        for n in dict.fromkeys(c["claimers"] for c in cells):
            mine = [c for c in cells if c["condition"] == cond and c["claimers"] == n]
            if not mine:
                continue
            line = fit_line([(c["rows_before"], c["claim_us_per_msg"]) for c in mine if reads_whole_table(c["plan"])])
            rest = [c["claim_us_per_msg"] for c in mine if not reads_whole_table(c["plan"])]
            flat = statistics.median(rest) if rest else None
            switch = switches.get(cond)
            predicted = {m: run_cost(line, flat, switch, m) for m in VOLUMES}
            out.append({"condition": cond, "claimers": n, "switch_rows": switch,
                        "a_us_per_msg": None if line is None else round(line[0], 2),
                        "b_us_per_msg_per_100k_rows": None if line is None else round(line[1] * 100_000, 2),
                        "flat_us_per_msg": None if flat is None else round(flat, 2),
                        "predicted_ms_per_msg": {m: None if v is None else round(v / 1000, 4)
                                                 for m, v in predicted.items()}})
    return out


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table_text(out: Mapping[str, Any]) -> str:
    """The printed table: one line per cell, then the model per condition and N."""
    lines = [f"{'condition':<20} {'rows':>7} {'N':>3} {'µs/msg':>8} {'µs/stmt':>8} {'buffers':>8} {'levels':>6} "
             f"{'index kB':>8} {'dead':>5} {'aborts':>6}  plan"]
    for c in out["cells"]:
        t, p = c["table"], c["plan"]
        lines.append(f"{c['condition']:<20} {c['rows_before']:>7} {c['claimers']:>3} {c['claim_us_per_msg']:>8.1f} "
                     f"{_num(c['claim_us_per_statement'], '.0f'):>8} {p['shared_buffers']:>8} "
                     f"{_num(t.get('index_depth'), 'd'):>6} {_num(t.get('index_bytes', 0) / 1024, '.0f'):>8} "
                     f"{t.get('dead_tuples') or 0:>5} {c['speculative_aborts']:>6}  {shape(p)}")
    lines += ["", f"{'condition':<20} {'N':>3} {'switch':>7} {'a µs/msg':>9} {'b /100k rows':>13} {'flat':>7}  "
              "run's mean claim, ms/msg at M = " + ", ".join(f"{m:,}" for m in VOLUMES)]
    for f in out["fits"]:
        pred = ", ".join(_num(v, ".3f") for v in f["predicted_ms_per_msg"].values())
        lines.append(f"{f['condition']:<20} {f['claimers']:>3} {_num(f['switch_rows'], 'd'):>7} "
                     f"{_num(f['a_us_per_msg'], '.1f'):>9} {_num(f['b_us_per_msg_per_100k_rows'], '.1f'):>13} "
                     f"{_num(f['flat_us_per_msg'], '.1f'):>7}  {pred}")
    return "\n".join(lines) + "\n"
