"""Every notebook, executed with papermill on the smoke profile against the real native stack.

The kernel (``fanout-lab``, this venv's Python) gets the test stack's settings the way every child
process of the lab does: as ``LAB_*`` environment. papermill cannot pass an environment to the
kernel, so :func:`lab.study.report.execute_notebook` exports them around the execution
(:func:`lab.settings.exported`); the tests call it exactly as ``lab report`` does.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import secrets
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest

import lab.cli
from lab.settings import Settings
from lab.study import crossover, fault_matrix, ranking, series
from lab.study.report import execute_notebook
from tests.unit.study.test_page import meta

pytestmark = pytest.mark.notebooks
FIGURES = ("answer", "headline", "breakdown", "fanout", "claims", "drift", "residual", "memory", "decode", "latency",
           "broker_native", "control", "capacity", "faults_wal")
TABLES = ("runs", "headline", "cell_comparisons", "fanout_model", "crossover", "crossover_measured", "claims",
          "drift", "idle_and_residual", "memory", "decode", "ours_vs_published", "crossover_article",
          "throughput_vs_published", "participants_vs_published", "agreement", "latency", "broker_native",
          "control", "capacity", "capacity_steps", "faults", "faults_wal", "faults_by_pipeline", "ranking",
          "ranking_measured")


def _outputs(nb_path: Path) -> str:
    """Every output of an executed notebook as text (plain text, HTML, streams)."""
    nb = nbformat.read(nb_path, as_version=4)
    parts: list[str] = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            data: dict[str, Any] = out.get("data", {})
            parts += [data.get("text/plain", ""), data.get("text/html", ""), data.get("text/markdown", "")]
    return "\n".join(parts)


@pytest.fixture(scope="module")
def smoke_report(stack: Any, settings: Settings) -> tuple[Path, str]:
    """``lab report --profile smoke`` on a fresh series id, through the command line as ``make report``
    runs it: the command holds the stack's lock, and the notebook kernel it starts runs the series
    under that lock (series.ipynb, then analysis.ipynb and the parts)."""
    stack.up()  # idempotent; an earlier test module may have stopped it
    sid = f"nbtest-{secrets.token_hex(3)}"
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setattr(lab.cli, "get_settings", lambda: settings)  # the test stack's, not the process-wide ones
        status = lab.cli.main(["report", "--profile", "smoke", "--series-id", sid])
    assert status == 0, printed.getvalue()
    # its last lines say where the page, its first screen's screenshot and the site are
    last = dict(line.split(": ", 1) for line in printed.getvalue().strip().splitlines()[-3:])
    assert list(last) == ["page", "screenshot", "site"], printed.getvalue()
    html = Path(last["page"])
    assert html.name == "report.html" and html.exists()
    assert Path(last["screenshot"]) == html.parent / "first-screen.png" and Path(last["site"]).name == "index.html"
    return html.parent, sid


def test_series_notebook_ran_every_planned_cell(smoke_report: tuple[Path, str]) -> None:
    out, sid = smoke_report
    runs = pd.read_csv(out / "runs.csv")
    plan = series.plan("smoke")
    assert (runs["series_id"] == sid).all() and len(runs) == len(plan)
    assert sorted(zip(runs["pipeline"], runs["consumers"], runs["label"].fillna(""), strict=True)) == sorted(
        (s.pipeline, s.consumers, s.label) for s in plan)
    failed = runs.loc[~runs["success"], ["pipeline", "consumers", "error"]]
    assert failed.empty, failed.to_string()
    text = _outputs(out / "series.ipynb")
    assert f"series {sid}: {len(plan)} runs" in text and "ms CPU/msg" in text


def test_report_has_the_headline_table_and_the_figures(smoke_report: tuple[Path, str]) -> None:
    out, _ = smoke_report
    html = (out / "report.html").read_text()
    assert "The headline: ms CPU per message" in html
    # the first table: every pipeline ranked at the smoke report's point (N = 2, its 300 messages per
    # start, closed loop), cheapest first, with the smoke fault matrix's dead consumer beside it
    table = pd.read_csv(out / "ranking.csv")
    assert list(table.columns) == [*ranking.COLUMNS, *ranking.DEAD_COLUMNS]
    assert set(table["pipeline"]) == set(series.pipelines_of("smoke"))
    assert table["rank"].tolist() == list(range(1, len(table) + 1)), table.to_string()  # all measured at N = 2
    assert table["ms_per_msg"].is_monotonic_increasing and (table["ms_per_msg"] > 0).all()
    assert table["x_cheapest"].iloc[0] == 1.0 and (table["x_cheapest"] >= 1.0).all()
    assert table["basis"].str.startswith("measured at N = 2").all() and (table["coverage"] == 0).all()  # 1 run
    dead = table.set_index("pipeline")
    for p in ("wal", "kafka"):  # the smoke matrix's two cells
        assert (dead.loc[p, "dead_lost"], dead.loc[p, "dead_duplicates"]) == (0, 0), p
        assert dead.loc[p, "dead_waits"] in ("its messages", "every consumer", "nobody"), p
        assert dead.loc[p, "dead_backlog"] in ("slot", "broker", "slot+broker", "none"), p
        assert 0 <= dead.loc[p, "dead_delivered_pct"] <= 150, p
    assert (dead.loc[["wal-sharded", "rabbitmq"], "dead_backlog"] == "—").all()  # not in the smoke matrix
    first, second = re.findall(r"<table.*?</table>", html, re.S)[:2]  # the answer has none: the rankings come first
    assert "N = 1" in first and "N = 2" in first and "(1)" in first  # every measured N, each with its ranks
    assert "whose messages wait" in second
    assert all(f"<td>{p}</td>" in second for p in series.pipelines_of("smoke"))
    assert "Every pipeline at N = 2, 300 messages per start, closed loop" in html
    headline = pd.read_csv(out / "headline.csv")
    cells = set(zip(headline["pipeline"], headline["consumers"], strict=True))
    assert cells == {(p, n) for p in series.pipelines_of("smoke") for n in (1, 2)}
    # the pivoted headline table is in the page: a row per pipeline, a column per N, medians inside
    tables = re.findall(r"<table.*?</table>", html, re.S)
    pivot = [t for t in tables if all(f"<th>{p}</th>" in t for p in series.pipelines_of("smoke"))
             and "<th>1</th>" in t and "<th>2</th>" in t]
    assert pivot, "no headline table in report.html"
    first = headline.iloc[0]
    assert f"{first['median']:.3f}".rstrip("0") in pivot[0]
    images = re.findall(r'<img[^>]+src="data:image/png;base64,', html)
    assert len(images) >= len(FIGURES)
    assert "costmodel.fit_fanout" not in html  # the code cells are hidden
    # one page: the study (ending with the article side by side), then latency at a fixed rate, the
    # broker-native stand, the control experiment and the fault matrix
    at = [html.find(h) for h in ('id="answer"', "Every pipeline at the points the series measured",
                                  "The headline: ms CPU per message", "Against the article",
                                  "Latency at a fixed rate", "Maximum sustainable rate", "Broker-native experiment",
                                  "Control experiment", "Faults: how each architecture insulates", ">Appendix<",
                                  "The pipelines and the metric", "Definitions: the fixed part",
                                  "How this was measured", "Where and with what it ran",
                                  'id="Every-run"')]  # the heading: "Every run" is also prose in the latency part
    assert -1 not in at and at == sorted(at), at


def test_report_shows_the_idle_baseline_memory_and_decode_volume(smoke_report: tuple[Path, str]) -> None:
    out, _ = smoke_report
    idle = pd.read_csv(out / "idle_and_residual.csv")
    assert idle["ms_per_msg_net"].notna().all()  # every run carries the series' idle baseline
    assert (idle["ms_per_msg_net"] <= idle["ms_per_msg"] + 1e-9).all() and (idle["idle_ms_per_msg"] >= 0).all()
    assert idle["unattributed_ms_per_msg"].notna().all()
    decode = pd.read_csv(out / "decode.csv").set_index(["pipeline", "consumers"])
    assert decode.loc[("wal", 2), "slots"] == 2 and decode.loc[("kafka", 2), "slots"] == 1
    # fan-out decodes the WAL once per reader: two wal readers decode about twice one Debezium's
    assert decode.loc[("wal", 2), "mb_per_slot"] > 0
    memory = pd.read_csv(out / "memory.csv")
    assert (memory["postgres_mb"] > 0).all() and (memory["total_mb"] > memory["postgres_mb"]).all()
    assert (memory["consumers_mb"] > 0).all()
    html = (out / "report.html").read_text()
    assert "Idle baseline and residual" in html and "Memory and WAL decode volume" in html
    for name in FIGURES:
        assert (out / f"{name}.png").stat().st_size > 1000 and (out / f"{name}.svg").read_text().startswith("<?xml")
    for name in TABLES:
        assert (out / f"{name}.csv").exists(), name
    table = pd.read_csv(out / "crossover.csv")
    direct, brokers = crossover.sides(series.pipelines_of("smoke"))
    assert len(table) == len(direct) * len(brokers)


def test_scenario_notebook_runs_one_scenario(stack: Any, settings: Settings, tmp_path: Path) -> None:
    params = {"pipeline": "wal", "consumers": 2, "messages": 300, "senders": 20, "cooldown_s": 0.0,
              "label": "nbtest-scenario"}
    nb = execute_notebook("scenario", tmp_path / "scenario.ipynb", params, settings=settings)
    text = _outputs(nb)
    assert re.search(r"success\s+True", text), text[:2000]
    assert "postgres" in text and "unattributed" in text and "total" in text
    stored = [json.loads(p.read_text()) for p in (settings.data_dir / "runs").glob("*/run.json")]
    assert any(r["scenario"]["label"] == "nbtest-scenario" and r["success"] for r in stored)


def test_a_bad_parameter_stops_before_anything_starts(stack: Any, settings: Settings, tmp_path: Path) -> None:
    from lab.stack.base import StackError

    with pytest.raises(StackError, match="unknown pipeline 'nats'"):
        execute_notebook("scenario", tmp_path / "bad.ipynb", {"pipeline": "nats"}, settings=settings)


@pytest.mark.matrix  # the smoke report runs this notebook too (see test_report_*)
def test_control_notebook_measures_throughput(stack: Any, settings: Settings, tmp_path: Path) -> None:
    sid = f"nbtest-control-{secrets.token_hex(3)}"
    params = {"messages": 150, "consumers": "1,2", "pipelines": "kafka,wal", "cooldown_s": 0.0,
              "series_id": sid, "report_dir": str(tmp_path)}
    text = _outputs(execute_notebook("control", tmp_path / "control.ipynb", params, settings=settings))
    table = pd.read_csv(tmp_path / "control.csv")
    assert set(zip(table["pipeline"], table["consumers"], strict=True)) == {
        (p, n) for p in ("kafka", "wal") for n in (1, 2)}
    assert (table["msg_per_s"] > 0).all() and (table["msg_per_s"] <= table["ideal"] * 1.5).all()
    assert "transports indistinguishable" in text and (tmp_path / "control.png").exists()


@pytest.mark.matrix  # the smoke report runs this notebook too (see test_report_*)
def test_broker_native_notebook_runs_the_three_arms(stack: Any, settings: Settings, tmp_path: Path) -> None:
    sid = f"nbtest-native-{secrets.token_hex(3)}"
    params = {"messages": 300, "consumers": 2, "producers": 20, "cooldown_s": 0.0, "series_id": sid,
              "report_dir": str(tmp_path)}
    text = _outputs(execute_notebook("broker_native", tmp_path / "bn.ipynb", params, settings=settings))
    table = pd.read_csv(tmp_path / "broker_native.csv")
    assert list(table["pipeline"]) == ["kafka", "rabbitmq", "wal"] and (table["runs"] == 1).all()
    assert (table["ms_per_msg"] > 0).all() and list(table["published"]) == [0.45, 0.58, 2.22]
    assert (table["ms.senders"] > 0).all() and "0.45" in text and "2.22" in text
    assert (tmp_path / "broker_native.png").stat().st_size > 1000


@pytest.mark.matrix  # the smoke report runs this notebook too (see test_report_*)
def test_latency_notebook_runs_a_fixed_rate_series(stack: Any, settings: Settings, tmp_path: Path) -> None:
    sid = f"nbtest-latency-{secrets.token_hex(3)}"
    params = {"rate": 100.0, "profile": "smoke", "pipelines": "wal,kafka", "consumers": "1,2",
              "series_id": sid, "report_dir": str(tmp_path)}
    text = _outputs(execute_notebook("latency", tmp_path / "latency.ipynb", params, settings=settings))
    assert f"series {sid}: 4 runs at 100 msg/s" in text  # smoke has no warm-up
    t = pd.read_csv(tmp_path / "latency.csv")
    assert set(zip(t["pipeline"], t["consumers"], strict=True)) == {(p, n) for p in ("wal", "kafka") for n in (1, 2)}
    assert ((t["p50"] > 0) & (t["p50"] <= t["p95"]) & (t["p95"] <= t["p99"]) & (t["p99"] <= t["max"])).all()
    assert (t["rate"] == 100.0).all() and t["achieved_rate"].between(80, 110).all()
    assert (t["cpu_ms_per_msg"] > 0).all()
    assert (tmp_path / "latency.png").stat().st_size > 1000 and (tmp_path / "latency.svg").exists()


def test_report_sets_ours_beside_the_article(smoke_report: tuple[Path, str]) -> None:
    out, _ = smoke_report
    html = (out / "report.html").read_text()
    for heading in ("The crossover the article's way", "Throughput and correctness",
                    "CPU per participant", "Where we agree with the article"):
        assert heading in html, heading
    article = pd.read_csv(out / "crossover_article.csv")
    assert round(article.set_index(["direct", "broker"]).loc[("wal", "kafka"), "n_star_published"]) == 11
    assert article["missing_ours"].str.contains("N=8").all()  # smoke measures N = 1, 2 only
    tp = pd.read_csv(out / "throughput_vs_published.csv")
    assert (tp["send_per_s"] > 0).all() and (tp["ops_per_msg"] > 0).all() and (tp["send_p95_ms"] > 0).all()
    parts = pd.read_csv(out / "participants_vs_published.csv")
    assert set(parts["participant"]) == {"postgres", "kafka", "rabbitmq", "debezium", "web", "test", "sum"}
    assert (parts.loc[parts["participant"] == "test", "ours"] > 0).all()
    agree = pd.read_csv(out / "agreement.csv")
    assert agree["published"].notna().all() and agree["ours"].notna().any()


def test_report_runs_the_control_experiment_at_the_profiles_size(smoke_report: tuple[Path, str]) -> None:
    from lab.study.report import EXTRAS

    out, _ = smoke_report
    size = EXTRAS["smoke"]["control"]
    table = pd.read_csv(out / "control.csv")
    assert set(zip(table["pipeline"], table["consumers"], strict=True)) == {
        (p, int(n)) for p in size["pipelines"].split(",") for n in size["consumers"].split(",")}
    assert (table["msg_per_s"] > 0).all() and "transports indistinguishable" in _outputs(out / "control.ipynb")


def test_report_measures_latency_and_the_broker_native_stand(smoke_report: tuple[Path, str]) -> None:
    """What the latency and broker-native notebooks compute, checked on the smoke report's own run of them."""
    from lab.study.report import EXTRAS

    out, _ = smoke_report
    size = EXTRAS["smoke"]
    t = pd.read_csv(out / "latency.csv")
    assert set(zip(t["pipeline"], t["consumers"], strict=True)) == {
        (p, int(n)) for p in size["latency"]["pipelines"].split(",") for n in size["latency"]["consumers"].split(",")}
    assert ((t["p50"] > 0) & (t["p50"] <= t["p95"]) & (t["p95"] <= t["p99"]) & (t["p99"] <= t["max"])).all()
    assert (t["rate"] == size["latency"]["rate"]).all() and (t["cpu_ms_per_msg"] > 0).all()
    assert t["achieved_rate"].between(0.8 * size["latency"]["rate"], 1.1 * size["latency"]["rate"]).all()
    bn = pd.read_csv(out / "broker_native.csv")
    assert list(bn["pipeline"]) == ["kafka", "rabbitmq", "wal"] and (bn["runs"] == 1).all()
    assert (bn["ms_per_msg"] > 0).all() and list(bn["published"]) == [0.45, 0.58, 2.22]
    assert (bn["ms.senders"] > 0).all()


