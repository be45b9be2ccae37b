"""Report helpers (tables of one run, HTML export, output files) and the control checks."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lab.results import new_report_id, report_dir
from lab.settings import Settings
from lab.study import fault_matrix, report, slow_work

RESULT = {
    "run_id": "r1", "success": True, "error": None, "window_s": 2.0, "cpu_ms_per_msg": 4.0,
    "scenario": {"pipeline": "wal", "consumers": 2, "messages": 1000},
    "cpu_s": {"postgres": 2.0, "web": 1.5, "consumers": 0.5, "unattributed": 9.0},
    "mem_mb": {"postgres": 300.0, "web": 60.0, "consumers": 120.0},
    "counters": {"sent": 1000, "processed": 1000, "skipped": 1000, "claims_min": 400, "claims_max": 600},
    "consumers": [{"index": 0, "processed": 600, "skipped": 400, "cpu_s": 0.3},
                  {"index": 1, "processed": 400, "skipped": 600, "cpu_s": 0.2}],
}


def test_participant_table_excludes_unattributed_from_the_total() -> None:
    t = report.participant_table(RESULT)
    assert list(t.index) == ["postgres", "web", "consumers", "unattributed", "total"]
    assert t.loc["total", "cpu_s"] == 4.0 and t.loc["total", "ms_per_msg"] == 4.0  # = cpu_ms_per_msg
    assert t.loc["postgres", "share_pct"] == 50.0 and pd.isna(t.loc["unattributed", "share_pct"])
    assert t.loc["web", "ms_per_msg"] == 1.5


def test_run_and_consumer_tables() -> None:
    run = report.run_table(RESULT)
    assert run.loc["msg_per_s", "r1"] == 500.0 and run.loc["skipped", "r1"] == 1000
    assert report.consumer_table(RESULT)["processed"].sum() == 1000


def test_html_export_hides_code_and_keeps_outputs(tmp_path: Path) -> None:
    cell = new_code_cell("secret_code_line = 1", outputs=[
        new_output("display_data", data={"text/html": "<table><tr><td>headline-cell</td></tr></table>"})])
    nb = new_notebook(cells=[new_markdown_cell("# A title"), cell])
    nbformat.write(nb, tmp_path / "a.ipynb")
    html = report.export_html(tmp_path / "a.ipynb", tmp_path / "a.html", title="t").read_text()
    assert "headline-cell" in html and "A title" in html and "secret_code_line" not in html


def test_outputs_go_to_the_report_folder_only_when_one_is_given(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot([1, 2], [3, 4])
    report.save_figure(fig, tmp_path, "f")
    report.save_table(pd.DataFrame({"a": [1]}), tmp_path, "t")
    report.save_figure(fig, "", "nowhere")
    report.save_table(pd.DataFrame({"a": [1]}), "", "nowhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png", "f.svg", "t.csv"]
    rid = new_report_id("quick")
    assert re.fullmatch(r"\d{8}T\d{6}Z-quick-[0-9a-f]{4}", rid) and rid != new_report_id("quick")
    assert report_dir(rid, Settings().replace(data_dir=tmp_path)) == tmp_path / "reports" / rid


def _control_runs(rates: dict[tuple[str, int], float]) -> pd.DataFrame:
    return pd.DataFrame([{"pipeline": p, "consumers": n, "messages": 3000, "window_s": 3000 / r,
                          "success": True, "work_delay_ms": 15.0} for (p, n), r in rates.items()])


def test_control_checks_pass_on_linear_equal_transports_and_fail_otherwise() -> None:
    good = {(p, n): n * 62.0 * f for p, f in (("kafka", 1.0), ("rabbitmq", 1.03), ("wal", 0.98)) for n in (2, 4, 8)}
    table = slow_work.throughput(_control_runs(good))
    assert table.loc[0, "ideal"] == pytest.approx(2 * 1000 / 15)
    assert slow_work.checks(table)["ok"].all()
    bad = dict(good) | {("wal", 8): 8 * 30.0}  # wal stops scaling at 8
    checks = slow_work.checks(slow_work.throughput(_control_runs(bad)))
    assert set(checks.loc[~checks["ok"], "subject"]) == {"wal", "N=8"}
    assert slow_work.figure(table, None, work_delay_ms=15.0).axes


def test_exported_settings_reach_children_and_are_restored() -> None:
    from lab.settings import exported

    before = Settings.from_env()
    other = before.replace(pg_port=before.pg_port + 1234, stack_dir=Path("/tmp/elsewhere"))
    with exported(other):
        seen = Settings.from_env()  # what a child process (the notebook kernel) would read
        assert (seen.pg_port, seen.stack_dir) == (other.pg_port, Path("/tmp/elsewhere"))
    assert Settings.from_env() == before


def test_build_report_runs_the_control_experiment_and_puts_it_on_the_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, dict[str, object]]] = []
    page: list[str] = []
    monkeypatch.setattr(report, "execute_notebook",
                        lambda name, out, params, **kw: calls.append((name, params)) or out)
    monkeypatch.setattr(report, "combine", lambda nbs, out: page.extend(p.stem for p in nbs) or out)
    monkeypatch.setattr(report, "export_html", lambda nb, html, **kw: html)
    settings = Settings().replace(data_dir=tmp_path)
    report.build_report("smoke", settings, series_id="s1")
    params = dict(calls)
    # the analysis last (its ranking reads the staircases and the fault matrix), first on the page
    assert [name for name, _ in calls] == ["series", "latency", "broker_native", "control", "faults", "analysis"]
    report_id = Path(params["control"]["report_dir"]).name  # the first screen speaks of the record of this sitting
    assert params["analysis"] == {"series_id": "s1", "report_dir": params["control"]["report_dir"],
                                  "sitting": report_id, "consumers": 2,
                                  "messages_per_start": -1, "rate": 0.0, "capacity_series_id": "s1-capacity-warm1s",
                                  "faults_series_id": "faults-s1", "n_boot": 200}
    # latency and the staircases on one pipeline of each side, unless the report names its pipelines
    assert params["latency"]["pipelines"] == "wal,kafka" and params["latency"]["consumers"] == "1"
    assert params["analysis"]["capacity_series_id"] == params["latency"]["steps_series_id"]
    assert params["control"]["series_id"] == report.report_series("s1", "smoke")["control"] == "s1-control"
    assert (params["control"]["messages"], params["control"]["consumers"], params["control"]["pipelines"]) == (
        100, "2", "wal")
    assert page == ["analysis", "latency", "broker_native", "control", "faults"]
    # the fault matrix at the profile's size, under the id `lab faults` uses for the default study
    assert params["faults"] == {"profile": "smoke", "pipelines": "", "series_id": "faults-s1",
                                "report_dir": params["control"]["report_dir"]}
    calls.clear()
    page.clear()
    report.build_report("quick", settings, series_id="s2", pipelines="wal,kafka")
    assert [name for name, _ in calls] == ["series", "latency", "analysis"]  # the default study
    assert dict(calls)["analysis"]["consumers"] == 4  # measured by every profile but smoke
    assert "n_boot" not in dict(calls)["analysis"] and dict(calls)["latency"]["pipelines"] == "wal,kafka"
    # quick's latency is the staircases' (per step and rate): no fixed-rate series
    assert dict(calls)["latency"]["consumers"] == "" and dict(calls)["latency"]["steps_consumers"] == "1,16"
    assert page == ["analysis", "latency"]
    calls.clear()
    report.build_report("quick", settings, series_id="s2", pipelines="wal,kafka",
                        parts=report.report_parts("quick", "faults,control"))
    assert dict(calls)["control"]["pipelines"] == "wal,kafka"  # a restricted report restricts it too
    assert dict(calls)["control"]["consumers"] == "2,8"
    assert (dict(calls)["faults"]["profile"], dict(calls)["faults"]["pipelines"]) == ("quick", "wal,kafka")
    assert report.report_series("quick", "quick")["faults"] == fault_matrix.default_series_id("quick") == "faults-quick"


def test_every_profile_has_a_fault_matrix_and_the_article_gets_quick() -> None:
    assert {p: report.EXTRAS[p]["faults"]["profile"] for p in report.EXTRAS} == {
        "smoke": "smoke", "quick": "quick", "full": "full", "article": "quick", "reference": "quick",
        "decision": "quick"}
    assert report.DEFAULT_PARTS["reference"] == ()  # the reference sitting measures its series alone
    assert all(e["faults"]["profile"] in fault_matrix.PROFILES for e in report.EXTRAS.values())


def test_a_profile_that_is_a_series_of_its_own_is_refused_before_any_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(report, "execute_notebook", lambda name, out, params, **kw: calls.append(name) or out)
    for own in ("conditions", "steady"):
        with pytest.raises(ValueError, match=f"lab series --profile {own}"):
            report.build_report(own, Settings().replace(data_dir=tmp_path), series_id="c1")
    assert calls == [] and not list(tmp_path.rglob("*"))  # no notebook ran, no report folder


def test_control_sizes_grow_with_the_profile_and_full_is_the_references() -> None:
    sizes = {p: report.EXTRAS[p]["control"] for p in ("smoke", "quick", "full")}
    assert sizes["smoke"]["messages"] < sizes["quick"]["messages"] < sizes["full"]["messages"] == 20_000
    assert sizes["full"]["consumers"] == "2,4,8"  # the published control table's N
    # quick stays short on 2 cores: at 15 ms per message N consumers do ~N x 66 msg/s
    runs = len(sizes["quick"]["pipelines"].split(","))
    work_s = sum(sizes["quick"]["messages"] / (n * 1000 / 15) for n in map(int, sizes["quick"]["consumers"].split(",")))
    assert runs * work_s < 60


def test_report_parts_default_per_profile_and_with_adds() -> None:
    assert report.report_parts("quick") == ("latency",)
    assert report.report_parts("quick", "faults") == ("latency", "faults")
    assert report.report_parts("quick", "control, broker-native") == ("latency", "broker_native", "control")
    assert report.report_parts("smoke") == report.report_parts("full") == report.PARTS
    with pytest.raises(ValueError, match="unknown report part 'fault'"):
        report.report_parts("quick", "fault")


def test_every_profile_ranks_at_an_n_it_measures() -> None:
    from lab.study import series

    assert set(report.RANKING) == set(report.EXTRAS) == set(series.REPORT_PROFILES)
    for own in ("steady", "conditions"):  # series of their own
        assert own in series.PROFILES and own not in series.REPORT_PROFILES
    for name, point in report.RANKING.items():
        assert point["consumers"] in series.profile(name).consumers, name
        assert point["rate"] == 0.0, name  # closed loop
        # a point the series measured: its own messages per start (-1), where every figure stands as measured
        assert point["messages_per_start"] == -1, name


def test_a_resumed_report_speaks_of_its_first_record_and_keeps_its_minutes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.results import load_sittings, write_sitting

    calls: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(report, "execute_notebook", lambda name, out, params, **kw: calls.append((name, params)) or out)
    monkeypatch.setattr(report, "combine", lambda nbs, out: out)
    monkeypatch.setattr(report, "export_html", lambda nb, html, **kw: html)
    same_runs = {"series_id": "q5", "started_at": "2026-12-07T09:54:51", "machine": {"id": "m1"}, "runs": []}
    monkeypatch.setattr(report.sitting, "from_store", lambda series_id, sitting_id, wall_min, **kw: {
        **same_runs, "id": sitting_id, "wall_min": wall_min})
    settings = Settings().replace(data_dir=tmp_path)
    report.build_report("quick", settings, series_id="q5")
    first = dict(calls)["analysis"]["sitting"]
    (stored,) = load_sittings(settings=settings)
    assert stored["id"] == first
    write_sitting({**stored, "wall_min": 16.4}, settings=settings)  # as long as quick-5's series took
    calls.clear()
    report.build_report("quick", settings, series_id="q5")  # a resume: the series had finished, nothing new ran
    assert dict(calls)["analysis"]["sitting"] == first  # the first screen finds the record, under its first id
    (again,) = load_sittings(settings=settings)
    assert again["id"] == first and 16.4 <= again["wall_min"] < 17.0  # the minutes before the resume kept


def test_the_analysis_finds_the_staircases_of_a_series_whose_id_names_no_profile() -> None:
    assert report.stored_capacity("quick-5", {"quick-5-capacity-warm10s"}) == "quick-5-capacity-warm10s"
    stored = {"nbtest-d6", "nbtest-d6-capacity-warm1s"}
    assert report.stored_capacity("nbtest-d6", stored) == "nbtest-d6-capacity-warm1s"
    assert report.stored_capacity("old", {"old-capacity", None}) == "old-capacity"  # before the warm phase; a lone run
    assert report.stored_capacity("quick-9", set()) == "quick-9-capacity-warm10s"  # none stored: the report's name
