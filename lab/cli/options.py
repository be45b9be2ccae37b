"""What every command group of ``lab`` shares: a parser that errs in one line, the numbers it takes
(finite, bounded), the options of a scenario, a topology, a host layout, a series and a fault
matrix, and :func:`scenario_from`, the one place a :class:`~lab.scenario.Scenario` is built from a
command line."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from lab.scenario import MAX_CONSUMERS, Scenario
from lab.settings import Settings

Handler = Callable[[argparse.Namespace, Settings], int]


def say(line: str) -> None:
    """One line on stderr (stdout carries what a command prints for use)."""
    sys.stderr.write(line + "\n")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (a psycopg error spans several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "password authentication failed" in text:
        text += (" (the stack's PostgreSQL keeps the password it was initialised with: was LAB_PG_PASSWORD "
                 "changed? unset it, or start afresh with `lab stack down --purge`)")
    return text if len(text) <= 600 else text[:597] + "..."


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


def table_sizes(text: str) -> tuple[int, ...]:
    """``--sizes 0,5000``: distinct row counts (0 to 10,000,000), in the order given."""
    parse = number(int, 0, 10**7)
    out = tuple(dict.fromkeys(parse(part.strip()) for part in text.split(",") if part.strip()))
    if not out:
        raise argparse.ArgumentTypeError(f"no size in {text!r}: give row counts, e.g. 0,100000")
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
    "rate_steps": rate_steps, "warm_s": number(float, 0, 3600),
}


def topology_option(parser: argparse.ArgumentParser) -> None:
    from lab.settings import TOPOLOGIES

    parser.add_argument("--topology", choices=TOPOLOGIES, default=None,
                        help="single: one node per service; ha: three Kafka KRaft nodes, three clustered "
                             "RabbitMQ nodes and a PostgreSQL standby with failover slots (native backend; "
                             "default: LAB_TOPOLOGY, else single)")


def hosts_option(parser: argparse.ArgumentParser) -> None:
    from lab.settings import HOST_LAYOUTS

    parser.add_argument("--hosts", choices=HOST_LAYOUTS, default=None,
                        help="loopback: every participant on 127.0.0.1; netns: each participant group on a "
                             "host of its own, a network namespace on a private bridge (root; the native "
                             "backend; default: LAB_HOSTS, else loopback)")
    parser.add_argument("--link-delay", type=link_delay, default=None, metavar="DELAY",
                        help="with --hosts netns: delay every host's outgoing packets this long (netem, or a "
                             "userspace delayer where the kernel has no netem: LAB_LINK_DELAY_VIA), e.g. 1ms or "
                             "250us; 0 removes it (default: LAB_LINK_DELAY, else 0)")


def series_options(parser: argparse.ArgumentParser, *, rate: bool = False) -> None:
    from lab.study.series import PROFILES

    if rate:  # `lab series` only: the report's notebooks run closed-loop series
        parser.add_argument("--rate", type=RATE, default=0.0,
                            help="open-loop msg/s for every measured cell (latency mode); default 0 = the "
                                 "profile's (closed loop but for steady's 200)")
        parser.add_argument("--consumers", type=consumer_counts, default=None, metavar="N,N",
                            help="a subset of N, comma-separated (default: the profile's); the volume arm "
                                 "keeps its N among them")

    # `lab series` runs every profile; `lab report` those with a report (not steady, a series of its own)
    profiles = [p for p in PROFILES.values() if rate or p.report]
    parser.add_argument("--profile", choices=[p.name for p in profiles], default="quick",
                        help="; ".join(f"{p.name}: {p.description}" for p in profiles))
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


def faults_options(parser: argparse.ArgumentParser) -> None:
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


def scenario_options(parser: argparse.ArgumentParser) -> None:
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


def scenario_from(args: argparse.Namespace) -> Scenario:
    """The scenario of the options :func:`scenario_options` added (the dataclass's defaults where
    none is given); one clear line on bad input."""
    fields = {f: getattr(args, f) for f in Scenario.field_names() if getattr(args, f, None) is not None}
    if fields.get("rate_steps") and "messages" in fields:
        raise ValueError("--rate-steps sets the message count itself (rate x --step-s per step): drop --messages")
    return Scenario(**fields)