def test_report_finds_the_maximum_sustainable_rate_per_pipeline(smoke_report: tuple[Path, str]) -> None:
    from lab.study.report import CAPACITY, EXTRAS

    out, sid = smoke_report
    size = CAPACITY["smoke"]
    cap = pd.read_csv(out / "capacity.csv")
    pipes = EXTRAS["smoke"]["latency"]["pipelines"].split(",")  # the staircases run on the latency's pipelines
    cells = {(p, int(n)) for p in pipes for n in size["steps_consumers"].split(",")}
    assert set(zip(cap["pipeline"], cap["consumers"], strict=True)) == cells and (cap["runs"] == 1).all()
    steps = pd.read_csv(out / "capacity_steps.csv")
    assert steps["run_ok"].all()  # every staircase run worked every message it sent
    rates = [float(r) for r in size["rate_steps"].split(",")]
    assert set(steps["rate"]) <= set(rates) and (steps["achieved_rate"] > 0).all()
    assert (steps["cpu_ms_per_msg"] > 0).all() and (steps["p99_ms"] > 0).all()
    assert f"staircase series {sid}-capacity-warm1s: " in _outputs(out / "latency.ipynb")  # a warmed series


def test_report_runs_the_smoke_fault_matrix(smoke_report: tuple[Path, str], settings: Settings) -> None:
    """The smoke matrix (make test's): wal and kafka x a dead consumer on the real stack,
    every message accounted for; the table, the WAL figure and the reading are on the page."""
    out, sid = smoke_report
    plan = fault_matrix.plan("smoke")
    table = pd.read_csv(out / "faults.csv")
    assert list(zip(table["pipeline"], table["spec"], strict=True)) == [(s.pipeline, s.fault) for s in plan]
    failed = table.loc[~table["success"].astype(bool), ["pipeline", "spec", "error"]]
    assert failed.empty, failed.to_string()
    assert (table["lost"] == 0).all() and (table["duplicates"] >= 0).all()  # at-least-once on both
    assert (table["fault"] == "consumer-dead").all()
    assert (table["duplicates"] == 0).all(), "a stopped consumer re-works nothing (docs/benchmarks.md)"
    assert (table["wal_peak_mb"] > 0).all() and table["wal_slope_kb_s"].notna().all()
    assert table["backlog_where"].str.fullmatch(r"(none|source|broker|source\+broker)( \(broker not sampled\))?").all()
    wal = pd.read_csv(out / "faults_wal.csv")
    slots = wal.groupby(["pipeline", "spec"])["slot"].nunique()
    assert {(p, n) for (p, _), n in slots.items()} == {("wal", 2), ("kafka", 1)}  # a slot per reader, Debezium's one
    stored = [r for r in (json.loads(p.read_text()) for p in (settings.data_dir / "runs").glob("*/run.json"))
              if r.get("series_id") == f"faults-{sid}"]
    assert sorted(r["run_id"] for r in stored) == sorted(table["run_id"])
    html = (out / "report.html").read_text()
    assert "What the matrix says" in html and f"{len(plan)} of {len(plan)} accounted cells lost nothing" in html


