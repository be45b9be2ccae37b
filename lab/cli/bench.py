"""``lab bench``: benchmarks of the workbench itself (figures in docs/history)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lab.cli.options import (
    COUNT,
    DURATION,
    consumer_counts,
    number,
    say,
    scenario_from,
    scenario_options,
    table_sizes,
    topology_option,
)
from lab.settings import Settings


def _bench_stack(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.bench import bench_stack

    out = bench_stack(settings, idle_s=args.idle_s, say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_run(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.bench import bench_run

    out = bench_run(scenario_from(args), settings, repeats=args.repeats, say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_options(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.options import bench_options, parse_vary

    field, values = parse_vary(args.vary)  # one clear line on a bad spec
    out = bench_options(scenario_from(args), field, values, settings, repeats=args.repeats, say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_claims(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.claim_model import table_text
    from lab.study.claim_table import bench_claims

    out = bench_claims(settings, sizes=args.sizes, claimers=args.claimers, messages=args.messages,
                       conditions=[c.strip() for c in args.conditions.split(",") if c.strip()], say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n" if args.json else table_text(out))
    return 0


def _bench_crossing(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.ladder import climb

    try:
        ladder = [int(n) for n in args.ladder.split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"lab: --ladder wants reader counts like 16,24,32, got {args.ladder!r}") from None
    out = climb(scenario_from(args), args.direct, args.broker, settings, ladder=ladder, repeats=args.repeats,
                steady=args.steady, say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def _bench_harness(args: argparse.Namespace, settings: Settings) -> int:
    from lab.study.harness import bench_harness

    arms = [a for a in args.arms.split(",") if a]
    out = bench_harness(settings, messages=args.messages, senders=args.senders, repeats=args.repeats,
                        arms=arms, say=say)
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


def add(sub: Any) -> None:
    """The ``bench`` command group."""
    bench = sub.add_parser("bench", help="benchmarks of the workbench itself (figures in docs/history)")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    bstack = bsub.add_parser("stack", help="warm start, idle CPU and RSS per service, Debezium start time")
    bstack.add_argument("--idle-s", type=DURATION, default=30.0, help="idle measurement (default 30 s)")
    topology_option(bstack)
    bstack.set_defaults(handler=_bench_stack, locks=True)
    brun = bsub.add_parser("run", help="repeat one scenario: median ms CPU/msg per participant")
    scenario_options(brun)
    brun.add_argument("--repeats", type=COUNT, default=3)
    brun.set_defaults(handler=_bench_run, locks=True, needs_layout=True)
    bopt = bsub.add_parser("options", help="one Scenario option's values side by side, runs alternating")
    scenario_options(bopt)
    bopt.add_argument("--vary", required=True, metavar="FIELD=V1,V2",
                      help="e.g. reset=discard,none or consumer_layout=processes,tasks (first = baseline)")
    bopt.add_argument("--repeats", type=COUNT, default=3, help="rounds (default 3)")
    bopt.set_defaults(handler=_bench_options, locks=True, needs_layout=True)
    bcl = bsub.add_parser("claims", help="the direct readers' claim: its CPU against the claim table's size "
                                         "(K claims in a copy of inbox_wal, N concurrent claimers)")
    bcl.add_argument("--sizes", type=table_sizes, default=(0, 5_000, 10_000, 20_000, 50_000, 100_000, 500_000),
                     metavar="K,K", help="claims in the table before each cell (default 0,5000,10000,20000,50000,"
                     "100000,500000)")
    bcl.add_argument("--claimers", type=consumer_counts, default=(1, 4, 8, 16), metavar="N,N",
                     help="concurrent claimers, each on its own connection (default 1,4,8,16)")
    bcl.add_argument("--messages", type=COUNT, default=2_000, help="fresh positions each cell claims (default 2000)")
    bcl.add_argument("--conditions", default="reference,vacuumed,analyzed,seqscan-off",
                     help="reference (as a run leaves the table), vacuumed, analyzed, seqscan-off, "
                          "random-page-cost-1.1 (default: the first four)")
    bcl.add_argument("--json", action="store_true", help="print the cells and fits as JSON instead of a table")
    bcl.set_defaults(handler=_bench_claims, locks=True, needs_layout=True)
    bcross = bsub.add_parser("crossing", help="measure the crossover: direct and broker pipelines side by side "
                                              "up a ladder of N until the direct readers cost more")
    scenario_options(bcross)
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
