"""``Scenario.rate_steps``: the staircase's grammar, its one-line errors, the derived message count,
``lab run``'s options, and the senders' open loop following it (a fake POST, no service)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab import cli
from lab.scenario import Scenario, parse_rate_steps, step_plan, warm_plan, warm_rest_s
from lab.study import presentation
from lab.workload import senders


def test_parses_and_derives_the_message_count() -> None:
    assert parse_rate_steps("200, 400,800.5") == (200.0, 400.0, 800.5)
    s = Scenario(rate_steps="200,400,800", step_s=15)
    assert s.messages == 200 * 15 + 400 * 15 + 800 * 15
    assert s.staircase == [(200.0, 0.0, 3000), (400.0, 15.0, 6000), (800.0, 30.0, 12000)]
    assert Scenario(rate_steps="200,400", messages=5).messages == 200 * 20 + 400 * 20  # replaced
    assert s.slug == "wal-c1-m21000-steps200-800x15s"
    assert Scenario().staircase == []
    assert step_plan((0.5,), 1.0) == [(0.5, 0.0, 1)]  # at least one message a step


def test_a_warm_phase_comes_first_at_the_top_rate_and_moves_the_steps() -> None:
    s = Scenario(rate_steps="200,400", step_s=10, warm_s=3)
    assert s.warm == [(400.0, 0.0, 1200)]  # 3 s at the top rate, from the gate
    assert warm_rest_s(3.0) == 6.0 and warm_rest_s(0.5) == 2.0 and warm_rest_s(0.0) == 0.0
    assert s.staircase == [(200.0, 9.0, 2000), (400.0, 19.0, 4000)]  # after 3 s of warm and 6 s of rest
    assert s.messages == 1200 + 2000 + 4000  # the warm messages are messages of the run
    assert s.slug == "wal-c1-m7200-steps200-400x10s-warm3s"
    assert Scenario(rate_steps="200,400", step_s=10).warm == [] and Scenario().warm == []
    assert warm_plan((50.0,), 0.001) == [(50.0, 0.0, 1)]  # at least one message


@pytest.mark.parametrize(("changes", "says"), [
    ({"rate_steps": "100", "warm_s": -1.0}, "warm_s must not be negative"),
    ({"rate_steps": "100", "warm_s": 3601.0}, "warm_s must be at most 3600"),
    ({"rate_steps": "100", "warm_s": float("nan")}, "warm_s must be a finite number"),
    ({"warm_s": 5.0}, "warm_s needs rate_steps"),
])
def test_a_bad_warm_phase_fails_with_one_line(changes: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says) as e:
        Scenario(**changes)
    assert "\n" not in str(e.value)


def test_lab_run_takes_the_warm_phase(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["run", "--rate-steps", "100,200", "--warm-s", "3"])
    assert args.warm_s == 3.0
    with pytest.raises(SystemExit) as e:  # the option's own bounds, as argparse refuses them
        cli.main(["run", "--rate-steps", "100,200", "--warm-s", "-1"])
    assert e.value.code == 2 and "--warm-s: '-1' must be a finite number at least 0" in capsys.readouterr().err
    assert cli.main(["run", "--warm-s", "5"]) == 2  # no staircase to warm
    assert "warm_s needs rate_steps" in capsys.readouterr().err


@pytest.mark.parametrize(("changes", "says"), [
    ({"rate_steps": "200,200"}, "must increase strictly"),
    ({"rate_steps": "400,200"}, "must increase strictly"),
    ({"rate_steps": "0,100"}, "positive finite"),
    ({"rate_steps": "-5"}, "positive finite"),
    ({"rate_steps": "100,inf"}, "positive finite"),
    ({"rate_steps": "100,"}, "not a comma-separated list"),
    ({"rate_steps": "fast"}, "not a comma-separated list"),
    ({"rate_steps": "100", "rate": 50.0}, "rate_steps and rate exclude each other"),
    ({"rate_steps": "100", "producer": "direct"}, "needs producer='web'"),
    ({"rate_steps": "100", "fault": "consumer-kill@1s"}, "exclude each other"),
    ({"rate_steps": "100", "step_s": 0.5}, "step_s must be between 1 and 3600"),
])
def test_bad_staircases_fail_with_one_line(changes: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says) as e:
        Scenario(**changes)
    assert "\n" not in str(e.value)


def test_lab_run_takes_the_staircase_and_refuses_messages_with_it(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.build_parser().parse_args(["run", "--rate-steps", "100,200", "--step-s", "5"])
    assert (args.rate_steps, args.step_s) == ("100,200", 5.0)
    assert cli.main(["run", "--rate-steps", "100,200", "--messages", "900"]) == 2
    assert "drop --messages" in capsys.readouterr().err
    assert cli.main(["run", "--rate-steps", "300,100"]) == 2
    assert "must increase strictly" in capsys.readouterr().err


def _staircase(plan, stop: Path | None, stop_after_s: float | None = None,
               monkeypatch: pytest.MonkeyPatch | None = None, warm: int = 0):
    """Run the senders' staircase on a fake POST: (tally, when each POST started, each one's due
    time), times relative to the staircase's start."""
    calls: list[float] = []
    dues: list[float] = []
    real_send = senders._send

    async def send(post, t, due):  # the real _send, recording the due time it was given
        dues.append(due)
        await real_send(post, t, due)

    monkeypatch.setattr(senders, "_send", send)

    async def post() -> int:
        calls.append(time.monotonic())
        return 200

    async def main() -> senders.Tally:
        t = senders.Tally(sum(n for _, _, n in plan))
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.touch)
        start = time.monotonic()
        await senders._staircase(post, t, plan, stop, warm)
        calls[:] = [c - start for c in calls]
        dues[:] = [d - start for d in dues]
        return t

    return asyncio.run(main()), calls, dues