def test_faults_notebook_analyses_a_stored_matrix_without_running(
        smoke_report: tuple[Path, str], settings: Settings, tmp_path: Path) -> None:
    out, sid = smoke_report
    runs = settings.data_dir / "runs"
    before = sorted(p.name for p in runs.iterdir())
    params = {"profile": "smoke", "series_id": f"faults-{sid}", "run": False, "report_dir": str(tmp_path)}
    text = _outputs(execute_notebook("faults", tmp_path / "faults.ipynb", params, settings=settings))
    assert sorted(p.name for p in runs.iterdir()) == before, "run=False runs nothing"
    assert f"fault matrix faults-{sid}: 2 of 2 cells" in text
    assert list(pd.read_csv(tmp_path / "faults.csv")["run_id"]) == list(pd.read_csv(out / "faults.csv")["run_id"])


def test_analysis_notebook_ranks_a_stored_series_at_another_point(
        smoke_report: tuple[Path, str], settings: Settings, tmp_path: Path) -> None:
    """A reader's other point on the smoke report's stored series, nothing run: N = 1 at 100 msg/s,
    where the staircases (50 and 100 msg/s at N = 1) give each pipeline its floor per second."""
    out, sid = smoke_report
    runs = settings.data_dir / "runs"
    before = sorted(p.name for p in runs.iterdir())
    params = {"series_id": sid, "report_dir": str(tmp_path), "n_boot": 200, "consumers": 1,
              "messages_per_start": 300, "rate": 100.0}  # the staircases and the matrix by the series' names
    text = _outputs(execute_notebook("analysis", tmp_path / "analysis.ipynb", params, settings=settings))
    assert sorted(p.name for p in runs.iterdir()) == before, "the analysis runs nothing"
    assert "Every pipeline at N = 1, 300 messages per start, 100 msg/s" in text
    table = pd.read_csv(tmp_path / "ranking.csv").set_index("pipeline")
    steps = pd.read_csv(out / "capacity_steps.csv")
    held = steps[steps["sustainable"].astype(bool)].groupby("pipeline")["rate"].nunique()
    floored = set(held[held >= 2].index)  # a floor needs two sustainable steps
    assert floored, steps.to_string()
    for p in series.pipelines_of("smoke"):
        if p in floored:
            assert table.loc[p, "basis"].endswith("floor from the staircases") and table.loc[p, "ms_per_msg"] > 0, p
        else:
            assert pd.isna(table.loc[p, "rank"]) and "msg/s" in table.loc[p, "note"], p
    assert list(pd.read_csv(tmp_path / "ranking.csv")["dead_lost"].dropna()) == [0, 0]  # the same matrix
    assert f"fault matrix `faults-{sid}`, 2 cells" in text


