"""The study as a report: notebooks executed with papermill, exported to HTML, figures and CSV.

``lab report --profile quick`` = :func:`build_report`: ``notebooks/series.ipynb`` runs (or
resumes) the series, ``notebooks/analysis.ipynb`` analyses it, ``notebooks/latency.ipynb``
measures latency at a fixed rate and the maximum sustainable rate (a load staircase per pipeline x N,
:data:`CAPACITY`), ``notebooks/broker_native.ipynb`` the broker-native stand,
``notebooks/control.ipynb`` the control experiment and ``notebooks/faults.ipynb`` the fault matrix
(each resumable, under a series id derived from the study's); each writes its figures (PNG, SVG)
and tables (CSV) into the report folder, and the five executed notebooks after the series become one
``report.html``, the analysis first. The analysis is executed last: the page's first table, every
pipeline ranked at one point (:data:`RANKING`, :mod:`lab.study.ranking`), reads the staircases and
the fault matrix beside the series (:func:`ranking_series`). The page has its code cells hidden (it
reads as text, tables and figures; the executed ``.ipynb`` files next to it keep the code).
Everything goes to ``data/reports/<UTC timestamp>-<profile>/``.

Notebooks run on the Jupyter kernel ``fanout-lab`` (this venv's Python, registered by
``make setup``); the kernel gets the settings as ``LAB_*`` environment, like every other child.
The module also holds the small table views the notebooks show for one run.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import pandas as pd

from lab.results import known_sitting, new_report_id, report_dir, write_sitting
from lab.settings import Settings, exported
from lab.stack.base import StackError
from lab.study import sitting
from lab.study.first_screen import QUESTION
from lab.study.page import Picture, combine, export_html

log = logging.getLogger(__name__)
KERNEL = "fanout-lab"
NOTEBOOKS = ("scenario", "series", "analysis", "control", "broker_native", "latency", "faults", "topology", "results")
REPORT_PAGE = ("analysis", "latency", "broker_native", "control", "faults")  # report.html, in this order
SCREENSHOT = "first-screen.png"  # the page's first screen in a browser, beside it (its link preview's image)


def notebooks_dir(settings: Settings) -> Path:
    return settings.root / "notebooks"


def require_kernel() -> None:
    """Fail with one line when the ``fanout-lab`` kernel is not registered."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        raise StackError(
            f"the Jupyter kernel {KERNEL!r} is not registered: run `make setup` (or "
            f"{sys.executable} -m ipykernel install --sys-prefix --name {KERNEL})"
        ) from None


def execute_notebook(name: str, out: Path, parameters: dict[str, Any], *, settings: Settings,
                     echo: IO[str] | None = None) -> Path:
    """Execute ``notebooks/<name>.ipynb`` with ``parameters`` into ``out``; returns ``out``.

    The kernel sees ``settings`` (as ``LAB_*``); ``echo`` receives the cells' output live.
    A failing cell raises :class:`StackError` naming the cell; ``out`` keeps the traceback.
    """
    import papermill as pm
    from traitlets.config import Config

    require_kernel()
    src = notebooks_dir(settings) / f"{name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("executing %s -> %s", src, out)
    try:
        # the kernel talks to papermill over Unix sockets in a private directory, not over loopback TCP,
        # where every message would travel unencrypted (and ipykernel warns so on every start)
        with exported(settings), tempfile.TemporaryDirectory(prefix="lab-kernel-") as sockets:
            ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets) / "kernel")}})
            pm.execute_notebook(
                str(src), str(out), parameters=parameters, kernel_name=KERNEL,
                cwd=str(src.parent), progress_bar=False, stdout_file=echo, stderr_file=echo, config=ipc,
            )
    except pm.PapermillExecutionError as exc:
        raise StackError(
            f"{name}.ipynb failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue} (see {out})"
        ) from None
    return out


