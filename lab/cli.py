"""``lab``: the command line. Thin: parse, call the library, print, exit.

Errors a user can fix (bad input, a missing prerequisite, a taken port) end in one line on
stderr and exit status 2; nothing is left half-started.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from tqdm import tqdm

from lab.faults import check as check_fault
from lab.pipelines import check as check_pipeline
from lab.results import runs_dir
from lab.scenario import MAX_CONSUMERS, Scenario
from lab.settings import Settings, get_settings, parse_size
from lab.stack import get_stack, hosts, stackdir
from lab.stack.base import DEBEZIUM_SINKS, StackError
from lab.stack.proc import Interrupted, exclusive, raise_interrupted, run_interruptible
from lab.study import presentation

Handler = Callable[[argparse.Namespace, Settings], int]


def _stack_provision(args: argparse.Namespace, settings: Settings) -> int:
    t0 = time.monotonic()
    stack = get_stack(settings)
    stack.provision()
    _say(f"provisioned in {time.monotonic() - t0:.1f} s")
    _say_skipped(stack)
    return 0


def _say_skipped(stack: object) -> None:
    """One line naming what was left out and why (native backend: RabbitMQ without root)."""
    skipped = getattr(stack, "skipped", None) or {}
    if skipped:
        _say("not started: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()))


def _stack_up(args: argparse.Namespace, settings: Settings) -> int:
    t0 = time.monotonic()
    stack = get_stack(settings)
    stack.up()
    _say(f"stack up in {time.monotonic() - t0:.1f} s")
    _say_skipped(stack)
    sys.stdout.write(presentation.status_text(stack.status(), as_json=False))
    return 0


def _stack_down(args: argparse.Namespace, settings: Settings) -> int:
    from lab.measure.cgroups import remove_scope

    get_stack(settings).down(purge=args.purge)  # a killed run's processes too, by pid
    remove_scope(settings)  # the run's participant groups, empty once everything is stopped
    _say("stack down" + (" (state purged)" if args.purge else ""))
    return 0


def _stack_status(args: argparse.Namespace, settings: Settings) -> int:
    sys.stdout.write(presentation.status_text(get_stack(settings).status(), as_json=args.json))
    return 0


def _stack_env(args: argparse.Namespace, settings: Settings) -> int:
    for name, value in settings.connect_env().items():
        sys.stdout.write(f"export {name}={shlex.quote(value)}\n")
    return 0


def _debezium(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "start":  # a stop stops the process by pid whether the layout is there or not
        hosts.require_routed(settings)
    stack = get_stack(settings)
    t0 = time.monotonic()
    if args.action == "start":
        stack.start_debezium(args.sink)
        _say(f"debezium-{args.sink} streaming after {time.monotonic() - t0:.1f} s")
    else:
        stack.stop_debezium(args.sink)
        _say(f"debezium-{args.sink} stopped")
    return 0


def _stack_images(args: argparse.Namespace, settings: Settings) -> int:
    from lab.stack.images import build_images

    t0 = time.monotonic()
    built = build_images(settings, say=_say)
    for tag, image_id in built.items():
        sys.stdout.write(f"{tag}\t{image_id}\n")
    _say(f"local images ready in {time.monotonic() - t0:.1f} s (use them: LAB_COMPOSE_IMAGES=local)")
    return 0


def _stack_engine(args: argparse.Namespace, settings: Settings) -> int:
    from lab.stack import remote_engine

    if args.action == "up":
        t0 = time.monotonic()
        engine = remote_engine.up(settings, say=_say)
        _say(f"engine up in {time.monotonic() - t0:.1f} s; point the compose backend at it:")
        sys.stdout.write(f"export LAB_DOCKER_HOST={engine.url}\n")
    elif args.action == "down":
        gone = remote_engine.down(settings, purge=args.purge_data)
        _say("engine down" + (f": {', '.join(gone)}" if gone else " (nothing was running)"))
    else:
        info = remote_engine.status(settings)
        sys.stdout.write(json.dumps(info) + "\n" if args.json else remote_engine.status_text(info))
    return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:

    from lab.runner import run_scenario

    fields = {f: getattr(args, f) for f in Scenario.field_names() if getattr(args, f, None) is not None}
    if args.rate_steps and args.messages is not None:
        raise ValueError("--rate-steps sets the message count itself (rate x --step-s per step): drop --messages")
    scenario = Scenario(**fields)  # validates: one clear line on bad input
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
    _say(f"series {sid}: {len(plan)} runs ({series.PROFILES[args.profile].description})")
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
    _say(f"series {sid}: {len(results) - last['skipped']} run, {last['skipped']} skipped "
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
    _say(f"report on series {sid} (profile {args.profile}); the notebooks' output follows")
    out = build_report(args.profile, settings, series_id=sid, repeats=args.repeats, seed=args.seed,
                       pipelines=",".join(pipelines or []), force=args.force, idle_s=args.idle_s,
                       single_series_id=single if settings.topology == "ha" else "", echo=sys.stderr,
                       parts=parts)
    sys.stdout.write(f"{out / 'report.html'}\n")
    _say(f"report written to {out} (report.html, executed notebooks, figures as PNG/SVG, CSV)")
    failed = [f"{name}: {cell}" for name, rid in report_series(sid, args.profile).items()
              if name != "faults"  # a fault cell's failed run is a finding (the report shows it), not a gap
              and (name in ("series", "latency", "capacity") or name in parts)
              for cell in series.failed_cells(rid, settings)]
    if failed:
        _say(f"{len(failed)} cell(s) of series {sid} have no successful run ({'; '.join(failed)}); "
             "the report lists their errors and leaves them out. Run the same command again to retry them.")
        return 1
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
    _say(f"sitting {sid}: {record['counts']['measured']} measured runs, {record['counts']['failed']} failed; "
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
            _say(f"{p.relative_to(settings.root)} disagrees with the ledger: run `lab results`")
        return 1 if stale else 0
    for p in stale:
        p.write_text(new[p], encoding="utf-8")
    _say(f"{len(records)} sittings; " + (f"rewrote {', '.join(str(p.relative_to(settings.root)) for p in stale)}"
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
    _say(f"fault matrix {sid}: {len(plan)} runs ({fault_matrix.PROFILES[args.profile].description})")
    for pipeline, kind, why in fault_matrix.inapplicable(args.profile, pipelines=pipelines):
        _say(f"  not applicable: {pipeline} {kind} ({why})")
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
    _say(f"fault matrix {sid}: {len(results)} cells, {failed} failed (a failed run is a finding: its error "
         f"is in the table's run), {len(unrun)} could not run{': ' + '; '.join(unrun) if unrun else ''}; "
         f"results in {runs_dir(settings)}")
    return 1 if unrun else 0


def _bench_stack(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.bench import bench_stack

    out = bench_stack(settings, idle_s=args.idle_s, say=_say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_run(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.bench import bench_run

    fields = {f: getattr(args, f) for f in Scenario.field_names() if getattr(args, f, None) is not None}
    out = bench_run(Scenario(**fields), settings, repeats=args.repeats, say=_say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_options(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.options import bench_options, parse_vary

    fields = {f: getattr(args, f) for f in Scenario.field_names() if getattr(args, f, None) is not None}
    field, values = parse_vary(args.vary)  # one clear line on a bad spec
    out = bench_options(Scenario(**fields), field, values, settings, repeats=args.repeats, say=_say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_crossing(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.ladder import climb

    fields = {f: getattr(args, f) for f in Scenario.field_names() if getattr(args, f, None) is not None}
    try:
        ladder = [int(n) for n in args.ladder.split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"lab: --ladder wants reader counts like 16,24,32, got {args.ladder!r}") from None
    out = climb(Scenario(**fields), args.direct, args.broker, settings, ladder=ladder, repeats=args.repeats,
                steady=args.steady, say=_say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_harness(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.harness import bench_harness

    arms = [a for a in args.arms.split(",") if a]
    out = bench_harness(settings, messages=args.messages, senders=args.senders, repeats=args.repeats,
                        arms=arms, say=_say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line ends in one line on stderr (no usage block), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def number(kind: type[int] | type[float], low: float, high: float, *, low_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type``: a finite ``kind`` in [low, high] (``(low, high]`` with ``low_open``),
    refused in one line otherwise (nan, inf, 1e308, a port above 65535, a negative duration)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            lo = f"above {low:g}" if low_open else f"at least {low:g}"
            raise argparse.ArgumentTypeError(f"{text!r} must be a finite number {lo} and at most {high:g}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


DAY_S = 86_400.0
COUNT = number(int, 1, 10**9)  # repeats, messages, senders
SEED = number(int, 0, 2**31 - 1)
DURATION = number(float, 0, 7 * DAY_S)  # seconds, finite
RATE = number(float, 0, 10**7)  # msg/s


def rate_steps(text: str) -> str:
    """``--rate-steps``: comma-separated rates, each within :data:`RATE`'s range (1e308 msg/s
    would make a step's message count infinite)."""
    for part in text.split(","):
        if part.strip():
            RATE(part.strip())
    return text