def test_topology_notebook_compares_stored_runs_of_both_topologies(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The ha report's last page on stored runs, no stack: three nodes that each cost
    what the single broker did triple the broker's CPU (``x3`` 1.0), the standby is an added
    participant, and a side without runs says which command to run. The kernel says nothing on the
    terminal (it talks to papermill over Unix sockets: no warning about TCP without encryption)."""
    from lab.results import write_run

    settings = Settings(data_dir=tmp_path / "data", stack_dir=tmp_path / "stack")
    i = 0
    for topo in ("single", "ha"):
        for n in (1, 2, 4):
            for jitter in (0.0, 0.05, 0.1):
                cpu = {"postgres": 1.0 + jitter, "debezium": 1.0, "consumers": 0.5 * n, "web": 0.5, "senders": 0.5}
                cpu |= {"kafka": 0.6} if topo == "single" else {
                    "kafka-1": 0.6, "kafka-2": 0.6, "kafka-3": 0.6, "postgres-standby": 0.2}
                write_run({"run_id": f"k{i}", "started_at": f"2026-12-01T00:00:{i:02d}", "topology": topo,
                           "scenario": {"pipeline": "kafka", "consumers": n, "messages": 1000, "senders": 200},
                           "success": True, "cpu_s": cpu, "cpu_ms_per_msg": sum(cpu.values()),
                           "series_id": f"t-{topo}"}, settings=settings)
                i += 1
    for topo, p99 in (("single", 100.0), ("ha", 250.0)):  # the fixed-rate series beside them
        for j in range(3):
            cpu = {"postgres": 1.0, "debezium": 1.0, "consumers": 1.0, "web": 0.5, "senders": 0.5}
            write_run({"run_id": f"r{i}", "started_at": f"2026-12-01T00:01:{i:02d}", "topology": topo,
                       "scenario": {"pipeline": "kafka", "consumers": 2, "messages": 1000, "senders": 200,
                                    "rate": 500.0},
                       "success": True, "cpu_s": cpu, "cpu_ms_per_msg": sum(cpu.values()),
                       "latency_ms": {"p50": p99 / 4, "p99": p99 + j}, "series_id": f"t-{topo}-rate500"},
                      settings=settings)
            i += 1
    params = {"ha_series_id": "t-ha", "single_series_id": "t-single", "report_dir": str(tmp_path),
              "ha_latency_series_id": "t-ha-rate500", "single_latency_series_id": "t-single-rate500"}
    text = _outputs(execute_notebook("topology", tmp_path / "topology.ipynb", params, settings=settings))
    assert "single: 9 measured runs of series t-single" in text and "ha: 9 measured runs" in text
    latency = pd.read_csv(tmp_path / "topology_latency.csv")
    p99 = latency[latency["percentile"] == "p99"].iloc[0]
    assert (p99["rate"], p99["consumers"], p99["single"], p99["ha"]) == (500.0, 2, 101.0, 251.0)
    mult = pd.read_csv(tmp_path / "topology_multiplier.csv")
    assert mult["broker_x"].tolist() == pytest.approx([3.0] * 4) and mult["x3"].tolist() == pytest.approx([1.0] * 4)
    parts = pd.read_csv(tmp_path / "topology_participants.csv")
    assert parts.loc[parts["participant"] == "postgres-standby", "added"].tolist() == pytest.approx([0.2] * 3)
    assert (tmp_path / "topology.png").exists() and len(pd.read_csv(tmp_path / "topology_cells.csv")) == 3
    params["single_series_id"] = "none-such"
    text = _outputs(execute_notebook("topology", tmp_path / "alone.ipynb", params, settings=settings))
    assert "No measured single runs" in text
    terminal = capfd.readouterr().err
    assert "without encryption" not in terminal and "Warning" not in terminal, terminal


def test_report_page_reads_well_in_a_real_browser(smoke_report: tuple[Path, str]) -> None:
    """The smoke report's page in headless Chromium at 1400 × 900: it loads with no console error and no
    broken image, every image says what it shows, the answer's first sentence and its figure are on the
    first screen, and no printed output, warning or traceback is on the page. `lab report` stored the
    screenshot of that first screen beside it."""
    from lab.study import browser

    out, _ = smoke_report
    view = browser.view(out / "report.html")
    assert view.problems() == [], view.problems()
    shot = (out / "first-screen.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(shot[16:20], "big"), int.from_bytes(shot[20:24], "big")) == browser.VIEWPORT
    assert meta((out / "report.html").read_text(), "property", "og:image") == "first-screen.png"


def test_report_publishes_the_site(smoke_report: tuple[Path, str], settings: Settings) -> None:
    """`lab report` ends by writing the site: the answer and the index of sittings, the results of every
    sitting, the newest report and its screenshot; every link relative and present, every image with
    its alternative text, and its first page clean in the browser too."""
    from lab.results import site_dir
    from lab.study import browser

    out, _ = smoke_report
    site = site_dir(settings)
    assert (site / "report.html").read_bytes() == (out / "report.html").read_bytes()
    assert (site / "first-screen.png").exists() and (site / "results.html").exists() and (site / "answer.png").exists()
    index = (site / "index.html").read_text()
    for href in re.findall(r'(?:href|src)="([^"#]+)"', index):
        assert not href.startswith(("/", "http")) and (site / href).exists(), href
    assert meta(index, "property", "og:image") == "answer.png"
    for name in ("index.html", "results.html"):
        view = browser.view(site / name, selectors=browser.FIRST_SCREEN if name == "index.html" else ())
        assert view.problems() == [], (name, view.problems())