# What else a report measures, per profile: the latency at a fixed rate, the
# broker-native stand and the control experiment. Sizes grow with the profile like
# the main series; smoke measures latency and the staircases on one pipeline of each side (a
# report's --pipelines overrides that); quick runs no fixed-rate series (an empty ``consumers``):
# its load staircases (on the question's three pipelines) give the latency of every step, at 100 to
# 800 msg/s, so a series at one rate would add 9 runs (about 6 minutes on a slow day) for a figure
# the staircases already hold; quick's control (6 runs of 1,500 messages with 15 ms of work) takes
# about 3-4 minutes on 2 cores, full's is the reference's 20,000 messages at N = 2, 4, 8.
EXTRAS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {"latency": {"rate": 100.0, "consumers": "1", "pipelines": "wal,kafka"},
              "broker_native": {"messages": 300, "consumers": 2, "producers": 20, "cooldown_s": 0.0},
              "control": {"messages": 100, "consumers": "2", "pipelines": "wal", "senders": 20,
                          "cooldown_s": 0.0}},
    "quick": {"latency": {"rate": 500.0, "consumers": "", "pipelines": "wal,kafka,rabbitmq"},
              "broker_native": {"messages": 20_000, "consumers": 8, "producers": 200, "cooldown_s": 5.0},
              "control": {"messages": 1_500, "consumers": "2,8", "pipelines": "kafka,rabbitmq,wal",
                          "cooldown_s": 5.0}},
    "full": {"latency": {"rate": 500.0, "consumers": "1,4,8,16"},
             "broker_native": {"messages": 200_000, "consumers": 8, "producers": 200, "repeats": 3,
                               "cooldown_s": 20.0},
             "control": {"messages": 20_000, "consumers": "2,4,8", "pipelines": "kafka,rabbitmq,wal",
                         "cooldown_s": 20.0}},
}
# The insulation matrix (lab.study.fault_matrix) at the profile's size: smoke's 2 runs (wal and
# kafka x a dead consumer, about a minute), quick's publishable 72 runs (~40-45 min on 2 cores),
# full's 60 s faults. The article profile is the article's own sweep, which had no faults: it gets the
# quick matrix (full's would more than double its time).
for _name in ("smoke", "quick", "full"):
    EXTRAS[_name]["faults"] = {"profile": _name}
EXTRAS["article"] = {**EXTRAS["full"], "latency": {"rate": 500.0, "consumers": "1,4,8"},
                     "faults": {"profile": "quick"}}
# The reference profile measures one thing, the closed-loop cost at 100,000 messages per start, and
# runs no part beside its series by default (its sitting takes most of an hour and a half already);
# `--with` adds any, at the quick sizes.
EXTRAS["reference"] = {**EXTRAS["quick"]}
# Which of them a report runs unless told otherwise (`lab report --with faults,control` adds, `make
# report WITH=...`). quick is the default study and must stay within half an hour on 2 cores: it answers
# the question (the series with its volume arm, and the load staircases that give latency per rate and
# N* by rate) and leaves out the fault matrix (~20-25 more minutes), the broker-native stand (~2.5)
# and the control experiment (~3-4), which are studies of their own (`lab faults`, `lab report
# --with broker-native,control`).
EXTRAS["decision"] = {**EXTRAS["quick"], "latency": {"rate": 500.0, "consumers": "1,16"}}
PARTS = ("latency", "broker_native", "control", "faults")
DEFAULT_PARTS: dict[str, tuple[str, ...]] = {"smoke": PARTS, "quick": ("latency",), "full": PARTS,
                                             "article": PARTS, "decision": ("latency",), "reference": ()}


def report_parts(profile: str, with_parts: str = "") -> tuple[str, ...]:
    """The profile's default parts plus ``with_parts`` (comma-separated), in :data:`PARTS` order;
    ValueError in one line for an unknown name."""
    extra = [w.strip().replace("-", "_") for w in with_parts.split(",") if w.strip()]
    for w in extra:
        if w not in PARTS:
            raise ValueError(f"unknown report part {w!r}: choose from {', '.join(p.replace('_', '-') for p in PARTS)}")
    chosen = set(DEFAULT_PARTS[profile]) | set(extra)
    return tuple(p for p in PARTS if p in chosen)