def test_the_senders_follow_the_staircase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = step_plan((50.0, 100.0), 0.4)  # 20 then 40 messages
    t, calls, dues = _staircase(plan, tmp_path / "stop", monkeypatch=monkeypatch)
    assert (t.sent, t.failed, t.steps) == (60, 0, 2)
    want = [j / 50 for j in range(20)] + [0.4 + j / 100 for j in range(40)]
    assert dues == pytest.approx(want, abs=2e-3)  # the schedule: 50 msg/s, then 100 msg/s from 0.4 s
    assert all(c >= d - 1e-3 for c, d in zip(calls, dues, strict=True))  # never sent before it is due
    assert calls[-1] < 2.0  # and not wildly late (a loaded machine may delay it a little)
    assert len(t.latency) == 60 and min(t.latency) >= 0  # latency counted from each due time


def test_a_stop_file_ends_the_staircase_at_the_next_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = step_plan((50.0, 100.0, 200.0), 0.4)
    t, calls, _ = _staircase(plan, tmp_path / "stop", stop_after_s=0.2, monkeypatch=monkeypatch)
    assert (t.sent, t.steps) == (20, 1)  # that step is finished, no further one starts
    assert len(calls) == 20


def test_the_warm_phase_is_sent_first_and_is_no_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = [(100.0, 0.0, 10), (50.0, 0.3, 10), (100.0, 0.5, 20)]  # warm 0.1 s at the top rate, a rest, two steps
    t, calls, dues = _staircase(plan, tmp_path / "stop", monkeypatch=monkeypatch, warm=1)
    assert (t.sent, t.steps) == (40, 2)  # the warm phase is not counted as a step
    want = [j / 100 for j in range(10)] + [0.3 + j / 50 for j in range(10)] + [0.5 + j / 100 for j in range(20)]
    assert dues == pytest.approx(want, abs=2e-3)
    assert min(calls[10:]) >= 0.3 - 1e-3  # the rest: no step's message before the first step's start
    (tmp_path / "stop").touch()  # a stop file that exists from the start: the warm phase and step 0 still go
    t, calls, _ = _staircase(plan, tmp_path / "stop", monkeypatch=monkeypatch, warm=1)
    assert (t.sent, t.steps) == (20, 1)


def test_the_senders_plan_and_report_the_warm_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab import scenario

    monkeypatch.setattr(scenario, "WARM_REST_MIN_S", 0.0)  # a short rest: 2 x 0.1 s

    class Post:
        def __init__(self, *args: object, **kw: object) -> None:
            self.n = 0

        async def post(self) -> int:
            self.n += 1
            return 200

        def close(self) -> None:
            return None

    monkeypatch.setattr(senders, "RawPost", Post)
    kw = {"rate_steps": "50,100", "step_s": 0.2, "warm_s": 0.1}  # warm: 10 at 100 msg/s; steps: 10 and 20
    with pytest.raises(ValueError, match="not the staircase's 40"):
        asyncio.run(senders.run_senders("http://web", 30, 1, **kw))
    r = asyncio.run(senders.run_senders("http://web", 40, 1, **kw))
    assert (r.sent, r.planned, r.steps_sent, r.warm_s) == (40, 40, 2, 0.1) and r.ok
    assert r.last_send_mono - r.first_send_mono >= 0.1 + 0.2 + 0.2 + 0.18  # the rest and both steps were waited