def consumer_counts(text: str) -> tuple[int, ...]:
    """``--consumers 1,4``: distinct N within the scenario's bounds, in the order given."""
    parse = number(int, 1, MAX_CONSUMERS)
    out = tuple(dict.fromkeys(parse(part.strip()) for part in text.split(",") if part.strip()))
    if not out:
        raise argparse.ArgumentTypeError(f"no consumer count in {text!r}: give N, e.g. 1,4")
    return out


def link_delay(text: str) -> float:
    """``--link-delay``: milliseconds from ``1ms``, ``250us`` or a number of ms, in one line otherwise."""
    from lab.settings import parse_delay

    try:
        return parse_delay(text, "--link-delay")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: bounds of every numeric Scenario field on the command line (Scenario checks the finer rules)
SCENARIO_NUMBERS: dict[str, Callable[[str], Any]] = {
    "consumers": number(int, 1, MAX_CONSUMERS), "messages": number(int, 1, 10**9), "senders": number(int, 1, 100_000),
    "rate": RATE, "batch_size": number(int, 1, 10**6), "poll_wait_ms": number(int, 0, 3_600_000),
    "flush_wait_ms": number(int, 0, 3_600_000), "work_delay_ms": number(float, 0, 3_600_000),
    "ready_timeout_s": number(float, 0, DAY_S, low_open=True),
    "drain_timeout_s": number(float, 0, 7 * DAY_S, low_open=True),
    "cooldown_s": number(float, 0, DAY_S), "seed": SEED, "step_s": number(float, 1, 3600),
    "rate_steps": rate_steps,
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="lab", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="the native stack: PostgreSQL, Kafka, RabbitMQ, Debezium")
    ssub = stack.add_subparsers(dest="stack_command", required=True)
    ssub.add_parser("provision", help="fetch and cache every artifact (idempotent)").set_defaults(
        handler=_stack_provision, locks=True
    )
    up = ssub.add_parser("up", help="start PostgreSQL, Kafka and RabbitMQ (idempotent)")
    _topology_option(up)
    _hosts_option(up)
    up.set_defaults(handler=_stack_up, locks=True)
    down = ssub.add_parser("down", help="stop everything the lab started (the nodes of either topology)")
    down.add_argument("--purge", action="store_true",
                      help="also delete the stack dir (only one carrying the lab's marker; stacks nested "
                           "in it stopped first)")
    _topology_option(down)
    down.set_defaults(handler=_stack_down, locks=True)
    status = ssub.add_parser("status", help="state, pids, endpoints, versions, RSS, idle slots")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _topology_option(status)
    _hosts_option(status)
    status.set_defaults(handler=_stack_status)
    ssub.add_parser(
        "env", help="shell exports to connect (PG* with PGPASSFILE, Kafka, AMQP); no secret printed"
    ).set_defaults(handler=_stack_env)
    dbz = ssub.add_parser("debezium", help="start or stop one Debezium Server instance")
    dbz.add_argument("action", choices=["start", "stop"])
    dbz.add_argument("sink", help=f"one of: {', '.join(DEBEZIUM_SINKS)}")
    dbz.set_defaults(handler=_debezium, locks=True)
    images = ssub.add_parser("images", help="the compose backend's local images (no registry needed)")
    images.add_argument("action", choices=["build"], help="build: debootstrap + the four service images (cached)")
    images.set_defaults(handler=_stack_images)
    engine = ssub.add_parser("engine", help="the stack's own Docker engine on a host of its own (root): "
                             "LAB_DOCKER_HOST for the compose backend")
    esub = engine.add_subparsers(dest="action", required=True)
    esub.add_parser("up", help="start it (idempotent) and copy the local images in when missing").set_defaults(
        handler=_stack_engine, locks=True)
    edown = esub.add_parser("down", help="stop it and remove its host, also after a crash")
    edown.add_argument("--purge", dest="purge_data", action="store_true",  # not `purge`: the stack dir's
                       help="also delete its data root (images, volumes)")
    edown.set_defaults(handler=_stack_engine, locks=True)
    estatus = esub.add_parser("status", help="running or not, address, pids, images, containers")
    estatus.add_argument("--json", action="store_true", help="machine-readable output")
    estatus.set_defaults(handler=_stack_engine)
    run = sub.add_parser("run", help="one measured run of a pipeline")
    _scenario_options(run)
    _topology_option(run)
    _hosts_option(run)
    run.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    run.add_argument("--max-retained-wal", default=None, metavar="SIZE",
                     help="the run (and its fault) ends, failed, before any slot retains this much WAL "
                          "(e.g. 512MB; default LAB_MAX_RETAINED_WAL or 2GB; free disk: LAB_MIN_FREE_DISK)")
    run.set_defaults(handler=_run, locks=True, needs_layout=True)

    ser = sub.add_parser("series", help="the study's runs: warm-up, pipelines x N, drift probe (resumable)")
    _series_options(ser, rate=True)
    _topology_option(ser)
    ser.set_defaults(handler=_series, locks=True, needs_layout=True)
    rep = sub.add_parser("report", help="run (or resume) the series and write the HTML report")
    _series_options(rep)
    _topology_option(rep)
    rep.add_argument("--with", dest="with_parts", default="", metavar="PARTS",
                     help="add report parts the profile leaves out, comma-separated: faults, control "
                          "(quick runs latency and broker-native; smoke, full and reference run all four)")
    rep.set_defaults(handler=_report, locks=True, needs_layout=True)

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
    _faults_options(flt)
    flt.set_defaults(handler=_faults, locks=True, needs_layout=True)

    bench = sub.add_parser("bench", help="benchmarks of the workbench itself (figures in docs/history)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    bstack = bsub.add_parser("stack", help="warm start, idle CPU and RSS per service, Debezium start time")
    bstack.add_argument("--idle-s", type=DURATION, default=30.0, help="idle measurement (default 30 s)")
    _topology_option(bstack)
    bstack.set_defaults(handler=_bench_stack, locks=True)
    brun = bsub.add_parser("run", help="repeat one scenario: median ms CPU/msg per participant")
    _scenario_options(brun)
    brun.add_argument("--repeats", type=COUNT, default=3)
    brun.set_defaults(handler=_bench_run, locks=True, needs_layout=True)
    bopt = bsub.add_parser("options", help="one Scenario option's values side by side, runs alternating")
    _scenario_options(bopt)
    bopt.add_argument("--vary", required=True, metavar="FIELD=V1,V2",
                      help="e.g. reset=discard,none or consumer_layout=processes,tasks (first = baseline)")
    bopt.add_argument("--repeats", type=COUNT, default=3, help="rounds (default 3)")
    bopt.set_defaults(handler=_bench_options, locks=True, needs_layout=True)
    bcross = bsub.add_parser("crossing", help="measure the crossover: direct and broker pipelines side by side "
                                              "up a ladder of N until the direct readers cost more")
    _scenario_options(bcross)
    bcross.add_argument("--direct", default="wal", help="the direct pipeline (default wal)")
    bcross.add_argument("--broker", default="kafka", help="the broker pipeline (default kafka)")
    bcross.add_argument("--ladder", default="16,24,32,48,60", help="reader counts to climb (default 16,24,32,48,60)")
    bcross.add_argument("--steady", action="store_true",
                        help="judge on each run's steady cost (its cost split) instead of the whole window at M")
    bcross.add_argument("--repeats", type=COUNT, default=2, help="runs of each pipeline at each N (default 2)")
    bcross.set_defaults(handler=_bench_crossing, locks=True, needs_layout=True)
    bh = bsub.add_parser("harness", help="web + senders ms/msg: the lab's against a naive aiohttp/psycopg-pool one")
    bh.add_argument("--messages", type=COUNT, default=20_000)
    bh.add_argument("--senders", type=number(int, 1, 100_000), default=200)
    bh.add_argument("--repeats", type=COUNT, default=3, help="rounds (default 3)")
    bh.add_argument("--arms", default="naive,real_inserts,real_run",
                    help="comma-separated, naive always runs; also real_inserts_aiohttp_client, "
                         "real_inserts_aiohttp_server")
    bh.set_defaults(handler=_bench_harness, locks=True, needs_layout=True)
    return parser


def _topology_option(parser: argparse.ArgumentParser) -> None:
    from lab.settings import TOPOLOGIES

    parser.add_argument("--topology", choices=TOPOLOGIES, default=None,
                        help="single: one node per service; ha: three Kafka KRaft nodes, three clustered "
                             "RabbitMQ nodes and a PostgreSQL standby with failover slots (native backend; "
                             "default: LAB_TOPOLOGY, else single)")


def _hosts_option(parser: argparse.ArgumentParser) -> None:
    from lab.settings import HOST_LAYOUTS

    parser.add_argument("--hosts", choices=HOST_LAYOUTS, default=None,
                        help="loopback: every participant on 127.0.0.1; netns: each participant group on a "
                             "host of its own, a network namespace on a private bridge (root; the native "
                             "backend; default: LAB_HOSTS, else loopback)")
    parser.add_argument("--link-delay", type=link_delay, default=None, metavar="DELAY",
                        help="with --hosts netns: delay every host's outgoing packets this long (netem, or a "
                             "userspace delayer where the kernel has no netem: LAB_LINK_DELAY_VIA), e.g. 1ms or "
                             "250us; 0 removes it (default: LAB_LINK_DELAY, else 0)")


def _series_options(parser: argparse.ArgumentParser, *, rate: bool = False) -> None:
    from lab.study.series import PROFILES

    if rate:  # `lab series` only: the report's notebooks run closed-loop series
        parser.add_argument("--rate", type=RATE, default=0.0,
                            help="open-loop msg/s for every measured cell (latency mode); default 0 = closed loop")
        parser.add_argument("--consumers", type=consumer_counts, default=None, metavar="N,N",
                            help="a subset of N, comma-separated (default: the profile's); the volume arm "
                                 "keeps its N among them")

    parser.add_argument("--profile", choices=list(PROFILES), default="quick",
                        help="; ".join(f"{p.name}: {p.description}" for p in PROFILES.values()))
    parser.add_argument("--repeats", type=COUNT, default=None, help="runs per cell (default: the profile's)")
    parser.add_argument("--seed", type=SEED, default=None,
                        help="shuffle the cells with this seed (recorded in every run); default: the profile's "
                             "(reference order, or seed 1 when a cell has more than one repeat)")
    parser.add_argument("--idle-s", type=DURATION, default=None,
                        help="idle baseline before the series, seconds (default: the profile's; 0: none)")
    parser.add_argument("--pipelines", default="", help="comma-separated subset (default: every registered one)")
    parser.add_argument("--series-id", default="",
                        help="runs are stored under it and skipped when done (default: from profile, repeats, seed)")
    parser.add_argument("--force", action="store_true",
                        help="run every cell again, adding to the series (a fresh study: a new --series-id)")


def _faults_options(parser: argparse.ArgumentParser) -> None:
    from lab.study.fault_matrix import PROFILES

    parser.add_argument("--profile", choices=list(PROFILES), default="quick",
                        help="; ".join(f"{p.name}: {p.description}" for p in PROFILES.values()))
    parser.add_argument("--pipelines", default="", help="comma-separated subset (default: the profile's)")
    parser.add_argument("--series-id", default="",
                        help="runs are stored under it; a cell with a stored run is skipped "
                             "(default: faults-<profile>)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="run the cells whose stored run failed again (a failed run is otherwise a finding, kept)")
    parser.add_argument("--force", action="store_true", help="run every cell again, adding to the series")


def _scenario_options(parser: argparse.ArgumentParser) -> None:
    """One option per Scenario field (defaults come from the dataclass)."""
    defaults = Scenario()
    for name in Scenario.field_names():
        default = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true", default=None)
        else:
            kind = SCENARIO_NUMBERS.get(name) or (
                number(type(default), 0, 10**9) if type(default) in (int, float) else type(default))
            parser.add_argument(flag, type=kind, default=None, metavar=type(default).__name__.upper(),
                                help=f"default: {default!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    handler: Handler = args.handler
    signal.signal(signal.SIGTERM, raise_interrupted)  # like SIGINT: cleanups in finally blocks run
    try:
        settings = get_settings()
        if getattr(args, "topology", None):
            settings = settings.replace(topology=args.topology)
        if getattr(args, "hosts", None):
            settings = settings.replace(hosts=args.hosts)
        if getattr(args, "link_delay", None) is not None:
            settings = settings.replace(link_delay_ms=args.link_delay)
        if getattr(args, "needs_layout", False):  # it reaches the services: not at addresses routed nowhere
            hosts.require_routed(settings)
        if not getattr(args, "locks", False):
            return handler(args, settings)
        if getattr(args, "purge", False) and settings.backend == "native":
            # refused before the lock, whose file would otherwise be left in a directory not the lab's
            stackdir.check_purgeable(settings.stack_dir)
        # every command that changes the stack or its data holds the stack's lock throughout:
        # one that would disturb a run (or another such command) is refused, naming it and its pid
        with exclusive(settings.run_lock, "the stack"):
            # the children that run under this command (a report's notebook kernel) share its lock
            return handler(args, settings.replace(lock_owner=os.getpid()))
    except (StackError, ValueError) as exc:
        sys.stderr.write(f"lab: error: {one_line(exc)}\n")
        return 2
    except Interrupted as exc:
        sys.stderr.write(f"lab: {exc}\n")
        return exc.exit_status
    except KeyboardInterrupt:
        sys.stderr.write("lab: interrupted by SIGINT\n")
        return 130
    except Exception as exc:  # anything else still ends in one line (-v: the traceback in the log)
        logging.getLogger("lab.cli").debug("failed", exc_info=True)
        sys.stderr.write(f"lab: error: {type(exc).__name__}: {one_line(exc)}\n")
        return 1


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a psycopg error spans several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "password authentication failed" in text:
        text += (" (the stack's PostgreSQL keeps the password it was initialised with: was LAB_PG_PASSWORD "
                 "changed? unset it, or start afresh with `lab stack down --purge`)")
    return text if len(text) <= 600 else text[:597] + "..."


if __name__ == "__main__":
    sys.exit(main())
