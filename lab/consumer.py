"""Consumers: the loop every pipeline shares, one or several per process.

Run by the runner, laid out as ``Scenario.consumer_layout`` says::

    python -m lab.consumer --pipeline wal --index 0 --run-dir DIR --scenario '{...}'      # processes
    python -m lab.consumer --pipeline wal --index 0,1,2,3 --run-dir DIR --scenario '{...}'  # tasks

``processes``: one OS process per consumer (a fault test can kill one). ``tasks``: the N
consumers are asyncio tasks of one process, as the reference ran its NBomber copies; they share
what the reference shared (one AMQP connection with a channel each for RabbitMQ, through
``shared``) and keep their own transport reads and claim connections. Each task still writes
its own ready and result files, so the runner's protocol is the same for both layouts.

Loop: while nothing is pending, fill a batch (up to ``batch_size``; 100 ms for the first
message, 50 ms to top up) and claim it with one statement; then, strictly one at a time,
``POST /send-email`` for each claimed item and acknowledge its position only after the work.
A non-2xx work call counts as a failure and the item is dropped (no retry, no ack). In a fault
run (``scenario.fault``) the work body also carries ``"by": <index>`` for the runner's
per-consumer accounting (:mod:`lab.runner.accounting`); otherwise the body is unchanged. Under
``consumer-slow`` the targeted consumer sleeps its extra time before each work call while the
runner has it switched on (SIGUSR1 on, SIGUSR2 off).

Protocol with the runner, through files in ``--run-dir``: ``consumer-<i>.ready`` once reads
have started; SIGTERM asks it to stop once nothing is pending; ``consumer-<i>.json`` is the
result, written atomically, also after an error.

Stopping is bounded even when the broker or the database is gone (a client's close may then
wait for a server that never answers): closing the source may take ``CLOSE_TIMEOUT_S``, and
``STOP_GRACE_S`` after SIGTERM the process writes its result and exits whatever it was doing;
a second SIGTERM exits at once. The process also dies with its runner (the runner starts it
with a parent-death signal, :mod:`lab.stack.children`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from lab.pipelines import source_for
from lab.pipelines.base import Item, SharedResources, Source
from lab.scenario import Scenario
from lab.settings import Settings, get_settings

log = logging.getLogger("lab.consumer")
STOP_GRACE_S = 5.0  # SIGTERM -> exit, at the latest
CLOSE_TIMEOUT_S = 3.0  # closing the source (broker and database connections)
WORK_TIMEOUT_S = 30.0  # one work call, from sending it to its answer
WORK_ATTEMPTS = 3  # a work call that timed out is made again, at most this many times in all


class Consumer:
    def __init__(self, scenario: Scenario, settings: Settings, index: int, source: Source) -> None:
        self.scenario = scenario
        self.index = index
        self.source = source
        self.work_url = settings.control_url + "/send-email"
        self.stop = asyncio.Event()
        self.processed = 0
        self.failures = 0
        self.first_work_mono: float | None = None
        self.last_work_mono: float | None = None
        self.last_work_at: float | None = None
        self.slow_s = 0.0  # consumer-slow: extra time per message, switched by SIGUSR1/SIGUSR2
        self.work_retries = 0  # work calls made again after a timeout (see work_again)

    async def run(self, ready: Path) -> None:
        s = self.scenario
        first_wait, flush_wait = s.poll_wait_ms / 1000, s.flush_wait_ms / 1000
        connector = aiohttp.TCPConnector(limit=1, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=WORK_TIMEOUT_S),
            headers={"Content-Type": "application/json"},
            skip_auto_headers=("User-Agent",),
        ) as http:
            await self.source.open()
            _atomic_write(ready, b"{}")
            pending: collections.deque[Item] = collections.deque()
            post, done, url = http.post, self.source.done, self.work_url
            by = self.index if s.fault else None  # fault runs: the web service keeps who called
            while True:
                if not pending:
                    if self.stop.is_set():
                        break
                    batch = await self.source.fill(s.batch_size, first_wait, flush_wait)
                    if not batch:
                        continue
                    pending.extend(await self.source.claim(batch))
                    if not pending:
                        await self.source.idle()
                        continue
                item = pending.popleft()
                if self.slow_s:
                    await asyncio.sleep(self.slow_s)
                if by is None:
                    body = orjson.dumps({"id": item.id, "content": item.content, "createdAt": item.created_at})
                else:
                    body = orjson.dumps({"id": item.id, "content": item.content, "createdAt": item.created_at,
                                         "by": by})
                try:
                    async with post(url, data=body) as resp:
                        ok = 200 <= resp.status < 300
                        await resp.read()
                except TimeoutError:
                    ok = await self.work_again(post, url, body)
                if not ok:
                    self.failures += 1
                else:
                    now = time.monotonic()
                    if self.first_work_mono is None:
                        self.first_work_mono = now
                    self.last_work_mono, self.last_work_at = now, time.time()
                    self.processed += 1
                    done(item)
                if not pending:
                    await self.source.idle()

    async def work_again(self, post: Any, url: str, body: bytes) -> bool:
        """A work call timed out: make it again, up to :data:`WORK_ATTEMPTS` calls in all.

        The usual cause is not a slow web service but this process having been stopped
        (``consumer-dead``, ``sink-outage``: SIGSTOP) across the call's deadline, which the event
        loop finds passed as soon as it runs again, although the answer may already wait in the
        socket. The first call may therefore have landed: calling again is at-least-once, and the
        web service counts the repeat as a duplicate. Raises the last timeout when every call
        timed out."""
        for attempt in range(2, WORK_ATTEMPTS + 1):
            self.work_retries += 1
            log.warning("work call timed out; calling again (%d of %d)", attempt, WORK_ATTEMPTS)
            try:
                async with post(url, data=body) as resp:
                    ok = 200 <= resp.status < 300
                    await resp.read()
                return ok
            except TimeoutError:
                if attempt == WORK_ATTEMPTS:
                    raise
        return False

    def result(self, error: str | None) -> dict[str, Any]:
        return {
            "index": self.index,
            "pid": os.getpid(),
            "processed": self.processed,
            "failures": self.failures,
            "work_retries": self.work_retries,
            "skipped": self.source.skipped,
            "db_ops": self.source.db_ops,
            "decoded_bytes": self.source.decoded_bytes,
            "first_work_mono": self.first_work_mono,
            "last_work_mono": self.last_work_mono,
            "last_work_at": self.last_work_at,
            "error": error,
        }


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


async def _one(consumer: Consumer, run_dir: Path) -> tuple[bool, bool]:
    """Run one consumer to its end and write its result file whatever happens.

    Returns (succeeded, closed): closing the source is bounded by ``CLOSE_TIMEOUT_S``.
    """
    error = None
    try:
        await consumer.run(run_dir / f"consumer-{consumer.index}.ready")
    except Exception as exc:
        log.exception("consumer %d failed", consumer.index)
        error = f"{type(exc).__name__}: {exc}"
    try:
        await asyncio.wait_for(consumer.source.close(), CLOSE_TIMEOUT_S)
        closed = True
    except TimeoutError:  # a worker thread may still wait for the gone broker: do not join it
        log.warning("consumer %d: source did not close within %.0f s", consumer.index, CLOSE_TIMEOUT_S)
        closed = False
    _atomic_write(run_dir / f"consumer-{consumer.index}.json", json.dumps(consumer.result(error)).encode())
    return error is None, closed


async def _main(args: argparse.Namespace) -> int:
    scenario = Scenario(**json.loads(args.scenario))
    settings = get_settings()
    run_dir = Path(args.run_dir)
    indexes = [int(i) for i in str(args.index).split(",")]
    loop = asyncio.get_running_loop()
    shared: SharedResources | None = None
    if len(indexes) > 1:  # tasks: blocking waits (Kafka's) each need a thread of the pool
        loop.set_default_executor(ThreadPoolExecutor(max_workers=len(indexes) + 4))
        shared = SharedResources()
    consumers = [
        Consumer(scenario, settings, i, source_for(scenario, settings, i, run_dir=run_dir, shared=shared))
        for i in indexes
    ]

    def hard_exit(why: str) -> None:  # from the timer thread or a second signal
        for c in consumers:
            with contextlib.suppress(Exception):
                _atomic_write(run_dir / f"consumer-{c.index}.json", json.dumps(c.result(why)).encode())
        logging.shutdown()
        os._exit(1)

    def on_stop() -> None:
        if all(c.stop.is_set() for c in consumers):
            hard_exit("stopped by a second signal")
        for c in consumers:
            c.stop.set()
        timer = threading.Timer(STOP_GRACE_S, hard_exit, [f"no clean stop within {STOP_GRACE_S:.0f} s"])
        timer.daemon = True
        timer.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop)
    fault = None
    if scenario.fault:  # imported only then: a clean run's consumers start without the fault kinds
        from lab.faults import fault_for

        fault = fault_for(scenario)
    extra_s = fault.extra_work_s() if fault is not None else 0.0
    if fault is not None and extra_s:  # the runner switches it on and off
        for c in consumers:
            if c.index == fault.target:
                loop.add_signal_handler(signal.SIGUSR1, setattr, c, "slow_s", extra_s)
                loop.add_signal_handler(signal.SIGUSR2, setattr, c, "slow_s", 0.0)
    try:
        results = await asyncio.gather(*(_one(c, run_dir) for c in consumers))
    finally:
        if shared is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(shared.close(), CLOSE_TIMEOUT_S)
    if not all(closed for _, closed in results):  # a worker thread may still wait for a gone broker
        logging.shutdown()
        os._exit(0 if all(ok for ok, _ in results) else 1)
    return 0 if all(ok for ok, _ in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.consumer")
    parser.add_argument("--pipeline", required=True)
    parser.add_argument("--index", required=True, help="consumer index, or indexes 0,1,... run as tasks")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--scenario", required=True, help="the Scenario as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return uvloop.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
