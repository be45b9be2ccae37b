"""The matrix run, and the runs it stored.

:func:`run_matrix` runs the plan as a series (``series_id`` in every run.json). A failed run is a
*finding* (RabbitMQ losing a killed consumer's claims, a slot invalidated under ``wal-sharded``),
so resuming skips every cell that has a stored run, failed or not; ``retry_failed`` re-runs the
failed ones, ``force`` every cell. A cell whose run raised before it was stored is recorded with its
error and the matrix goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from lab.results import iter_runs
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.proc import exclusive
from lab.study.fault_matrix.plan import cell_label
from lab.study.series import Step

log = logging.getLogger(__name__)


def _stored(series_id: str, settings: Settings | None) -> dict[Scenario, list[dict[str, Any]]]:
    """Every stored run of the series (failed ones too), per scenario, oldest first."""
    out: dict[Scenario, list[dict[str, Any]]] = {}
    names = set(Scenario.field_names())
    for run in sorted(iter_runs(settings=settings), key=lambda r: str(r.get("started_at"))):
        params = run.get("scenario") or {}
        if run.get("series_id") != series_id or not set(params) <= names:
            continue
        try:
            out.setdefault(Scenario(**params), []).append(run)
        except (TypeError, ValueError):
            continue
    return out


def _pick(runs: list[dict[str, Any]], retry_failed: bool = False) -> dict[str, Any] | None:
    """The run that stands for a cell: its last successful one, else its last failed one (unless
    ``retry_failed``), else None."""
    done = [r for r in runs if r.get("success")] or ([] if retry_failed else runs)
    return done[-1] if done else None


def stored(plan: Sequence[Scenario], settings: Settings, *, series_id: str) -> list[dict[str, Any]]:
    """The stored run of every cell of ``plan`` that has one in ``series_id`` (nothing is run)."""
    runs = _stored(series_id, settings)
    return [r for r in (_pick(runs.get(s, [])) for s in plan) if r is not None]


def stored_series(series_id: str, settings: Settings | None = None) -> list[dict[str, Any]]:
    """The run that stands for every cell stored in ``series_id`` (:func:`_pick`), in the order they
    were run, whatever profile planned them: what a reader of the matrix needs without its plan."""
    picked = [r for r in map(_pick, _stored(series_id, settings).values()) if r is not None]
    return sorted(picked, key=lambda r: (r.get("series_index") is None, r.get("series_index") or 0))


async def run_matrix(plan: Sequence[Scenario], settings: Settings, *, series_id: str, force: bool = False,
                     retry_failed: bool = False, progress: Callable[[Step], None] | None = None,
                     ) -> list[dict[str, Any]]:
    """Run every cell of ``plan`` not run before in ``series_id``; return each cell's run.json
    content (module docstring: what is skipped, what a cell that raised records)."""
    from lab.runner import run_scenario

    report = progress or (lambda step: None)
    results: list[dict[str, Any]] = []
    with exclusive(settings.run_lock, "the stack", settings.lock_owner):
        stored = {} if force else _stored(series_id, settings)
        for i, scenario in enumerate(plan):
            done = _pick(stored.get(scenario, []), retry_failed)
            if done is not None:
                report(Step(i, len(plan), scenario, "skipped", result=done))
                results.append(done)
                continue
            report(Step(i, len(plan), scenario, "start"))

            def on_phase(phase: str, info: dict[str, Any], i: int = i, s: Scenario = scenario) -> None:
                report(Step(i, len(plan), s, "phase", phase=phase))

            meta = {"series_id": series_id, "series_index": i}
            try:
                result = await run_scenario(scenario, settings, progress=on_phase, meta=meta)
            except Exception as exc:  # not stored: the next resume tries it again
                log.exception("%s: the run raised", cell_label(scenario))
                result = {"run_id": None, "scenario": scenario.as_parameters(), "success": False,
                          "error": f"{type(exc).__name__}: {exc}", **meta}
            log.info("[%d/%d] %s: %s", i + 1, len(plan), cell_label(scenario), outcome(result))
            report(Step(i, len(plan), scenario, "done", result=result))
            results.append(result)
    return results


def outcome(result: dict[str, Any]) -> str:
    """One line per cell: lost, duplicates, resume, and the error of a failed run."""
    acc = (result.get("fault") or {}).get("accounting") or {}
    parts = [f"lost {acc['lost']}, duplicates {acc.get('extra_calls')}" if "lost" in acc else ""]
    if acc.get("time_to_resume_s") is not None:
        parts.append(f"resumed after {acc['time_to_resume_s']:.2f} s")
    if result.get("window_s"):
        parts.append(f"{result.get('cpu_ms_per_msg')} ms CPU/msg")
    head = "ok" if result.get("success") else f"FAILED ({result.get('error')})"
    return "; ".join([head, *(p for p in parts if p)])
