"""``lab stack``: the stack's lifecycle, status, connection settings, one Debezium instance, the
compose backend's local images and its own Docker engine."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any

from lab.cli.options import hosts_option, say, topology_option
from lab.settings import Settings
from lab.stack import get_stack, hosts
from lab.stack.base import DEBEZIUM_SINKS
from lab.study import presentation


def _stack_provision(args: argparse.Namespace, settings: Settings) -> int:
    t0 = time.monotonic()
    stack = get_stack(settings)
    stack.provision()
    say(f"provisioned in {time.monotonic() - t0:.1f} s")
    _say_skipped(stack)
    return 0


def _say_skipped(stack: object) -> None:
    """One line naming what was left out and why (native backend: RabbitMQ without root)."""
    skipped = getattr(stack, "skipped", None) or {}
    if skipped:
        say("not started: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()))


def _stack_up(args: argparse.Namespace, settings: Settings) -> int:
    t0 = time.monotonic()
    stack = get_stack(settings)
    stack.up()
    say(f"stack up in {time.monotonic() - t0:.1f} s")
    _say_skipped(stack)
    sys.stdout.write(presentation.status_text(stack.status(), as_json=False))
    return 0


def _stack_down(args: argparse.Namespace, settings: Settings) -> int:
    from lab.measure.cgroups import remove_scope

    get_stack(settings).down(purge=args.purge)  # a killed run's processes too, by pid
    remove_scope(settings)  # the run's participant groups, empty once everything is stopped
    say("stack down" + (" (state purged)" if args.purge else ""))
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
        say(f"debezium-{args.sink} streaming after {time.monotonic() - t0:.1f} s")
    else:
        stack.stop_debezium(args.sink)
        say(f"debezium-{args.sink} stopped")
    return 0


def _stack_images(args: argparse.Namespace, settings: Settings) -> int:
    from lab.stack.images import build_images

    t0 = time.monotonic()
    built = build_images(settings, say=say)
    for tag, image_id in built.items():
        sys.stdout.write(f"{tag}\t{image_id}\n")
    say(f"local images ready in {time.monotonic() - t0:.1f} s (use them: LAB_COMPOSE_IMAGES=local)")
    return 0


def _stack_engine(args: argparse.Namespace, settings: Settings) -> int:
    from lab.stack import remote_engine

    if args.action == "up":
        t0 = time.monotonic()
        engine = remote_engine.up(settings, say=say)
        say(f"engine up in {time.monotonic() - t0:.1f} s; point the compose backend at it:")
        sys.stdout.write(f"export LAB_DOCKER_HOST={engine.url}\n")
    elif args.action == "down":
        gone = remote_engine.down(settings, purge=args.purge_data)
        say("engine down" + (f": {', '.join(gone)}" if gone else " (nothing was running)"))
    else:
        info = remote_engine.status(settings)
        sys.stdout.write(json.dumps(info) + "\n" if args.json else remote_engine.status_text(info))
    return 0


def add(sub: Any) -> None:
    """The ``stack`` command group."""
    stack = sub.add_parser("stack", help="the native stack: PostgreSQL, Kafka, RabbitMQ, Debezium")
    ssub = stack.add_subparsers(dest="stack_command", required=True)
    ssub.add_parser("provision", help="fetch and cache every artifact (idempotent)").set_defaults(
        handler=_stack_provision, locks=True
    )
    up = ssub.add_parser("up", help="start PostgreSQL, Kafka and RabbitMQ (idempotent)")
    topology_option(up)
    hosts_option(up)
    up.set_defaults(handler=_stack_up, locks=True)
    down = ssub.add_parser("down", help="stop everything the lab started (the nodes of either topology)")
    down.add_argument("--purge", action="store_true",
                      help="also delete the stack dir (only one carrying the lab's marker; stacks nested "
                           "in it stopped first)")
    topology_option(down)
    down.set_defaults(handler=_stack_down, locks=True)
    status = ssub.add_parser("status", help="state, pids, endpoints, versions, RSS, idle slots")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    topology_option(status)
    hosts_option(status)
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
