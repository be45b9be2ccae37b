"""Whether a run succeeded, and why not: a pure function of what the run recorded.

Without a fault, Success (the reference study's predicate) is: no error, no send failed, and
sent = processed = distinct claimed ids = work calls = distinct work ids = messages, and the set of
worked (for ``inbox``: claimed) ids equals the set of ids in ``messages`` (``ids_match``; None when
not compared, e.g. a broker's direct producer writes no outbox row), and for a pipeline whose
consumers delete the rows they finished (``poll``) no row is left in ``messages`` (``outbox_left``
0; None for the others, whose rows stay). ``skipped`` (claims lost to
another consumer, acked at once: wal's fan-out, wal-sharded's early overlap, a broker's
redelivery) is counted, never part of the predicate: every one of those rows was worked once by
the consumer that won its claim.

With a fault the predicate is at-least-once, proven by :mod:`lab.runner.accounting`: no error,
every message sent, ``messages`` holds exactly the rows sent (plus a big transaction's rows), no
message without a work call (``lost`` 0), no foreign id, and the accounting adds up; duplicates
are allowed and counted. A PostgreSQL restart or failover refuses some INSERTs (``send_failed``:
never sent, not lost) and may commit a row whose reply never came (``rows_without_reply``), or, on a
failover, lose acknowledged rows the standby never received (``acknowledged_absent``).

:func:`judge` returns the :class:`Verdict`: ``success``, the run's ``error`` as run.json stores it
(the first failure's text, unchanged from earlier runs), every condition that failed (``reasons``),
and a fault run's accounting with the send-side figures added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The counters the reference's predicate compares with the message count, in run.json's order.
EQUAL_TO_MESSAGES = ("sent", "processed", "distinct_ids", "work_calls", "work_distinct")
# What a failed run's error lists (run.json's ``error``: "counters do not match: ...").
SHOWN = ("sent", "send_failed", "processed", "distinct_ids", "work_calls", "work_distinct", "ids_match")
# A fault run's accounting fields its error lists.
FAULT_SHOWN = ("messages", "lost", "foreign", "extra_calls", "adds_up", "lost_claimed_by", "acknowledged_absent")


@dataclass(frozen=True)
class FaultFacts:
    """What the verdict needs of a fault run: its kind (informative), the rows it added itself
    (big-transaction), a slot it lost (its invalidation record: that loss is said first), the
    scenario's claim mode, and whether it stopped PostgreSQL (``stops_source``: INSERTs may be
    refused meanwhile)."""

    kind: str
    extra_rows: int = 0
    invalidation: Mapping[str, Any] | None = None
    claim: str = "takeover"
    stops_source: bool = False


@dataclass(frozen=True)
class Verdict:
    success: bool
    error: str | None
    reasons: tuple[str, ...] = ()  # every condition that failed; empty on success
    accounting: dict[str, Any] | None = field(default=None)  # fault runs: with the send-side figures


def counters_of(sent: Mapping[str, Any], consumers: Sequence[Mapping[str, Any]],
                checks: Mapping[str, Any]) -> dict[str, Any]:
    """run.json's ``counters``: the senders' counts, the consumers' summed, the verification's checks."""
    def total(key: str) -> Any:
        return sum(c.get(key, 0) for c in consumers)

    return {"sent": sent.get("sent", 0), "send_failed": sent.get("send_failed", 0),
            "processed": total("processed"), "skipped": total("skipped"), "failures": total("failures"),
            "db_ops": total("db_ops"), "decoded_bytes": total("decoded_bytes"), **checks}


def consumer_errors(consumers: Sequence[Mapping[str, Any]], ended: Sequence[int] = ()) -> list[str]:
    """The consumers' own errors, but not of those a fault ended on purpose (``ended``)."""
    return [f"consumer {c['index']}: {c['error']}" for c in consumers
            if c.get("error") and c.get("index") not in set(ended)]


def planned_messages(scenario: Mapping[str, Any], sent: Mapping[str, Any]) -> int:
    """The message count the predicate compares with: a staircase the runner stopped early
    meant to send only the messages of the steps it ran (``sent.planned``, with those of its warm
    phase, which are messages of the run too)."""
    if scenario.get("rate_steps"):
        return int(sent.get("planned") or scenario["messages"])
    return int(scenario["messages"])


