"""One measured run, phase by phase (DESIGN.md §3, method.md §4.0 and §7).

reset → web service → consumers → readiness gates → CDC source → senders (gate) → window →
drain → verify → teardown → ``CHECKPOINT`` + cooldown → result. Every process that does
work is a participant of the CPU metric: the stack's services, ``web``, ``senders``, each
consumer, and this runner process itself (its own CPU only, never its children's).

The run is a failure, stored with its error, when anything in the Success predicate of
method.md §7.1 does not hold: no send failed, sent = processed = distinct claimed ids =
work calls = distinct work ids = messages, and the set of worked (for ``inbox``: claimed) ids equals
the set of ids in ``messages`` (:func:`lab.workload.inbox.id_sets`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psutil
import psycopg
from psycopg import sql

from lab import __version__
from lab.measure import cgroups, probe
from lab.measure.cgroups import attached, choose_cpu_method, tree_pids
from lab.measure.provenance import HostWindow, client_versions, provenance
from lab.measure.idle import idle_rates_for, net_of_idle
from lab.measure.latency import achieved_rate, due_latencies, message_latencies, summarize
from lab.pipelines import PIPELINES
from lab.workload.inbox import id_sets, sets_equal
from lab.pipelines.versions import broker_client_versions
from lab.results import new_run_id, write_run
from lab.measure.sampler import Participant, Sampler, Snapshot
from lab.scenario import Scenario
from lab.settings import Settings, child_env
from lab.pg.slots import drop_slots
from lab.measure.preflight import check_clean
from lab.measure.services import service_participants, stack_record
from lab.stack import children, get_stack
from lab.stack.proc import exclusive, tail, tied

log = logging.getLogger(__name__)
Progress = Callable[[str, dict[str, Any]], None]
DRAIN_POLL_S = 0.1  # how often the runner asks the web service how many messages were worked


class RunError(RuntimeError):
    """A run that could not complete; the message is stored as the run's error."""


