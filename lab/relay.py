"""The relay of ``wal-relay``: one process that decodes the slot once and hands rows to the consumers.

Run by the runner as a helper of the pipeline (``helpers`` in
:attr:`lab.pipelines.wal_relay.RelayPipeline.capabilities`), measured as the participant ``relay``::

    python -m lab.relay --run-dir DIR --scenario '{...}'

Protocol with the runner, through files in ``--run-dir`` (as a consumer's): ``relay.ready`` once the
slot streams and the hand-over connection is open; SIGTERM stops it after the batch in hand is
handed over; ``relay.json`` is its result (rows, statements, reconnects, error), written also after
an error. It dies with its runner (parent-death signal, :mod:`lab.stack.children`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from lab.pipelines.relay_stream import Relay
from lab.pipelines.wal_relay import HELPER
from lab.scenario import Scenario
from lab.settings import get_settings

log = logging.getLogger("lab.relay")
CLOSE_TIMEOUT_S = 3.0  # closing the stream (a last status) and the hand-over connection


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def _main(args: argparse.Namespace) -> int:
    scenario = Scenario(**json.loads(args.scenario))
    run_dir = Path(args.run_dir)
    relay = Relay(scenario, get_settings())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    error = None
    try:
        await relay.open()
        _atomic_write(run_dir / f"{HELPER}.ready", b"{}")
        while not stop.is_set():
            await relay.step()
    except Exception as exc:
        log.exception("relay failed")
        error = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):
        await asyncio.wait_for(relay.close(), CLOSE_TIMEOUT_S)
    _atomic_write(run_dir / f"{HELPER}.json", json.dumps(relay.result(error)).encode())
    return 0 if error is None else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.relay")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--scenario", required=True, help="the Scenario as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return uvloop.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
