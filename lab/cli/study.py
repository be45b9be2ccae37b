"""``lab run``, ``series``, ``report``, ``site``, ``sitting``, ``results``, ``answer`` and ``faults``:
one run, the study's series, its report and the static site, the ledger of sittings, and the fault
matrix."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lab.cli.options import (
    faults_options,
    hosts_option,
    number,
    one_line,
    say,
    scenario_from,
    scenario_options,
    series_options,
    topology_option,
)
from lab.faults import check as check_fault
from lab.pipelines import check as check_pipeline
from lab.results import runs_dir
from lab.scenario import MAX_CONSUMERS
from lab.settings import Settings, parse_size
from lab.stack.base import StackError
from lab.stack.proc import run_interruptible
from lab.study import presentation


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from lab.runner import run_scenario

    scenario = scenario_from(args)  # validates: one clear line on bad input
    check_pipeline(scenario)  # a registered pipeline that takes this scenario
    check_fault(scenario, settings)  # the fault's own rules and where it applies, before anything starts
    if args.max_retained_wal is not None:
        settings = settings.replace(max_retained_wal=parse_size(args.max_retained_wal, "--max-retained-wal"))
    bar = None if args.json else tqdm(total=scenario.messages, unit="msg", desc="setup", file=sys.stderr)

    def progress(phase: str, info: dict[str, Any]) -> None:
        if bar is None:
            return
        bar.set_description(phase)
        processed = info.get("processed")
        if isinstance(processed, int):
            bar.update(processed - bar.n)

    try:
        result = run_interruptible(run_scenario(scenario, settings, progress=progress))
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        sys.stdout.write(json.dumps(presentation.summary(result), default=str) + "\n")
    else:
        sys.stdout.write(presentation.run_text(result))
    return 0 if result["success"] else 1


def _series(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study import series

    pipelines = series.parse_pipelines(args.pipelines)
    plan = series.plan(args.profile, repeats=args.repeats, seed=args.seed, pipelines=pipelines,
                       rate=args.rate, consumers=args.consumers)
    sid = args.series_id or series.default_series_id(
        args.profile, repeats=args.repeats, seed=args.seed, pipelines=pipelines, rate=args.rate,
        topology=settings.topology, consumers=args.consumers)
    say(f"series {sid}: {len(plan)} runs ({series.PROFILES[args.profile].description})")
    bar = tqdm(total=len(plan), unit="run", desc=sid, file=sys.stderr)
    last: dict[str, Any] = {"ms": "-", "skipped": 0, "failed": 0}

    def progress(step: series.Step) -> None:
        if step.status == "idle":
            bar.set_postfix(cell="idle baseline", refresh=True)
            return
        if step.status in ("start", "phase"):
            bar.set_postfix(cell=f"{step.cell} {step.phase}".strip(), last=last["ms"], refresh=True)
            return
        result = step.result or {}
        if step.status == "skipped":
            last["skipped"] += 1
        elif not result.get("success"):
            last["failed"] += 1
            bar.write(f"{step.cell}: {series.outcome(result)}", file=sys.stderr)
        ms = result.get("cpu_ms_per_msg")
        last["ms"] = f"{ms:.3f} ms/msg" if isinstance(ms, float) and result.get("success") else "failed"
        bar.set_postfix(cell=step.cell, last=last["ms"])
        bar.update(1)

    try:
        idle_s = series.PROFILES[args.profile].idle_s if args.idle_s is None else args.idle_s
        results = run_interruptible(series.run_series(plan, settings, series_id=sid, force=args.force,
                                                progress=progress, idle_s=idle_s))
    finally:
        bar.close()
    sys.stdout.write(presentation.series_text(results))
    say(f"series {sid}: {len(results) - last['skipped']} run, {last['skipped']} skipped "
         f"(done before), {last['failed']} failed; results in {runs_dir(settings)}")
    return 0 if not last["failed"] else 1


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study import series
    from lab.study.report import build_report, report_parts, report_series

    pipelines = series.parse_pipelines(args.pipelines)
    parts = report_parts(args.profile, args.with_parts)
    series.plan(args.profile, repeats=args.repeats, seed=args.seed, pipelines=pipelines)  # validate
    sid = args.series_id or series.default_series_id(
        args.profile, repeats=args.repeats, seed=args.seed, pipelines=pipelines, topology=settings.topology)
    single = series.default_series_id(  # what an ha report compares with
        args.profile, repeats=args.repeats, seed=args.seed, pipelines=pipelines, topology="single")
    say(f"report on series {sid} (profile {args.profile}); the notebooks' output follows")
    out = build_report(args.profile, settings, series_id=sid, repeats=args.repeats, seed=args.seed,
                       pipelines=",".join(pipelines or []), force=args.force, idle_s=args.idle_s,
                       single_series_id=single if settings.topology == "ha" else "", echo=sys.stderr,
                       parts=parts)
    say(f"report written to {out} (report.html, executed notebooks, figures as PNG/SVG, CSV)")
    failed = [f"{name}: {cell}" for name, rid in report_series(sid, args.profile).items()
              if name != "faults"  # a fault cell's failed run is a finding (the report shows it), not a gap
              and (name in ("series", "latency", "capacity") or name in parts)
              for cell in series.failed_cells(rid, settings)]
    if failed:
        say(f"{len(failed)} cell(s) of series {sid} have no successful run ({'; '.join(failed)}); "
             "the report lists their errors and leaves them out. Run the same command again to retry them.")
    _publish(out, settings)
    return 1 if failed else 0


# Publishing: the page checked in a browser, its first screen captured, the site -------------------

def _publish(report: Path, settings: Settings) -> None:
    """After a report: its first screen in headless Chromium (what a reader trips over is said, and
    the screenshot stored beside the page), then the site; the last lines say where each is."""
    from lab.results import site_dir
    from lab.study import browser, site
    from lab.study.report import SCREENSHOT

    page = report / "report.html"
    try:
        view = browser.view(page, screenshot=report / SCREENSHOT)
        for problem in view.problems():
            say(f"report page: {problem}")
        shot = str(view.screenshot)
    except StackError as exc:  # no Chromium here: the report stands without its screenshot
        shot = f"not taken ({one_line(exc)})"
    try:
        where = str(site.build_site(site_dir(settings), settings, report=report, echo=sys.stderr))
    except StackError as exc:  # the report stands; `lab site` writes the site again
        where = f"not written ({one_line(exc)})"
    sys.stdout.write(f"page: {page}\nscreenshot: {shot}\nsite: {where}\n")


def _site(args: argparse.Namespace, settings: Settings) -> int:
    from lab.results import site_dir
    from lab.study import site

    t0 = time.monotonic()
    index = site.build_site(Path(args.out) if args.out else site_dir(settings), settings, base_url=args.base_url)
    say(f"site written in {time.monotonic() - t0:.1f} s (open it from disk, or serve the folder as it is)")
    sys.stdout.write("".join(line + "\n" for line in site.describe(index)))
    return 0


def _sitting(args: argparse.Namespace, settings: Settings) -> int:
    from lab.results import write_sitting
    from lab.study import series, sitting

    profile = args.profile or args.series_id.split("-")[0]
    series.profile(profile)  # one line when it is not a profile's name
    sid = args.id or f"{args.series_id}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    record = sitting.from_store(args.series_id, profile=profile, sitting_id=sid, settings=settings,
                                capacity_series_id=args.capacity or "", wall_min=args.wall_min)
    path = write_sitting(record, settings=settings)
    q = record["quiet"]
    say(f"sitting {sid}: {record['counts']['measured']} measured runs, {record['counts']['failed']} failed; "
         f"steal max {q.get('steal_pct_max')} %, probe unit {q.get('speed_unit_ms')}")
    sys.stdout.write(f"{path}\n")
    return 0


def _results(args: argparse.Namespace, settings: Settings) -> int:
    from lab.results import load_sittings
    from lab.study import published

    records = load_sittings(settings=settings)
    if not records:
        raise ValueError(f"no sitting record in {settings.data_dir / 'sittings'}: run `make report` first")
    docs = settings.root / "docs" / "results.md"
    readme = settings.root / "README.md"
    new = {docs: published.results_markdown(records),
           readme: published.with_readme_block(readme.read_text(encoding="utf-8"), published.readme_block(records))}
    stale = [p for p, text in new.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    if args.check:
        for p in stale:
            say(f"{p.relative_to(settings.root)} disagrees with the ledger: run `lab results`")
        return 1 if stale else 0
    for p in stale:
        p.write_text(new[p], encoding="utf-8")
    say(f"{len(records)} sittings; " + (f"rewrote {', '.join(str(p.relative_to(settings.root)) for p in stale)}"
                                         if stale else "docs/results.md and README.md already agree"))
    return 0


def _answer(args: argparse.Namespace, settings: Settings) -> int:
    from lab.results import load_sittings
    from lab.study import answer

    records = load_sittings(settings=settings)
    sys.stdout.write(answer.text(records, args.consumers, args.messages_per_start, args.rate))
    return 0


def _faults(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study import fault_matrix, series

    pipelines = series.parse_pipelines(args.pipelines)
    plan = fault_matrix.plan(args.profile, pipelines=pipelines)
    sid = args.series_id or fault_matrix.default_series_id(args.profile, pipelines=pipelines)
    say(f"fault matrix {sid}: {len(plan)} runs ({fault_matrix.PROFILES[args.profile].description})")
    for pipeline, kind, why in fault_matrix.inapplicable(args.profile, pipelines=pipelines):
        say(f"  not applicable: {pipeline} {kind} ({why})")
    bar = tqdm(total=len(plan), unit="run", desc=sid, file=sys.stderr)

    def progress(step: series.Step) -> None:
        label = fault_matrix.cell_label(step.scenario)
        if step.status in ("start", "phase"):
            bar.set_postfix(cell=f"{label} {step.phase}".strip(), refresh=True)
            return
        tag = "done before" if step.status == "skipped" else "run"
        bar.write(f"[{step.index + 1}/{step.total}] {label} ({tag}): {fault_matrix.outcome(step.result or {})}",
                  file=sys.stderr)
        bar.update(1)

    try:
        results = run_interruptible(fault_matrix.run_matrix(plan, settings, series_id=sid, force=args.force,
                                                retry_failed=args.retry_failed, progress=progress))
    finally:
        bar.close()
    table = fault_matrix.matrix_table(results)
    sys.stdout.write(presentation.matrix_text(table))
    unrun = [fault_matrix.cell_label(s) for s, r in zip(plan, results, strict=True) if not r.get("run_id")]
    failed = int((~table["success"]).sum())
    say(f"fault matrix {sid}: {len(results)} cells, {failed} failed (a failed run is a finding: its error "
         f"is in the table's run), {len(unrun)} could not run{': ' + '; '.join(unrun) if unrun else ''}; "
         f"results in {runs_dir(settings)}")
    return 1 if unrun else 0


def add(sub: Any) -> None:
    """The study's commands."""
    run = sub.add_parser("run", help="one measured run of a pipeline")
    scenario_options(run)
    topology_option(run)
    hosts_option(run)
    run.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    run.add_argument("--max-retained-wal", default=None, metavar="SIZE",
                     help="the run (and its fault) ends, failed, before any slot retains this much WAL "
                          "(e.g. 512MB; default LAB_MAX_RETAINED_WAL or 2GB; free disk: LAB_MIN_FREE_DISK)")
    run.set_defaults(handler=_run, locks=True, needs_layout=True)

    ser = sub.add_parser("series", help="the study's runs: warm-up, pipelines x N, drift probe (resumable)")
    series_options(ser, rate=True)
    topology_option(ser)
    ser.set_defaults(handler=_series, locks=True, needs_layout=True)
    rep = sub.add_parser("report", help="run (or resume) the series and write the HTML report")
    series_options(rep)
    topology_option(rep)
    rep.add_argument("--with", dest="with_parts", default="", metavar="PARTS",
                     help="add report parts the profile leaves out, comma-separated: faults, control "
                          "(quick runs latency and broker-native; smoke, full and reference run all four)")
    rep.set_defaults(handler=_report, locks=True, needs_layout=True)

    web = sub.add_parser("site", help="the static site: the answer and the index of sittings, every sitting's "
                                      "results, the newest report (no stack, no run)")
    web.add_argument("--out", default="", metavar="DIR", help="the folder to write (default: data/site)")
    web.add_argument("--base-url", default="", metavar="URL",
                     help="where the site will be served, for absolute link-preview images (og:image)")
    web.set_defaults(handler=_site)

    sit = sub.add_parser("sitting", help="write the sitting record (data/sittings) of a stored series")
    sit.add_argument("series_id", help="the series (e.g. quick, reference)")
    sit.add_argument("--profile", help="its profile (default: the id's first word)")
    sit.add_argument("--capacity", metavar="SERIES", help="the load staircases run beside it (their floors)")
    sit.add_argument("--id", help="the record's id (default: the series id and the time)")
    sit.add_argument("--wall-min", type=number(float, 0, 10**6), default=None, metavar="MIN",
                     help="the sitting's wall time in minutes, when known (a report records its own)")
    sit.set_defaults(handler=_sitting)
    res = sub.add_parser("results", help="write docs/results.md and the README's opening from data/sittings")
    res.add_argument("--check", action="store_true", help="only say whether they agree with the ledger (exit 1 if not)")
    res.set_defaults(handler=_results)
    ans = sub.add_parser("answer", help="every pipeline's cost at your N, messages per start and rate, from the ledger")
    ans.add_argument("--consumers", type=number(int, 1, MAX_CONSUMERS), default=4, metavar="N",
                     help="N competing consumers (default: 4)")
    ans.add_argument("--messages-per-start", type=number(float, 1, 1e12), default=100_000.0, metavar="M",
                     help="messages one Debezium start (or set of slots) serves (default: 100000, the reference "
                          "study's)")
    ans.add_argument("--rate", type=number(float, 0, 10**7), default=0.0, metavar="MSG_PER_S",
                     help="a fixed rate in msg/s; 0 (default): closed loop")
    ans.set_defaults(handler=_answer)

    flt = sub.add_parser("faults", help="the insulation matrix: every pipeline x every fault it applies to "
                                       "(fixed rate, resumable)")
    faults_options(flt)
    flt.set_defaults(handler=_faults, locks=True, needs_layout=True)