class Run:
    """State of one run. Use :func:`run_scenario`."""

    def __init__(self, scenario: Scenario, settings: Settings, stack: Any, progress: Progress,
                 idle: dict[str, Any] | None = None) -> None:
        self.scenario = scenario
        self.idle = idle  # the series' idle baseline (lab.measure.idle), if one was measured
        self.slot_stats: dict[str, dict[str, Any]] = {}
        self.settings = settings
        self.stack = stack
        self.progress = progress
        self.run_id = new_run_id(scenario.pipeline, scenario.consumers)
        self.scratch = settings.stack_dir / "runs" / self.run_id
        self.pipeline = PIPELINES[scenario.pipeline](scenario, settings, stack)
        self.procs: dict[str, psutil.Popen] = {}
        self.consumers: list[psutil.Popen] = []
        self.edges: dict[str, Snapshot] = {}
        self._http: aiohttp.ClientSession | None = None
        self.samples: list[dict[str, Any]] = []
        self.latency_ms: dict[str, Any] | None = None  # lab.measure.latency.summarize of this run
        self.latency_from_due_ms: dict[str, Any] | None = None  # open loop only
        self.home_cgroup = cgroups.current()  # the runner is lent to its group, then moved back
        self.cpu_method = choose_cpu_method(settings.cpu_method)  # lab.measure.provenance
        self.host_window = HostWindow()

    # processes -----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> psutil.Popen:
        return children.spawn(self.settings, name, [sys.executable, *argv], log_path=self.scratch / f"{name}.log",
                              env=child_env(self.settings), cwd=self.settings.root)

    def participants(self) -> list[Participant]:
        """Everything that does work in a run, each in its own cgroup where one can be made.

        The runner counts its own CPU only (its children are other participants).
        """
        def group(name: str, roots: list[psutil.Process], *, tree: bool = True) -> cgroups.CpuGroup | None:
            if self.cpu_method != "cgroup":
                return None
            return attached(self.settings, name, (pid for r in roots for pid in (tree_pids(r.pid) if tree else [r.pid])))

        parts = service_participants(self.stack, ("postgres", "kafka", "rabbitmq", "debezium"), group)
        for name in ("web", "senders", "probe"):  # the speed probe: measured, outside the totals
            parts.append(Participant(name, [self.procs[name]], cgroup=group(name, [self.procs[name]])))
        parts += [
            Participant(f"consumer-{i}", [c], group="consumers", cgroup=group(f"consumer-{i}", [c]))
            for i, c in enumerate(self.consumers)
        ]
        me = psutil.Process()
        parts.append(Participant("runner", [me], recursive=False, cgroup=group("runner", [me], tree=False)))
        return parts

    async def _web(self, path: str, method: str = "GET") -> dict[str, Any]:
        """One call to the web service on a kept-alive connection (the drain loop polls it)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        async with self._http.request(method, self.settings.web_url + path) as r:
            if r.status >= 300:
                raise RunError(f"web service answered {r.status} to {method} {path}")
            return await r.json() if r.status == 200 else {}

    async def _wait_web(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            if self.procs["web"].poll() is not None:
                raise RunError(
                    f"web service exited with {self.procs['web'].returncode}: {tail(self.scratch / 'web.log', 2)}"
                )
            try:
                await self._web("/load/stats")
                return
            except (aiohttp.ClientError, OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RunError("web service did not answer within 30 s") from None
                await asyncio.sleep(0.1)

    # phases --------------------------------------------------------------------------------
    async def reset(self) -> None:
        """Stop both Debezium instances, drop our slots, truncate (identity kept), reset web."""
        for sink in self.stack.debezium:
            self.stack.stop_debezium(sink)
        dsn = self.settings.pg_dsn
        await asyncio.to_thread(drop_slots, dsn, "dbz_")
        await asyncio.to_thread(drop_slots, dsn, "load_test_slot")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for table in ("inbox", "inbox_wal", "messages"):
                await conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))
        await self._web("/load/reset", "POST")

    async def start_consumers(self) -> None:
        s = self.scenario
        payload = json.dumps(s.as_parameters())
        # processes: one process per consumer; tasks: one process runs them all (lab.consumer)
        layout = [[i] for i in range(s.consumers)] if s.consumer_layout == "processes" else [list(range(s.consumers))]
        for group in layout:
            self.consumers.append(self._spawn(f"consumer-{group[0]}", [
                "-m", "lab.consumer", "--pipeline", s.pipeline, "--index", ",".join(map(str, group)),
                "--run-dir", str(self.scratch), "--scenario", payload,
            ]))
        deadline = time.monotonic() + s.ready_timeout_s
        while not all((self.scratch / f"consumer-{i}.ready").exists() for i in range(s.consumers)):
            self._check_consumers_alive()
            if time.monotonic() > deadline:
                raise RunError(f"consumers not ready after {s.ready_timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    def _check_consumers_alive(self) -> None:
        for i, c in enumerate(self.consumers):
            if c.poll() is not None:
                raise RunError(f"consumer {i} exited with {c.returncode}; see {self.scratch / f'consumer-{i}.log'}")

    async def drain(self, sampler: Sampler) -> dict[str, Any]:
        """Open the senders' gate, then wait until every sent message was worked on."""
        s = self.scenario
        self.edges["gate"] = sampler.snapshot()
        (self.scratch / "start").touch()
        senders_out = self.scratch / "senders.json"
        deadline = time.monotonic() + s.drain_timeout_s
        sent_result: dict[str, Any] | None = None
        last_progress = 0.0
        while True:
            await asyncio.sleep(DRAIN_POLL_S)
            self._check_consumers_alive()
            if sent_result is None and senders_out.exists():
                sent_result = json.loads(senders_out.read_text())
            stats = await self._web("/load/stats")
            now = time.monotonic()
            if now - last_progress >= 1.0:
                self.progress("drain", {"processed": stats["calls"]})
                last_progress = now
            if sent_result is not None:
                settled = sent_result["sent"] + sent_result["send_failed"] >= s.messages
                if settled and stats["calls"] >= sent_result["sent"]:
                    break
                if sent_result["sent"] == 0:
                    break
            elif self.procs["senders"].poll() not in (None, 0):
                raise RunError(f"senders exited with {self.procs['senders'].returncode}")
            if now > deadline:
                raise RunError(f"not drained after {s.drain_timeout_s:.0f} s: {stats['calls']} processed")
        self.edges["drained"] = sampler.snapshot()
        return sent_result

    async def stop_consumers(self) -> list[dict[str, Any]]:
        for c in self.consumers:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.send_signal(signal.SIGTERM)
        results = []
        for c in self.consumers:
            try:
                await asyncio.to_thread(c.wait, 30)
            except psutil.TimeoutExpired:
                c.kill()
        for i in range(self.scenario.consumers):  # one result file per consumer in either layout
            path = self.scratch / f"consumer-{i}.json"
            results.append(json.loads(path.read_text()) if path.exists() else {"index": i, "error": "no result"})
        return results

    async def read_slot_stats(self) -> dict[str, dict[str, Any]]:
        """WAL decoded per slot (``pg_stat_replication_slots``), read after the consumers stopped
        (their walsenders flushed their counters) and before any slot is dropped. Fan-out decodes
        the same WAL once per slot; Debezium's slot is one more. Slots are fresh every run."""
        query = (
            "SELECT s.slot_name, s.total_txns, s.total_bytes, s.spill_bytes, s.stream_bytes "
            "FROM pg_stat_replication_slots s JOIN pg_replication_slots r USING (slot_name) "
            "WHERE r.slot_type = 'logical' ORDER BY 1"
        )
        try:
            async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                cur = await conn.execute(query)
                return {
                    name: {"total_txns": txns, "total_bytes": total, "spill_bytes": spill, "stream_bytes": stream}
                    for name, txns, total, spill, stream in await cur.fetchall()
                }
        except psycopg.Error as exc:  # informative only: never fails a run
            log.warning("could not read pg_stat_replication_slots: %s", exc)
            return {}

    async def measure_latency(self, sent: dict[str, Any]) -> None:
        """End-to-end latency of every worked message (:mod:`lab.measure.latency`), read after the drain
        while the web service still holds its arrivals: one ``/load/arrivals`` call and one query
        for the ``created_at`` of those ids. Sets ``latency_ms`` and, for an open-loop run where
        every send succeeded, ``latency_from_due_ms``. A failure is a warning and None. Not for
        ``producer="direct"`` runs, whose messages may have no outbox row."""
        if getattr(self.scenario, "producer", "web") != "web":
            return
        try:
            arrivals = await self._web("/load/arrivals")
            ids = sorted(set(arrivals["ids"]))
            async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT id, extract(epoch FROM created_at)::float8 FROM messages WHERE id = ANY(%s)", (ids,)
                )
                created = dict(await cur.fetchall())
            self.latency_ms = summarize(message_latencies(arrivals["ids"], arrivals["t"], created))
            if sent.get("rate") and sent.get("sent") == self.scenario.messages and sent.get("gate_opened_at"):
                self.latency_from_due_ms = summarize(
                    due_latencies(arrivals["ids"], arrivals["t"], sent["gate_opened_at"], sent["rate"])
                )
        except Exception as exc:  # never fails the run, never silent
            log.warning("run %s: latency not measured: %s: %s", self.run_id, type(exc).__name__, exc)

    async def verify(self) -> dict[str, Any]:
        table = sql.Identifier(self.pipeline.inbox_table)
        key, owner = ("wal", "slot") if self.pipeline.inbox_table == "inbox_wal" else ("id", "consumer")
        async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                sql.SQL("SELECT count(*), count(DISTINCT {}) FROM {}").format(sql.Identifier(key), table)
            )
            rows, distinct = await cur.fetchone()
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {} GROUP BY {} ORDER BY 1").format(table, sql.Identifier(owner))
            )
            claims = [r[0] for r in await cur.fetchall()]
            stats = await self._web("/load/stats")
            sets = await id_sets(conn, (await self._web("/load/arrivals"))["ids"], self.pipeline.inbox_table)
        if self.scenario.producer != "web" and not sets["messages_rows"]:
            sets = {}  # the direct producers of a broker stand write no outbox row: counts only
        return {
            "inbox_rows": rows, "distinct_ids": distinct,
            "claims_min": min(claims, default=0), "claims_max": max(claims, default=0),
            "work_calls": stats["calls"], "work_distinct": stats["distinct"],
            **sets, "ids_match": sets_equal(sets) if sets else None,
        }

    async def cleanup(self) -> None:
        """Stop our processes and the pipeline's source, drop slots; never raises."""
        cgroups.move_to(self.home_cgroup)  # the caller (pytest, a kernel) leaves the lab's group
        with contextlib.suppress(psutil.Error):
            await asyncio.to_thread(children.stop, [c for c in self.consumers if c.poll() is None], timeout=0)
        with contextlib.suppress(Exception):
            await self.pipeline.teardown()
        ours = [*self.consumers, *self.procs.values()]
        with contextlib.suppress(Exception):
            await asyncio.to_thread(children.stop, [p for p in ours if p.poll() is None], timeout=10)
            children.forget(self.settings, ours)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(drop_slots, self.settings.pg_dsn, "load_test_slot")
        if self._http is not None:
            await self._http.close()

    async def execute(self) -> dict[str, Any]:
        s, st = self.scenario, self.settings
        self.scratch.mkdir(parents=True, exist_ok=True)
        started_at = datetime.now(UTC).isoformat()
        sampler: Sampler | None = None
        error: str | None = None
        sent: dict[str, Any] = {}
        consumer_results: list[dict[str, Any]] = []
        checks: dict[str, Any] = {}
        try:
            self.progress("setup", {})
            web_args = ["-m", "lab.workload.web", "--port", str(st.web_port), "--dsn", st.pg_dsn,
                        "--reset", s.reset]
            if s.work_delay_ms:
                web_args += ["--work-delay-ms", str(s.work_delay_ms)]
            self.procs["web"] = self._spawn("web", web_args)
            self.procs["probe"] = self._spawn("probe", ["-m", "lab.measure.probe", "--out", str(self.scratch / "probe.json")])
            await self._wait_web()
            await self.reset()
            await self.pipeline.prepare()
            gate_out = ["--start-file", str(self.scratch / "start"), "--out", str(self.scratch / "senders.json")]
            if s.producer == "direct":  # broker-native stand: write straight into the transport
                target = {"kafka": "kafka", "rabbitmq": "rabbitmq"}.get(s.pipeline, "pg")
                sender_args = ["-m", "lab.pipelines.producers", "--target", target, "--messages", str(s.messages),
                               "--producers", str(s.senders), "--reset", s.reset, *gate_out]
            else:
                sender_args = ["-m", "lab.workload.senders", "--url", st.web_url, "--messages", str(s.messages),
                               "--senders", str(s.senders), *gate_out]
                if s.rate:
                    sender_args += ["--rate", str(s.rate)]
            self.procs["senders"] = self._spawn("senders", sender_args)
            await self.start_consumers()
            self.progress("ready", {})
            await self.pipeline.wait_ready()
            with tied():  # the run's Debezium dies with this runner, like its other processes
                await self.pipeline.start_source()
            walk = self.cpu_method if self.cpu_method != "cgroup" else "proc-ticks"
            sampler = Sampler(self.participants(), cpu_method=walk)
            self.host_window.start()
            sampler.start()
            sent = await self.drain(sampler)
            consumer_results = await self.stop_consumers()
            # The drain is seen when the web service has counted every call, but a consumer's
            # last work completes when the reply reaches it (later still with a work delay or
            # a loaded machine): read once more after the consumers exited, so the window's
            # end always lies inside the sampled timeline.
            self.edges["stopped"] = sampler.snapshot()
            self.host_window.stop()
            sampler.stop()
            self.slot_stats = await self.read_slot_stats()
            checks = await self.verify()
            await self.measure_latency(sent)
        except Exception as exc:
            log.exception("run %s failed", self.run_id)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if sampler is not None:
                sampler.stop()
            await self.cleanup()
        await self._checkpoint_and_cool()
        return self._assemble(started_at, sampler, sent, consumer_results, checks, error)

    async def _checkpoint_and_cool(self) -> None:
        with contextlib.suppress(Exception):
            async with await psycopg.AsyncConnection.connect(self.settings.pg_dsn, autocommit=True) as conn:
                await conn.execute("CHECKPOINT")
        if self.scenario.cooldown_s:
            self.progress("cooldown", {})
            await asyncio.sleep(self.scenario.cooldown_s)

    def _assemble(self, started_at: str, sampler: Sampler | None, sent: dict[str, Any],
                  consumers: list[dict[str, Any]], checks: dict[str, Any], error: str | None) -> dict[str, Any]:
        s = self.scenario
        processed = sum(c.get("processed", 0) for c in consumers)
        counters = {
            "sent": sent.get("sent", 0), "send_failed": sent.get("send_failed", 0),
            "processed": processed,
            "skipped": sum(c.get("skipped", 0) for c in consumers),
            "failures": sum(c.get("failures", 0) for c in consumers),
            "db_ops": sum(c.get("db_ops", 0) for c in consumers),
            "decoded_bytes": sum(c.get("decoded_bytes", 0) for c in consumers),
            **checks,
        }
        consumer_errors = [f"consumer {c['index']}: {c['error']}" for c in consumers if c.get("error")]
        if error is None and consumer_errors:
            error = "; ".join(consumer_errors)
        m = s.messages
        success = (
            error is None and counters["send_failed"] == 0 and counters["sent"] == m
            and processed == m and checks.get("distinct_ids") == m
            and checks.get("work_calls") == m and checks.get("work_distinct") == m
            and checks.get("ids_match") is not False  # the id sets, not only their sizes
        )
        if error is None and not success:
            error = "counters do not match: " + ", ".join(
                f"{k}={counters.get(k)}" for k in ("sent", "send_failed", "processed", "distinct_ids", "work_calls",
                                                   "work_distinct", "ids_match")
            )
        t0 = sent.get("first_send_mono")
        lasts = [c["last_work_mono"] for c in consumers if c.get("last_work_mono")]
        t1 = max(lasts) if lasts else None
        cpu_s: dict[str, float] = {}
        mem_mb: dict[str, float] = {}
        mem_mb_max: dict[str, float] = {}
        window: dict[str, Any] = {}
        if sampler is not None and t0 and t1 and t1 > t0:
            timeline = sampler.timeline()
            a, b = interpolate(timeline, t0), interpolate(timeline, t1)
            window = sampler.window(a, b)
            self.samples = sampler.timeline_rows(origin=a)
            parts = {n: v for n, v in window["participants"].items() if not n.startswith("consumer-")}
            parts.update(window["groups"])
            cpu_s = {n: v["cpu_s"] for n, v in parts.items()}
            mem_mb = {n: v["rss_mb_mean"] for n, v in parts.items()}
            mem_mb_max = {n: v["rss_mb_max"] for n, v in parts.items()}
            for c in consumers:
                w = window["participants"].get(f"consumer-{c['index']}")
                if w:
                    c["cpu_s"], c["rss_mb_mean"] = w["cpu_s"], w["rss_mb_mean"]
            cpu_s["unattributed"] = window["unattributed_cpu_s"]
        probe_cpu_s = cpu_s.pop("probe", None)  # its own participant, never in the totals
        mem_mb.pop("probe", None), mem_mb_max.pop("probe", None)
        speed = probe.summarise(self.scratch / "probe.json", t0, t1) if t0 and t1 else None
        if speed is not None:
            speed["cpu_s"] = probe_cpu_s
        total = sum(v for k, v in cpu_s.items() if k != "unattributed")
        span = t1 - t0 if t0 and t1 else None
        raw = round(total * 1000 / m, 4) if window else None
        return {
            "run_id": self.run_id,
            "started_at": started_at,
            "scenario": s.as_parameters(),
            "pipeline_settings": self.pipeline.describe(),
            "success": success,
            "error": error,
            "window_s": round(span, 3) if span else None,
            "cpu_ms_per_msg": raw,
            "cpu_ms_per_msg_norm": probe.normalise(raw, speed),  # at the probe's reference speed
            "speed": speed,
            "cpu_s": cpu_s,
            "mem_mb": mem_mb,
            "mem_mb_max": mem_mb_max,
            "slots": self.slot_stats,
            "idle": self._idle_block(cpu_s, span or 0.0),
            "latency_ms": self.latency_ms,
            "latency_from_due_ms": self.latency_from_due_ms,
            "achieved_rate": achieved_rate(sent, span),
            "counters": counters,
            "senders": sent,
            "consumers": consumers,
            "sampler": {k: window.get(k) for k in ("samples", "host_busy_cpu_s", "sampler_cpu_s",
                                                    "sampler_core_pct")},
            **provenance(root=self.settings.root, cpu_method=self.cpu_method, services=self._versions(),
                         clients=client_versions() | broker_client_versions(), window=self.host_window),
            **stack_record(self.stack),
            "lab_version": __version__,
        }

    def _idle_block(self, cpu_s: dict[str, float], window_s: float) -> dict[str, Any] | None:
        """This run's cost with the series' idle baseline taken out (lab.measure.idle), or None."""
        if not self.idle or not cpu_s or window_s <= 0:
            return None
        sink = self.pipeline.cdc_sink if self.scenario.producer == "web" else None
        rates = idle_rates_for(self.idle, cdc_sink=sink)
        return {"measured_at": self.idle.get("measured_at"), "cpu_s_per_s": rates,
                **net_of_idle(cpu_s, window_s, self.scenario.messages, rates)}

    def _versions(self) -> dict[str, str]:
        out = {}
        for status in self.stack.status():
            if status.version:
                out[status.name] = status.version
        return out


