"""What a fault run measures beyond the accounting: the broker backlog's sampling loop,
its readers' parsing, spill in the WAL summary, the analysis block and ``lab run``'s fault line."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from lab.pipelines.backlog import KafkaBacklog, parse_erl_call, queue_expression
from lab.runner.fault_driver import FaultInjector, wal_summary
from lab.runner.values import Accounted
from lab.scenario import Scenario
from lab.settings import Settings
from lab.study.presentation import fault_line, phases_line

ROOT = Path(__file__).resolve().parents[3]


class Reader:
    """A backlog reader that replays ``script`` (lists of samples, or an exception to raise)."""

    where = "kafka"

    def __init__(self, script: list[Any]) -> None:
        self.script, self.closed = script, 0

    async def read(self) -> list[dict[str, Any]]:
        step = self.script.pop(0) if self.script else []
        if isinstance(step, Exception):
            raise step
        return [dict(s) for s in step]

    def close(self) -> None:
        self.closed += 1

    async def aclose(self) -> None:
        self.closed += 1


def _fault_run(scenario: Scenario) -> FaultInjector:
    """The fault injector of a run of ``scenario`` that has not started anything (no stack, no processes)."""
    env = SimpleNamespace(scenario=scenario, settings=Settings(), stack=None, pipeline=None)
    return FaultInjector(env, None)  # type: ignore[arg-type]


def _injector(reader: Reader) -> FaultInjector:
    inj = _fault_run(Scenario(consumers=2, fault="consumer-dead:1@3s+3s"))
    inj.state.start(time.monotonic())
    inj.samplers._backlog_reader = reader
    return inj


def test_backlog_samples_and_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.runner.fault_sampling.BACKLOG_SAMPLE_S", 0.01)
    t = time.monotonic()
    reader = Reader([[{"t": t + 1.0, "messages": 5}], [{"t": t + 2.0, "error": "broker down"}],
                     [{"t": t + 3.0, "messages": 9, "ready": 4, "unacked": 5}], RuntimeError("boom")])
    inj = _injector(reader)
    inj.state.t0 = t
    asyncio.run(inj.samplers.watch_backlog())  # the error ends the loop quietly: it must never fail the run
    assert inj.samplers.backlog == [{"t_s": 1.0, "where": "kafka", "messages": 5},
                           {"t_s": 3.0, "where": "kafka", "messages": 9, "ready": 4, "unacked": 5}]
    assert inj.samplers.backlog_gaps == [{"t_s": 2.0, "where": "kafka", "error": "broker down"}]
    assert reader.closed == 1


def test_backlog_sampling_is_cancelled_and_closes_its_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.runner.fault_sampling.BACKLOG_SAMPLE_S", 0.01)
    t = time.monotonic()
    reader = Reader([[{"t": t - 5.0, "messages": -1}]] + [[{"t": t + k, "messages": k}] for k in range(1000)])
    inj = _injector(reader)
    inj.state.t0 = t

    async def go() -> None:
        task = asyncio.create_task(inj.samplers.watch_backlog())
        # cancelled once it has sampled a few times (not after a fixed 0.1 s: a loaded machine that
        # deschedules the loop for that long left one sample in it)
        deadline = time.monotonic() + 30
        while len(inj.samplers.backlog) < 3:
            assert time.monotonic() < deadline, "the backlog was not sampled"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert 3 <= len(inj.samplers.backlog) < 1000 and reader.closed == 1  # the reading before the gate is dropped
    assert [s["messages"] for s in inj.samplers.backlog] == list(range(len(inj.samplers.backlog)))


def test_erl_call_output() -> None:
    assert parse_erl_call(b"{ok,{12,345}}\n") == (12, 345)
    assert parse_erl_call(b"{ok, {0, 0}}") == (0, 0)
    assert parse_erl_call(b"{error,{badmatch,{error,not_found}}}") is None
    assert parse_erl_call(b"erl_call: failed to connect to node h2@localhost") is None
    expr = queue_expression("load-dbz-quorum")
    assert b'<<"load-dbz-quorum">>' in expr and expr.endswith(b".\n")
    with pytest.raises(ValueError):
        queue_expression('x">>,evil')


def test_kafka_sampler_child_reports_gaps_and_is_started_again(tmp_path: Path) -> None:
    """The real child against a port where no broker listens: every reading is a gap (its requests
    time out), it keeps running; killed (as an abort would), the reader says so and starts another."""
    settings = SimpleNamespace(stack_dir=tmp_path, root=ROOT, kafka_bootstrap="127.0.0.1:9")
    reader = KafkaBacklog(settings, "topic", "group", 2, tmp_path)

    async def until_lines(n: int) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            got += await reader.read()
            await asyncio.sleep(0.2)
        return got

    async def go() -> None:
        try:
            lines = await until_lines(2)
            assert len(lines) >= 2 and all("error" in s and "messages" not in s for s in lines), lines
            first = reader.procs[0]
            assert first.poll() is None
            assert first.ppid() == psutil.Process().pid  # the runner's child: its CPU is the runner's
            first.send_signal(signal.SIGKILL)
            first.wait(5)
            again = await reader.read()
            assert again and "exited with -9" in again[0]["error"]
            assert len(reader.procs) == 2 and reader.procs[1].poll() is None
            assert await until_lines(1)
        finally:
            await reader.aclose()

    asyncio.run(go())
    assert all(p.poll() is not None for p in reader.procs)
    assert not list((tmp_path / "children").glob("*.json")), "the child's records are dropped"
    assert all(json.loads(line) for line in (tmp_path / "backlog-kafka.jsonl").read_text().splitlines())


def test_wal_summary_keeps_the_spill() -> None:
    samples = [{"t_s": t, "slot": "s", "retained_bytes": 10, "unconfirmed_bytes": 0, "wal_status": "reserved",
                "safe_wal_size": None, "active": True, "spill_txns": txns, "spill_bytes": b}
               for t, txns, b in [(0.0, 0, 0), (1.0, 1, 4096), (2.0, None, None), (3.0, 2, 9000)]]
    out = wal_summary(samples, 0.5, 1.5)["s"]
    assert (out["spill_txns"], out["spill_bytes"]) == (2, 9000)


def test_analysis_block() -> None:
    inj = _injector(Reader([]))
    inj._inject = object()  # type: ignore[assignment]  # started
    inj.state.t0_wall = 1000.0
    inj.state.events = [{"what": "stop", "t_s": 3.0}, {"what": "resume", "t_s": 6.0}]
    # 10 msg/s for 10 s, 20 ms each; consumer 1 (odd ids) stopped from 3 to 6 s
    created = {k: 1000.0 + k / 10 for k in range(100)}
    t = {k: c + 0.02 if k % 2 == 0 or not 3 <= c - 1000 + 0.02 < 6 else 1006.0 + k / 1000
         for k, c in created.items()}
    ids = sorted(t, key=t.get)
    arrivals = {"ids": ids, "t": [t[i] for i in ids], "by": [i % 2 for i in ids]}
    out = inj.analysis(Accounted({}, arrivals, created))
    assert set(out) == {"consumer_lag", "phases", "recovery_s", "recovery_bands", "excess_cpu"}
    assert out["excess_cpu"] is None  # no timeline given
    assert set(out["phases"]) == {"before", "during", "after"}
    assert out["phases"]["during"]["delivered_per_s"] == pytest.approx(5, abs=0.4)
    assert isinstance(out["recovery_s"], float) and out["recovery_s"] < 2
    lag6 = [r for r in out["consumer_lag"] if r["t_s"] == 5.0 and r["consumer"] == 1]
    assert lag6 and lag6[0]["lag_messages"] == 10  # the odd ids created in [3, 5]
    assert inj.analysis(None) == dict.fromkeys(out)  # not accounted (the run failed before): nothing


def test_fault_line_shows_recovery_backlog_and_phases() -> None:
    phase = {"t0_s": 0.0, "t1_s": 3.0, "delivered": 600, "delivered_per_s": 200.0,
             "cpu_ms_per_msg": {"consumers": 1.0, "web": 0.5}, "cpu_ms_per_msg_total": 1.5,
             "latency_ms": {"p50": 5.0, "p95": 9.0, "p99": 12.0}}
    fault = {"spec": "consumer-dead:1@3s+3s", "accounting": {"lost": 0}, "events": [], "wal_summary": {},
             "recovery_s": 1.4, "backlog_peak": 480, "backlog": [{"t_s": 1.0, "where": "rabbitmq", "messages": 3}],
             "backlog_gaps": [{"t_s": 2.0}], "phases": {"before": phase, "during": phase, "after": phase},
             "excess_cpu": {"total_s": 2.75, "excess_s": {"web": 2.75}}}
    line = fault_line(fault)
    got = (line["recovery_s"], line["backlog_peak"], line["backlog_where"], line["backlog_gaps"])
    assert got == (1.4, 480, "rabbitmq", 1)
    assert line["phases"]["before"] == {"delivered_per_s": 200.0, "cpu_ms_per_msg": 1.5, "p99_ms": 12.0}
    text = phases_line(line)
    assert text.startswith("recovered after 1.4 s, excess CPU 2.75 s, peak backlog 480 (rabbitmq, 1 gaps); "
                           "before 200.0 msg/s")
    empty = fault_line({"spec": "x", "accounting": None, "events": []})
    assert empty["recovery_s"] is None and empty["excess_cpu_s"] is None and empty["phases"] == {}
    assert "peak backlog -" in phases_line(empty)



def test_rabbitmq_reader_through_a_real_subprocess(tmp_path: Path) -> None:
    """``RabbitBacklog`` runs its ``erl_call`` argv with the expression on stdin: here a shell that
    answers as erl_call would, then one that fails while no broker answers either (a gap)."""
    from lab.pipelines.backlog import RabbitBacklog

    seen = tmp_path / "stdin"
    answer = (["sh", "-c", f"cat > {seen}; echo '{{ok, {{4, 7}}}}'"], None)
    settings = SimpleNamespace(amqp_url="amqp://u:p@127.0.0.1:9/")
    reader = RabbitBacklog(settings, answer, "load-dbz-quorum")  # type: ignore[arg-type]
    [sample] = asyncio.run(reader.read())
    assert (sample["messages"], sample["ready"], sample["unacked"], sample["source"]) == (11, 4, 7, "erl_call")
    assert seen.read_bytes() == queue_expression("load-dbz-quorum")
    down = RabbitBacklog(settings, (["sh", "-c", "echo nodedown; exit 1"], None), "q")  # type: ignore[arg-type]
    for _ in range(4):
        [gap] = asyncio.run(down.read())
        assert "messages" not in gap and gap["error"]
    assert down.erl_call is not None, "a broker that answers nothing is a gap, not a reason to give up erl_call"


def test_the_fault_block_keeps_its_fields_and_adds_what_the_fault_is() -> None:
    """run.json's ``fault`` block: every field it had, plus what the fault recorded of itself (schema 3)."""
    inj = _fault_run(Scenario(pipeline="kafka", consumers=2, fault="postgres-restart@3s+1s"))
    block = inj.record(None)
    assert {"spec", "kind", "target", "start_s", "duration_s", "extra_s", "keep_mb", "rows", "mode", "slot",
            "debezium_properties", "extra_rows", "events", "accounting", "wal", "wal_summary", "max_retained_wal",
            "guard", "invalidation", "backlog", "backlog_gaps", "backlog_peak", "consumer_lag", "phases",
            "recovery_s", "recovery_bands", "excess_cpu"} <= set(block)
    assert (block["kind"], block["duration_s"], block["debezium_properties"] is not None) == (
        "postgres-restart", 1.0, True)
    assert (block["family"], block["stops_service"], block["stops_source"], block["hit_consumers"]) == (
        "service_restart", True, True, [])
    assert inj.facts("takeover") == {"kind": "postgres-restart", "extra_rows": 0, "invalidation": None,
                                     "claim": "takeover", "stops_source": True}