# The maximum sustainable rate: one load staircase per pipeline x N, in the latency
# notebook (lab.study.capacity). The floor per second (N* at a fixed rate) needs two sustainable
# steps of every pipeline, so the staircases start low: on 2 cores on a slow day (2026-12-04) Kafka
# and RabbitMQ could not carry 500 msg/s, and a staircase from 250 left them with one step or none.
# quick: 6 runs (wal, kafka, rabbitmq: the question's three) of at most 32 s of sending each, about
# 5 minutes on 2 cores, at N = 1 and 16 so that N* by rate is read between measured N (with N = 1
# and 4 it was a straight line drawn beyond them). With wal-sharded and a first step at 50 msg/s they
# were 8 runs of 40 s, 8.4 minutes of a 36.6-minute quick report on 2026-12-07; every pipeline
# carried 100 and 200 msg/s there, the two sustainable steps a floor needs. smoke: 2 runs of 2 x 2 s.
# Every staircase warms first (warm_s, lab.scenario.warm_plan): its top rate for warm_s, then a rest of
# max(2 s, 2 x warm_s), so Debezium's JIT has compiled before the first step is measured (a cold JVM
# biases the first steps' CPU per message, hence the floors, and the maximum sustainable rate). It
# costs warm_s + rest of wall time per staircase run: 30 s at 10 s of warm (quick, decision, reference:
# 8,000 messages at 800 msg/s; quick's 6 runs, 3 minutes), 12 s at 4 s (full, article: the same 8,000
# messages at 2,000 msg/s, a warm phase that does not leave 40,000 messages for a rest to clear), 3 s
# at 1 s (smoke, whose figures are noise: it runs the path).
CAPACITY: dict[str, dict[str, Any]] = {
    "smoke": {"rate_steps": "50,100", "step_s": 2.0, "steps_consumers": "1", "warm_s": 1.0},
    "quick": {"rate_steps": "100,200,400,800", "step_s": 8.0, "steps_consumers": "1,16", "warm_s": 10.0},
    "full": {"rate_steps": "50,100,250,500,1000,2000", "step_s": 20.0, "steps_consumers": "1,4,16", "warm_s": 4.0},
    "article": {"rate_steps": "50,100,250,500,1000,2000", "step_s": 20.0, "steps_consumers": "1,4,8", "warm_s": 4.0},
    "decision": {"rate_steps": "50,100,200,400,800", "step_s": 8.0, "steps_consumers": "1,16", "warm_s": 10.0},
    "reference": {"rate_steps": "50,100,200,400,800", "step_s": 8.0, "steps_consumers": "1,16", "warm_s": 10.0},
}


def report_series(series_id: str, profile: str) -> dict[str, str]:
    """The series a report runs: the study, its fixed-rate latency series, its broker-native one,
    its control experiment and its fault matrix (``faults-quick`` for the default study, the id
    ``lab faults --profile quick`` uses, so either resumes the other)."""
    rate = EXTRAS[profile]["latency"]["rate"]
    return {"series": series_id, "latency": f"{series_id}-rate{rate:g}", "broker_native": f"{series_id}-broker-native",
            "control": f"{series_id}-control", **ranking_series(series_id, profile)}


def ranking_series(series_id: str, profile: str = "") -> dict[str, str]:
    """The series beside the study that its ranking reads: the load staircases (the floor per
    second at a fixed rate) and the fault matrix (a dead consumer), as :func:`report_series` names them.
    The staircases' id carries their warm phase (``-warm10s``: a warmed series never resumes an
    unwarmed one), the ``warm_s`` of ``profile``'s :data:`CAPACITY` (empty: the profile the id starts
    with, as ``lab report`` names its series; none for an id of no profile)."""
    warm_s = CAPACITY.get(profile or series_id.split("-")[0], {}).get("warm_s", 0.0)
    return {"capacity": f"{series_id}-capacity" + (f"-warm{warm_s:g}s" if warm_s else ""),
            "faults": f"faults-{series_id}"}


def stored_capacity(series_id: str, stored: Iterable[str | None]) -> str:
    """The load staircases of ``series_id`` among the ``stored`` series ids: the name
    :func:`ranking_series` gives when it is stored, else a stored ``<series>-capacity`` or
    ``<series>-capacity-warm<W>s`` (a series whose id names no profile was still run by a report of
    one, warmed as that profile warms), else the name :func:`ranking_series` gives."""
    named = ranking_series(series_id)["capacity"]
    ids = {i for i in stored if isinstance(i, str)}  # a run stored outside a series has none
    if named in ids:
        return named
    base = f"{series_id}-capacity"
    found = sorted(i for i in ids if i == base or (i.startswith(f"{base}-warm") and i.endswith("s")))
    return found[-1] if found else named