def judge(counters: Mapping[str, Any], messages: int, *, error: str | None = None,
          consumer_errors: Sequence[str] = (), fault: FaultFacts | None = None,
          accounting: Mapping[str, Any] | None = None) -> Verdict:
    """The run's verdict (module docstring). ``error``: the run's own exception, if any;
    ``accounting``: :func:`lab.runner.accounting.account` of a fault run (None: not measured)."""
    if error is None and consumer_errors:
        error = "; ".join(consumer_errors)
    reasons: list[str] = [f"error: {error}"] if error is not None else []
    acc = dict(accounting) if accounting is not None else None
    if fault is None:
        if counters.get("send_failed"):
            reasons.append(f"send_failed={counters.get('send_failed')}")
        reasons += [f"{k}={counters.get(k)} != messages={messages}" for k in EQUAL_TO_MESSAGES
                    if counters.get(k) != messages]
        if counters.get("ids_match") is False:  # the id sets, not only their sizes
            reasons.append("ids_match=False")
        if counters.get("outbox_left"):  # a pipeline that deletes finished rows left some
            reasons.append(f"outbox_left={counters.get('outbox_left')}")
    else:
        reasons += _fault_reasons(counters, messages, fault, acc)
    success = not reasons
    if error is None and not success and fault is not None:
        error = "fault accounting: " + (", ".join(
            f"{k}={acc.get(k)}" for k in FAULT_SHOWN if k in acc
        ) if acc else "not measured") + f", sent={counters.get('sent')}, send_failed={counters.get('send_failed')}"
        if acc and set(acc.get("lost_claimed_by") or ()) - {"(unclaimed)"} and fault.claim == "owner":
            error += ("; the reference's claim binds a row to a consumer name: with --claim takeover "
                      "a live consumer takes over the rows of one that is gone")
    if fault is not None and fault.invalidation is not None and error is not None:
        inv = fault.invalidation  # said first: the loss is this slot's
        error = (f"slot {inv['slot']} invalidated ({inv['invalidation_reason']}, wal_status "
                 f"{inv['wal_status']}), reader {inv['consumer']} ended; " + error)
    if error is None and not success:
        error = "counters do not match: " + ", ".join(f"{k}={counters.get(k)}" for k in SHOWN)
        if counters.get("outbox_left"):
            error += f", outbox_left={counters.get('outbox_left')}"
    return Verdict(success, error, tuple(reasons), acc)


def _fault_reasons(counters: Mapping[str, Any], m: int, fault: FaultFacts, acc: dict[str, Any] | None) -> list[str]:
    """A fault run's failed conditions; adds the send-side figures to ``acc`` (a copy)."""
    sent, failed, extra = counters.get("sent", 0), counters.get("send_failed", 0), fault.extra_rows
    out: list[str] = []
    if fault.stops_source:
        # an INSERT refused while PostgreSQL was down is a message never sent (counted, the sender
        # does not retry), not a lost one; one whose commit raced the shutdown may have a row
        # without a 2xx: a message too (rows_without_reply), and must be worked
        if sent + failed != m:
            out.append(f"sent+send_failed={sent + failed} != messages={m}")
        if acc is not None:
            acc["not_sent"] = failed
            acc["rows_without_reply"] = max(0, acc["messages"] - extra - sent)
            # a failover's crash: acknowledged inserts the promoted standby never received
            acc["acknowledged_absent"] = max(0, sent + extra - acc["messages"])
            if not sent + extra <= acc["messages"] <= m + extra:
                out.append(f"rows={acc['messages']} outside [{sent + extra}, {m + extra}]")
    else:
        if failed:
            out.append(f"send_failed={failed}")
        if sent != m:
            out.append(f"sent={sent} != messages={m}")
        if acc is not None and acc["messages"] != m + extra:
            out.append(f"rows={acc['messages']} != messages+extra_rows={m + extra}")
    if acc is None:
        return [*out, "accounting not measured"]
    if acc["lost"]:
        out.append(f"lost={acc['lost']}")
    if acc["foreign"]:
        out.append(f"foreign={acc['foreign']}")
    if not acc["adds_up"]:
        out.append("accounting does not add up")
    return out
