"""Every message accounted for: from the work calls the web service saw and the ids
of ``messages``, never from the consumers' own counters (a killed consumer's die with it).

Input: the web service's arrivals in call order (id, wall time, and with ``--by-consumer`` the
index of the consumer that called), and the ids of ``messages``. Per message id, ``c`` = its
number of work calls:

* ``once``: ids with c = 1; ``repeated``: ids with c > 1; ``extra_calls`` = Σ (c − 1): the
  duplicates; ``lost``: ids of ``messages`` with c = 0 (which ones: ``lost_ids``, as inclusive
  ``[first, last]`` runs); ``foreign``: worked ids not in ``messages``.
* ``max_burst``: the longest run of consecutive calls (in arrival order) that each repeated an id
  already worked, the size of a replay; per consumer the same over that consumer's own calls.

The identities that must hold (``adds_up``): once + repeated = distinct, distinct + extra_calls =
work calls, distinct − foreign + lost = messages. Per consumer: ``first`` (calls that were an id's
first) and ``repeats`` sum to that consumer's calls; Σ first = distinct, Σ repeats = extra_calls;
``once``: ids delivered exactly once, by this consumer (Σ once = once).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

from lab.measure.recovery import first_call_after, longest_stall_after

__all__ = ["account", "adds_up", "first_call_after", "id_ranges", "ids_of", "longest_stall_after"]


def account(ids: Sequence[int], messages: Collection[int], by: Sequence[int] | None = None) -> dict[str, Any]:
    """The accounting of one run (module docstring); ``by`` is parallel to ``ids`` when given."""
    calls = Counter(ids)
    message_set = set(messages)
    distinct = len(calls)
    once = sum(1 for c in calls.values() if c == 1)
    foreign = sum(1 for i in calls if i not in message_set)
    lost_ids = sorted(i for i in message_set if i not in calls)
    lost = len(lost_ids)
    seen: set[int] = set()
    burst = max_burst = 0
    per: dict[int, dict[str, int]] = {}
    runs: dict[int, int] = {}
    for n, message_id in enumerate(ids):
        repeat = message_id in seen
        seen.add(message_id)
        burst = burst + 1 if repeat else 0
        max_burst = max(max_burst, burst)
        if by is not None:
            who = by[n]
            row = per.setdefault(who, {"calls": 0, "first": 0, "repeats": 0, "once": 0, "max_burst": 0})
            row["calls"] += 1
            row["repeats" if repeat else "first"] += 1
            row["once"] += calls[message_id] == 1
            runs[who] = runs.get(who, 0) + 1 if repeat else 0
            row["max_burst"] = max(row["max_burst"], runs[who])
    out: dict[str, Any] = {
        "messages": len(message_set), "work_calls": len(ids), "distinct": distinct,
        "once": once, "repeated": distinct - once, "extra_calls": len(ids) - distinct,
        "lost": lost, "lost_ids": id_ranges(lost_ids), "foreign": foreign, "max_burst": max_burst,
        "max_calls_per_id": max(calls.values(), default=0),
        "per_consumer": {str(k): per[k] for k in sorted(per)} if by is not None else None,
        "max_burst_per_consumer": max((r["max_burst"] for r in per.values()), default=0) if by is not None else None,
    }
    out["adds_up"] = adds_up(out)
    return out


def id_ranges(ids: Sequence[int]) -> list[list[int]]:
    """Sorted ids as inclusive ``[first, last]`` runs: which messages, compactly (run.json)."""
    out: list[list[int]] = []
    for i in ids:
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def ids_of(ranges: Sequence[Sequence[int]]) -> list[int]:
    """The ids of :func:`id_ranges`' runs."""
    return [i for first, last in ranges for i in range(first, last + 1)]


def adds_up(a: dict[str, Any]) -> bool:
    """The identities of the module docstring, on an :func:`account` result."""
    ok = (a["once"] + a["repeated"] == a["distinct"]
          and a["distinct"] + a["extra_calls"] == a["work_calls"]
          and a["distinct"] - a["foreign"] + a["lost"] == a["messages"])
    per = a.get("per_consumer")
    if per:
        ok = ok and (sum(r["first"] for r in per.values()) == a["distinct"]
                     and sum(r["repeats"] for r in per.values()) == a["extra_calls"]
                     and sum(r["once"] for r in per.values()) == a["once"]
                     and all(r["first"] + r["repeats"] == r["calls"] for r in per.values()))
    return ok