# The point the report's detailed ranking is at (lab.study.ranking; the analysis notebook's
# parameters, which a reader changes in JupyterLab): a point the series measured, N = 4 at the
# series' own messages per start (-1), closed loop, so that every figure in it stands as measured.
# N = 4 is measured by every profile but smoke, which measures N = 1 and 2: it ranks at N = 2.
# A modelled point (100,000 messages per start, a rate) is the reader's to choose.
RANKING: dict[str, dict[str, Any]] = {
    name: {"consumers": 4, "messages_per_start": -1, "rate": 0.0} for name in EXTRAS}
RANKING["smoke"] = {"consumers": 2, "messages_per_start": -1, "rate": 0.0}
# Bootstrap resamples of the analysis' intervals: the notebook's default (2,000) but for smoke, whose
# figures are noise and whose report the tests run (200 are enough to check that they are drawn).
N_BOOT: dict[str, int] = {"smoke": 200}


def build_report(profile: str, settings: Settings, *, series_id: str, repeats: int | None = None,
                 seed: int | None = None, pipelines: str = "", force: bool = False,
                 idle_s: float | None = None, single_series_id: str = "", echo: IO[str] | None = None,
                 parts: Sequence[str] | None = None) -> Path:
    """Run (or resume) the series, analyse it, measure latency at a fixed rate, the broker-native
    stand, the control experiment and the fault matrix (:data:`EXTRAS`), export one
    ``report.html``; returns the report folder. ``parts``: which of :data:`PARTS` run (None: the
    profile's :data:`DEFAULT_PARTS`). Under the ``ha`` topology the page ends with the
    comparison against ``single_series_id``'s stored single runs (``topology.ipynb``; it says
    which command to run when there are none)."""
    from lab.study import series

    if not series.profile(profile).report:  # before any run: the report's notebooks would refuse it at the end
        raise ValueError(f"profile {profile!r} is a series of its own, not a report's (its runs are open loop or "
                         f"under a second condition the analysis never pools): run `lab series --profile "
                         f"{profile}`, then `lab sitting <series id>`")
    t0 = time.monotonic()
    report_id = new_report_id(profile)
    out = report_dir(report_id, settings)
    out.mkdir(parents=True)
    ids = report_series(series_id, profile)
    execute_notebook("series", out / "series.ipynb", {
        "profile": profile, "repeats": repeats or 0, "seed": seed or 0, "pipelines": pipelines,
        "series_id": series_id, "force": force, "idle_s": -1.0 if idle_s is None else idle_s,
    }, settings=settings, echo=echo)
    chosen = DEFAULT_PARTS[profile] if parts is None else tuple(parts)
    if "latency" in chosen:
        execute_notebook("latency", out / "latency.ipynb", {
            **EXTRAS[profile]["latency"], "profile": profile,
            "pipelines": pipelines or EXTRAS[profile]["latency"].get("pipelines", ""),
            "series_id": ids["latency"], "report_dir": str(out),
            **CAPACITY[profile], "steps_series_id": ids["capacity"],
        }, settings=settings, echo=echo)
    if "broker_native" in chosen:
        execute_notebook("broker_native", out / "broker_native.ipynb", {
            **EXTRAS[profile]["broker_native"], "series_id": ids["broker_native"], "report_dir": str(out),
        }, settings=settings, echo=echo)
    if "control" in chosen:
        control = EXTRAS[profile]["control"] | ({"pipelines": pipelines} if pipelines else {})
        execute_notebook("control", out / "control.ipynb", {
            **control, "series_id": ids["control"], "report_dir": str(out),
        }, settings=settings, echo=echo)
    if "faults" in chosen:
        execute_notebook("faults", out / "faults.ipynb", {
            **EXTRAS[profile]["faults"], "pipelines": pipelines, "series_id": ids["faults"], "report_dir": str(out),
        }, settings=settings, echo=echo)
    # the sitting's record (data/sittings), before the analysis, whose first screen reads the ledger
    try:
        record: dict[str, Any] | None = sitting.from_store(
            series_id, profile=profile, sitting_id=report_id, settings=settings,
            capacity_series_id=ids["capacity"] if "latency" in chosen else "", wall_min=(time.monotonic() - t0) / 60)
    except ValueError as exc:  # a series that stored no run: the page says so, there is nothing to record
        log.warning("no sitting record: %s", exc)
        record = None
    sitting_id, wall_before = report_id, 0.0
    if record is not None:
        # a report that resumes its series is the same sitting: its record keeps the id it was first
        # written under (the analysis's first screen reads that one) and the minutes spent before
        known = known_sitting(record, settings=settings)
        if known is not None and known.get("id") != report_id:
            sitting_id, wall_before = str(known["id"]), float(known.get("wall_min") or 0.0)
        record = {**record, "id": sitting_id, "wall_min": round(wall_before + (record.get("wall_min") or 0.0), 1)}
        write_sitting(record, settings=settings)
    # the analysis last, though first on the page: its ranking reads the staircases and the fault matrix
    execute_notebook("analysis", out / "analysis.ipynb", {
        "series_id": series_id, "report_dir": str(out), "sitting": sitting_id, **RANKING[profile],
        **({"n_boot": N_BOOT[profile]} if profile in N_BOOT else {}),
        "capacity_series_id": ids["capacity"], "faults_series_id": ids["faults"],
    }, settings=settings, echo=echo)
    pages = [p for p in REPORT_PAGE if p == "analysis" or p in chosen]
    if settings.topology == "ha":  # the same study under single, stored beside it
        execute_notebook("topology", out / "topology.ipynb", {
            "ha_series_id": series_id, "single_series_id": single_series_id, "report_dir": str(out),
            "ha_latency_series_id": ids["latency"],
            "single_latency_series_id": report_series(single_series_id, profile)["latency"] if single_series_id else "",
        }, settings=settings, echo=echo)
        pages.append("topology")
    page = combine([out / f"{n}.ipynb" for n in pages], out / "report.ipynb")
    export_html(page, out / "report.html", title=f"fanout-lab report {report_id} (series {series_id})",
                description=QUESTION, image=SCREENSHOT)  # the screenshot `lab report` takes of the page
    if record is not None:
        write_sitting({**record, "wall_min": round(wall_before + (time.monotonic() - t0) / 60, 1)}, settings=settings)
    return out


