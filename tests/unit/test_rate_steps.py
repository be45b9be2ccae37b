"""``Scenario.rate_steps``: the staircase's grammar, its one-line errors, the derived message count,
``lab run``'s options, and the senders' open loop following it (a fake POST, no service)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lab import cli
from lab.scenario import Scenario, parse_rate_steps, step_plan
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


def _staircase(plan, stop: Path | None, stop_after_s: float | None = None):
    calls: list[float] = []

    async def post() -> int:
        calls.append(time.monotonic())
        return 200

    async def main() -> senders.Tally:
        t = senders.Tally(sum(n for _, _, n in plan))
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.touch)
        start = time.monotonic()
        await senders._staircase(post, t, plan, stop)
        calls[:] = [c - start for c in calls]
        return t

    return asyncio.run(main()), calls


def test_the_senders_follow_the_staircase(tmp_path: Path) -> None:
    plan = step_plan((50.0, 100.0), 0.4)  # 20 then 40 messages
    t, calls = _staircase(plan, tmp_path / "stop")
    assert (t.sent, t.failed, t.steps) == (60, 0, 2)
    assert calls[19] == pytest.approx(19 / 50, abs=0.05)  # the first step's last message
    assert calls[20] == pytest.approx(0.4, abs=0.05)  # the second step starts on time ...
    assert calls[-1] == pytest.approx(0.4 + 39 / 100, abs=0.05)  # ... at twice the rate


def test_a_stop_file_ends_the_staircase_at_the_next_step(tmp_path: Path) -> None:
    plan = step_plan((50.0, 100.0, 200.0), 0.4)
    t, calls = _staircase(plan, tmp_path / "stop", stop_after_s=0.2)  # during the first step
    assert (t.sent, t.steps) == (20, 1)  # that step is finished, no further one starts
    assert len(calls) == 20
