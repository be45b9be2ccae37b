"""``lab``: the command line. Thin: parse, call the library, print, exit.

Errors a user can fix (bad input, a missing prerequisite, a taken port) end in one line on
stderr and exit status 2; nothing is left half-started. The commands come in groups, each a module
of this package that adds its parsers and handlers: :mod:`~lab.cli.stack` (``lab stack``),
:mod:`~lab.cli.study` (``run``, ``series``, ``report``, ``site``, ``sitting``, ``results``,
``answer``, ``faults``) and :mod:`~lab.cli.bench`; what they share is :mod:`~lab.cli.options`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from lab.cli import bench, stack, study
from lab.cli.options import DURATION, Handler, OneLineParser, consumer_counts, number, one_line, rate_steps
from lab.settings import get_settings
from lab.stack import hosts, stackdir
from lab.stack.base import StackError
from lab.stack.proc import Interrupted, exclusive, raise_interrupted

__all__ = ["DURATION", "build_parser", "consumer_counts", "main", "number", "one_line", "rate_steps"]


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="lab", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (stack, study, bench):
        group.add(sub)
    return parser


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
        logging.getLogger("lab.cli").info("failed", exc_info=True)  # INFO: what -v shows
        sys.stderr.write(f"lab: error: {type(exc).__name__}: {one_line(exc)}\n")
        return 1
