from __future__ import annotations

import json
from pathlib import Path

from lab.results import SCHEMA_VERSION, load_runs, read_run, read_samples, write_run
from lab.settings import Settings


def _run(run_id: str, started: str, success: bool = True) -> dict[str, object]:
    return {
        "run_id": run_id, "started_at": started, "success": success, "error": None if success else "boom",
        "scenario": {"pipeline": "wal", "consumers": 2, "messages": 10},
        "counters": {"sent": 10, "processed": 10 if success else 3},
        "cpu_s": {"postgres": 1.5, "web": 0.5}, "mem_mb": {"postgres": 100.0},
        "window_s": 1.0, "cpu_ms_per_msg": 200.0, "consumers": [{"index": 0}],
    }


def test_write_is_atomic_and_loads_back(tmp_path: Path) -> None:
    settings = Settings().replace(data_dir=tmp_path)
    path = write_run(_run("b", "2026-01-02"), [{"t": 0.0, "participant": "web", "cpu_s": 0.1, "rss_mb": 5}],
                     settings=settings)
    write_run(_run("a", "2026-01-01", success=False), settings=settings)
    assert path == tmp_path / "runs" / "b" and not list((tmp_path / "runs").glob("*.tmp"))
    assert json.loads((path / "run.json").read_text())["schema_version"] == SCHEMA_VERSION
    assert read_run("b", settings=settings)["cpu_s"]["web"] == 0.5
    assert read_samples("b", settings=settings)["participant"].tolist() == ["web"]
    df = load_runs(settings=settings)
    assert df["run_id"].tolist() == ["a", "b"]  # sorted by start time
    assert df.loc[1, "cpu_s.postgres"] == 1.5 and df.loc[1, "pipeline"] == "wal"
    assert df.loc[0, "error"] == "boom"  # failed runs are kept
    assert load_runs(settings=settings, include_failed=False)["run_id"].tolist() == ["b"]


def test_no_runs_is_an_empty_frame(tmp_path: Path) -> None:
    assert load_runs(settings=Settings().replace(data_dir=tmp_path)).empty


def test_the_senders_record_is_flattened_beside_the_scenario_sender_count(tmp_path: Path) -> None:
    settings = Settings().replace(data_dir=tmp_path)
    run = _run("c", "2026-01-03")
    run["scenario"] = {**run["scenario"], "senders": 200}  # type: ignore[dict-item]
    run["senders"] = {"sent": 10, "first_send_mono": 5.0, "last_send_mono": 7.5, "send_p95_ms": 42.0,
                      "error": None, "nested": {"x": 1}}
    write_run(run, settings=settings)
    row = load_runs(settings=settings).iloc[0]
    assert row["senders"] == 200  # the scenario's count is not overwritten
    assert row["senders.send_p95_ms"] == 42.0 and row["senders.last_send_mono"] == 7.5
    assert "senders.nested" not in row.index


def test_the_layout_that_ran_wins_over_the_scenarios_auto(tmp_path: Path) -> None:
    settings = Settings().replace(data_dir=tmp_path)
    for rid, stored in (("a", {"consumer_layout": "tasks"}), ("b", {})):
        run = _run(rid, "2026-01-0" + ("1" if rid == "a" else "2"))
        run["scenario"] = {**run["scenario"], "consumer_layout": "auto"}  # type: ignore[dict-item]
        write_run({**run, **stored}, settings=settings)
    rows = load_runs(settings=settings).set_index("run_id")
    assert rows.loc["a", "consumer_layout"] == "tasks"  # resolved, as the analysis must group it
    assert rows.loc["b", "consumer_layout"] == "auto"  # nothing recorded: the scenario's value stays


def test_a_resumed_finished_series_keeps_one_sitting_record(tmp_path: Path) -> None:
    from lab.results import load_sittings, sittings_dir, write_sitting

    settings = Settings(data_dir=tmp_path)
    first = {"id": "20261206T2128Z-quick-aaaa", "series_id": "quick", "started_at": "2026-12-06T21:29:16",
             "machine": {"id": "m1"}, "runs": [{"ms": 1.0}]}
    write_sitting(first, settings=settings)
    again = {**first, "id": "20261206T2330Z-quick-bbbb", "wall_min": 1.2}  # nothing new ran
    path = write_sitting(again, settings=settings)
    assert path.name == "20261206T2128Z-quick-aaaa.json"
    assert [r["id"] for r in load_sittings(settings=settings)] == [first["id"]]
    assert load_sittings(settings=settings)[0]["wall_min"] == 1.2
    other = {**first, "id": "20261207T0100Z-quick-cccc", "series_id": "quick-2", "started_at": "2026-12-07T01:00:00"}
    write_sitting(other, settings=settings)
    assert len(list(sittings_dir(settings).glob("*.json"))) == 2