# Outputs of the analysis notebook --------------------------------------------------------------

def save_figure(fig: Any, out_dir: str | Path, name: str) -> Picture:
    """``<name>.png`` and ``<name>.svg`` in ``out_dir`` (nothing when ``out_dir`` is empty); returns
    the figure as the page shows it (an image with its alternative text: a cell's last line)."""
    if out_dir:
        for ext in ("png", "svg"):
            fig.savefig(Path(out_dir) / f"{name}.{ext}", bbox_inches="tight", dpi=150)
    return Picture(fig)


def save_table(df: pd.DataFrame, out_dir: str | Path, name: str, *, index: bool = False) -> None:
    """``<name>.csv`` in ``out_dir`` (nothing when ``out_dir`` is empty)."""
    if out_dir:
        df.to_csv(Path(out_dir) / f"{name}.csv", index=index)


# per-run measurements of the host (load, steal): in the per-run table, not in the stand's
PER_RUN_HOST = frozenset({"span_s", "busy_cpu_s", "idle_cpu_s", "iowait_cpu_s", "steal_cpu_s", "steal_pct",
                          "busy_pct", "loadavg_start", "loadavg_end"})


def stand_table(runs: pd.DataFrame, *, settings: Settings | None = None) -> pd.DataFrame:
    """Where and with what ``runs`` were measured: host, CPUs, platform, Python, the version of
    every component and client library, the CPU method, lab version, git SHA and whether the tree
    had uncommitted changes (distinct values joined when runs differ)."""
    from lab.results import read_run

    seen: dict[str, list[str]] = {}
    for run_id in runs["run_id"]:
        run = read_run(run_id, settings=settings)
        fields = {**{f"host.{k}": v for k, v in (run.get("host") or {}).items() if k not in PER_RUN_HOST},
                  **{f"version.{k}": v for k, v in (run.get("versions") or {}).items()},
                  **{f"client.{k}": v for k, v in (run.get("clients") or {}).items()},
                  "CPU measured by": run.get("cpu_method"), "lab_version": run.get("lab_version"),
                  "git_sha": run.get("git_sha"), "uncommitted changes": run.get("git_dirty")}
        for key, value in fields.items():
            values = seen.setdefault(key, [])
            if str(value) not in values:
                values.append(str(value))
    return pd.DataFrame({"value": {k: ", ".join(v) for k, v in seen.items()}}).rename_axis("field")