def interpolate(timeline: list[Snapshot], t: float) -> Snapshot:
    """The counters at monotonic time ``t``, linear between the two readings around it.

    The runner reads every counter right before opening the senders' gate and right after
    the drain is seen; the window's exact edges (first send completion, last work completion)
    fall between those and the background samples, so the interpolated span is short.
    """
    snaps = sorted(timeline, key=lambda s: s.t_mono)
    before = [s for s in snaps if s.t_mono <= t]
    after = [s for s in snaps if s.t_mono >= t]
    if not before or not after:
        raise ValueError(f"t={t} is outside the sampled timeline")
    a, b = before[-1], after[0]
    if b.t_mono == a.t_mono:
        return a
    f = (t - a.t_mono) / (b.t_mono - a.t_mono)

    def mix(x: float, y: float) -> float:
        return x + (y - x) * f

    names = a.cpu_s.keys() & b.cpu_s.keys()
    return Snapshot(
        t_mono=t,
        t_wall=mix(a.t_wall, b.t_wall),
        cpu_s={n: mix(a.cpu_s[n], b.cpu_s[n]) for n in names},
        rss_mb={n: mix(a.rss_mb.get(n, 0.0), b.rss_mb.get(n, 0.0)) for n in names},
        host_busy_s=mix(a.host_busy_s, b.host_busy_s),
        sampler_cpu_s=mix(a.sampler_cpu_s, b.sampler_cpu_s),
    )


async def run_scenario(
    scenario: Scenario, settings: Settings, *, progress: Progress | None = None,
    meta: dict[str, Any] | None = None, idle: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Execute one run on the configured stack (``LAB_BACKEND``), store it under data/runs/, return run.json's content.

    ``meta``: extra top-level fields stored with the run (e.g. ``series_id``, ``series_index``).
    ``idle``: an idle baseline (:func:`lab.measure.idle.measure_idle`); the run then stores its cost
    without it (``idle``).
    """
    stack = get_stack(settings)
    with exclusive(settings.run_lock, "the stack"):
        await asyncio.to_thread(stack.up)
        await asyncio.to_thread(check_clean, settings, stack)
        run = Run(scenario, settings, stack, progress or (lambda phase, info: None), idle=idle)
        result = await run.execute()
    result.update(meta or {})
    write_run(result, run.samples, settings=settings)
    return result