def test_lab_run_prints_every_step_and_the_verdict() -> None:
    step = {"rate": 200.0, "achieved_rate": 199.5, "delivered_per_s": 150.0, "lag_end": 900, "oldest_age_s": 4.5,
            "lag_slope": 48.0, "sustainable": False, "failed": ["lag grows 48.0 msg/s > 10"],
            "latency_ms": {"p50": 10.0, "p99": 40.0}, "latency_from_due_ms": {"p99": 45.0},
            "cpu_ms_per_msg": {"total": 1.25, "web": 0.2}}
    result = {"run_id": "r1", "scenario": {"pipeline": "wal", "consumers": 1, "messages": 900, "rate": 0.0,
                                           "rate_steps": "100,200"},
              "counters": {}, "success": True, "error": None, "window_s": 7.0, "cpu_ms_per_msg": 1.0,
              "cpu_s": {"web": 1.0}, "mem_mb": {}, "steps": [{**step, "rate": 100.0, "sustainable": True,
                                                              "failed": []}, step],
              "max_sustainable_rate": 100.0,
              "staircase": {"limit_found": True, "stop": {"after_step": 1, "lag": 900}}}
    summary = presentation.summary(result)
    assert summary["max_sustainable_rate"] == 100.0
    assert summary["steps"][1] == {"rate": 200.0, "achieved_rate": 199.5, "delivered_per_s": 150.0,
                                   "lag_end": 900, "oldest_age_s": 4.5, "lag_slope": 48.0, "sustainable": False,
                                   "p50_ms": 10.0, "p99_ms": 40.0, "due_p99_ms": 45.0, "cpu_ms_per_msg": 1.25,
                                   "failed": ["lag grows 48.0 msg/s > 10"]}
    out = presentation.run_text(result)
    assert "max sustainable rate 100.0 msg/s; stopped early after step 1 (lag 900)" in out
    assert "step     200 msg/s: achieved 199.5" in out and "NOT: lag grows 48.0 msg/s > 10" in out
    assert "step     100 msg/s" in out and ": sustainable" in out


def test_the_runner_tests_each_step_but_the_last_a_second_before_its_end() -> None:
    from lab.measure.staircase import STOP_LEAD_S
    from lab.runner.drain import Staircase

    def staircase(rate_steps: str, step_s: float, gate: float) -> Staircase:
        env = SimpleNamespace(scenario=Scenario(rate_steps=rate_steps, step_s=step_s))
        stair = Staircase(env)  # type: ignore[arg-type]
        stair.start(gate)
        return stair

    w = staircase("100,200,400", 10, 100.0)
    assert STOP_LEAD_S == 1.0
    assert not w.due(108.9) and w.due(109.0)
    w.step = 1
    assert not w.due(118.9) and w.due(119.0)
    w.step = 2  # the last step: nothing would follow it
    assert not w.due(1e9)
    short = staircase("100,200", 2, 0.0)
    assert not short.due(1.49) and short.due(1.5)  # at most a quarter step early
    env = SimpleNamespace(scenario=Scenario(rate_steps="100,200,400", step_s=10, warm_s=5))
    warmed = Staircase(env)  # type: ignore[arg-type]
    warmed.start(100.0)  # the first step from 5 s of warm and 10 s of rest: tested at 100 + 15 + 10 - 1
    assert not warmed.due(123.9) and warmed.due(124.0)


def test_lab_run_shows_the_warm_phase_and_whether_it_cleared() -> None:
    warm = {"rate": 800.0, "seconds": 10.0, "messages": 8000, "sent": 8000, "rest_s": 20.0, "lag_end": 3000,
            "lag_at_first_step": 120, "cleared": False}
    result = {"run_id": "r1", "scenario": {"pipeline": "kafka", "consumers": 1, "messages": 9000, "rate": 0.0,
                                           "rate_steps": "100"},
              "counters": {}, "success": True, "error": None, "window_s": 40.0, "cpu_ms_per_msg": 1.0,
              "cpu_s": {"web": 1.0}, "mem_mb": {}, "steps": [], "max_sustainable_rate": None,
              "staircase": {"limit_found": False, "stop": None}, "warm": warm}
    assert presentation.summary(result)["warm"] == warm
    out = presentation.run_text(result)
    assert "warm 10 s at 800 msg/s (8000 messages, not a step), rest 20 s: lag 3000 at its end, 120 when" in out
    assert "NOT cleared" in out
    assert "NOT cleared" not in presentation.run_text({**result, "warm": {**warm, "cleared": True}})