# One run as tables ------------------------------------------------------------------------------

def run_table(result: dict[str, Any]) -> pd.DataFrame:
    """One run as a column (by field): cell, success, window, ms CPU/msg, msg/s, counters."""
    s, c = result["scenario"], result.get("counters", {})
    window = result.get("window_s")
    row = {
        "run_id": result["run_id"], "pipeline": s["pipeline"], "consumers": s["consumers"],
        "messages": s["messages"], "success": result["success"], "error": result.get("error"),
        "window_s": window, "cpu_ms_per_msg": result.get("cpu_ms_per_msg"),
        "msg_per_s": round(s["messages"] / window, 1) if window else None,
        **{k: c.get(k) for k in ("sent", "send_failed", "processed", "skipped", "work_calls",
                                 "work_distinct", "distinct_ids", "claims_min", "claims_max",
                                 "db_ops")},
    }
    return pd.DataFrame([row]).set_index("run_id").T


def participant_table(result: dict[str, Any]) -> pd.DataFrame:
    """CPU-seconds, ms CPU/msg, share of the total and mean RSS per participant of one run.

    ``unattributed`` (host CPU not in any participant) is shown but not in the total.
    """
    m = result["scenario"]["messages"]
    cpu = result.get("cpu_s") or {}
    mem = result.get("mem_mb") or {}
    total = sum(v for k, v in cpu.items() if k != "unattributed")
    rows = [
        {"participant": name, "cpu_s": v, "ms_per_msg": round(v * 1000 / m, 4),
         "share_pct": round(100 * v / total, 1) if total and name != "unattributed" else None,
         "rss_mb": mem.get(name)}
        for name, v in sorted(cpu.items(), key=lambda kv: (kv[0] == "unattributed", -kv[1]))
    ]
    rows.append({"participant": "total", "cpu_s": round(total, 3),
                 "ms_per_msg": round(total * 1000 / m, 4), "share_pct": 100.0, "rss_mb": None})
    return pd.DataFrame(rows).set_index("participant")


def consumer_table(result: dict[str, Any]) -> pd.DataFrame:
    """Each consumer process of one run: processed, skipped, claims, CPU, RSS."""
    cols = ["index", "processed", "skipped", "failures", "db_ops", "cpu_s", "rss_mb_mean", "error"]
    rows = [{k: c.get(k) for k in cols} for c in result.get("consumers", [])]
    return pd.DataFrame(rows, columns=cols).set_index("index")


# Bytes and money (lab.measure.diskio, lab.measure.walstats, lab.measure.network, lab.study.money) ----

def bytes_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pipeline and N (median over the runs that have the figure): WAL bytes per message (LSN
    distance), disk bytes written per message per participant and in total, and, under
    ``LAB_HOSTS=netns``, bytes per message on every hop between hosts. Columns absent from every
    run are left out; an empty frame when no run has any of them."""
    cols = [c for c in runs.columns if c == "wal_bytes_per_msg" or c.startswith("disk_write_bytes_per_msg")
            or c.startswith("net_bytes_per_msg_")]
    if runs.empty or not cols:
        return pd.DataFrame()
    present = [c for c in cols if runs[c].notna().any()]
    if not present:
        return pd.DataFrame()
    table = (runs.groupby(["pipeline", "consumers"])[present].median().round(1)
             .dropna(how="all").reset_index())
    names = {"wal_bytes_per_msg": "WAL", "disk_write_bytes_per_msg": "disk, total"}
    for c in present:
        if c.startswith("disk_write_bytes_per_msg_"):
            names[c] = f"disk, {c.removeprefix('disk_write_bytes_per_msg_')}"
        elif c.startswith("net_bytes_per_msg_"):
            a, _, b = c.removeprefix("net_bytes_per_msg_").partition("_")
            names[c] = f"net, {a} → {b}"
    return table.rename(columns=names)


def money_table(runs: pd.DataFrame, prices: Any = None, zones: Any = None) -> pd.DataFrame:
    """Per pipeline and N the median USD per million messages (:func:`lab.study.money.price_table`):
    CPU, cross-zone transfer (where the network was measured), disk writes and their total."""
    from lab.study import money

    if runs.empty or "cpu_ms_per_msg" not in runs:
        return pd.DataFrame()
    ok = runs.dropna(subset=["cpu_ms_per_msg"])
    if ok.empty:
        return pd.DataFrame()
    prices = prices if prices is not None else money.Prices()
    table = money.price_table(ok, prices, zones if zones is not None else money.ZONES)
    both = pd.concat([ok[["pipeline", "consumers"]], table], axis=1)
    out = both.groupby(["pipeline", "consumers"]).median(numeric_only=True).reset_index()
    return out.rename(columns=lambda c: c.replace("usd_per_million.", "USD/M msg, ") if "." in c else c)


BYTES_TEXT = """## Bytes per message and the cost in money

**Bytes.** Per pipeline and N (median over runs): the WAL PostgreSQL generated per message (the LSN
distance over the window, `lab.measure.walstats`), the bytes each participant wrote to the storage
layer per message (`lab.measure.diskio`: cgroup `io.stat` where the io controller is offered, else
`/proc/<pid>/io`; PostgreSQL's data pages are written at the next checkpoint, outside the window) and,
for runs under `LAB_HOSTS=netns`, the bytes per message on every hop between hosts."""

MONEY_TEXT = """**Money.** Each run's price per million messages at public list prices (`lab.study.money`, defaults
cited in `docs/method.md`): its CPU-seconds at an on-demand vCPU price, the bytes of every hop that
leaves its availability zone (default placement: PostgreSQL, Debezium and the web service in one zone,
the broker and the consumers in another) at the inter-zone transfer price, and its disk writes
(general-purpose block storage: no charge per write by default). Then N\\* in money beside N\\* in
CPU, with and without the transfer, under three placements: where cross-zone traffic moves the
crossover. Without network bytes (runs on loopback) the transfer is not priced and N\\* in money is
N\\* in CPU."""


def bytes_and_money(measured: pd.DataFrame, out_dir: str | Path = "", *, n_boot: int = 200,
                    seed: int = 0) -> list[Any]:
    """The report's bytes and money section, in order: text (str, Markdown) and tables; the tables
    are also saved (``bytes.csv``, ``money.csv``, ``crossover_money.csv``)."""
    from lab.study import crossover, money

    parts: list[Any] = [BYTES_TEXT]
    table = bytes_table(measured)
    save_table(table, out_dir, "bytes")
    parts.append(table.set_index(["pipeline", "consumers"]) if not table.empty
                 else "*No run of this series read its disk and WAL bytes (runs older than the figures).*")
    parts.append(MONEY_TEXT)
    usd = money_table(measured)
    save_table(usd, out_dir, "money")
    if not usd.empty:
        parts.append(usd.set_index(["pipeline", "consumers"]).round(4))
    direct, brokers = crossover.sides(measured["pipeline"]) if not measured.empty else ([], [])
    shifts = []
    for b in brokers:
        for d in direct:
            try:
                shift = money.crossover_shift(measured, d, b, n_boot=n_boot, seed=seed)
                shifts.append(shift.assign(direct=d, broker=b))
            except ValueError as exc:
                parts.append(f"*{d} vs {b}: no crossover ({exc}).*")
    if shifts:
        both = pd.concat(shifts, ignore_index=True)
        save_table(both, out_dir, "crossover_money")
        parts.append(both.set_index(["direct", "broker", "condition"]).round(2))
    return parts
