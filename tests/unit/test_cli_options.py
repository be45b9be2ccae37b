"""Every number option of every `lab` subcommand refuses bad values in one line, before doing
anything: the parser tree is walked, so an option added later is covered too."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time

import pytest

from lab import cli
from lab.settings import Settings

BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "1e308", "99999999999999999999999", "x")


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                                          argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [leaf for name, child in subs[0].choices.items() for leaf in _leaves(child, (*path, name))]


def _required(parser: argparse.ArgumentParser) -> list[str]:
    """Valid values for a leaf's required arguments, so that only the bad one fails."""
    out: list[str] = []
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.dest != "help":
            out.append(str(a.choices[0]) if a.choices else "kafka")
        elif a.required:
            out += [a.option_strings[0], "reset=discard,none"]
    return out


LEAVES = _leaves(cli.build_parser())


def test_the_walk_sees_every_subcommand() -> None:
    names = {" ".join(p) for p, _ in LEAVES}
    assert {"stack up", "stack down", "run", "series", "report", "faults", "bench harness",
            "bench options", "stack debezium"} <= names


def _cases() -> list[tuple[str, list[str]]]:
    cases = []
    for path, parser in LEAVES:
        for a in parser._actions:
            if not a.option_strings or a.nargs == 0 or a.dest == "help":
                continue
            if a.type is not None and a.type is not str:
                cases += [(f"{' '.join(path)} {a.option_strings[0]} {v}",
                           [*path, *_required(parser), a.option_strings[0], v]) for v in BAD_NUMBERS]
            elif a.choices:
                cases.append((f"{' '.join(path)} {a.option_strings[0]} bad",
                              [*path, *_required(parser), a.option_strings[0], "no-such-choice"]))
    return cases


CASES = _cases()


def test_every_number_option_is_walked() -> None:
    numeric = {c.split()[-2] for c, _ in CASES}
    assert {"--cooldown-s", "--drain-timeout-s", "--idle-s", "--repeats", "--messages", "--rate",
            "--seed", "--senders", "--step-s", "--consumers"} <= numeric


@pytest.mark.parametrize(("label", "argv"), CASES, ids=[c for c, _ in CASES])
def test_bad_value_is_refused_in_one_line(label: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert argv[-2] in err and "Traceback" not in err
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(("argv", "says"), [
    (["--fault", "reboot@1s"], "unknown fault kind 'reboot'"),
    (["--fault", "consumer-dead:1@1s"], "consumer-dead needs +DURATION"),
    (["--fault", "consumer-kill:3@1s", "--consumers", "2"], "no consumer 3 among 2"),
    (["--fault", "debezium-kill@1s", "--pipeline", "wal"], "debezium-kill needs Debezium and a broker"),
    (["--fault", "slot-invalidation@1s", "--pipeline", "rabbitmq"], "slot-invalidation needs a direct reader's slot"),
    (["--fault", "broker-node-kill@1s", "--pipeline", "kafka"], "broker-node-kill needs the ha topology"),
    (["--fault", "postgres-failover@1s", "--topology", "single"], "postgres-failover needs the ha topology"),
])
def test_a_fault_that_does_not_apply_is_refused_in_one_line_before_the_stack(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import lab.runner

    started: list[object] = []
    monkeypatch.setattr(lab.runner, "run_scenario", lambda *a, **kw: started.append(a))
    monkeypatch.setenv("LAB_STACK_DIR", str(tmp_path))
    monkeypatch.setenv("LAB_TOPOLOGY", "single")
    assert cli.main(["run", "--messages", "10", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err, err
    assert not started  # refused before the run (and its stack) started


@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-5", "0"])
def test_number_type_refuses_non_finite_and_out_of_range(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=value.replace("+", r"\+")):
        cli.number(float, 0, 100, low_open=True)(value)
    assert cli.number(float, 0, 100)("2.5") == 2.5 and math.isfinite(cli.DURATION("0"))


def test_a_port_out_of_range_and_a_corrupt_run_json_end_in_one_line(tmp_path: object) -> None:
    """Through the real console entry point, in a subprocess: exit status, one line, no traceback."""
    from pathlib import Path

    base = Path(str(tmp_path))
    env = {**os.environ, "LAB_STACK_DIR": str(base / "stack"), "LAB_DATA_DIR": str(base / "data")}
    port = subprocess.run([sys.executable, "-m", "lab", "stack", "status"], env={**env, "LAB_PG_PORT": "70000"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert port.returncode == 2 and port.stderr.strip().splitlines() == [
        "lab: error: LAB_PG_PORT=70000: a TCP port is between 1 and 65535"]
    size = subprocess.run([sys.executable, "-m", "lab", "stack", "status"], env={**env, "LAB_MIN_FREE_DISK": "lots"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert size.returncode == 2 and size.stderr.strip().splitlines() == [
        "lab: error: LAB_MIN_FREE_DISK='lots' is not a size like 2GB, 512MB or 1048576"]
    run_dir = base / "data" / "runs" / "x"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run_id": "x", "scen')  # cut off mid-write
    from lab.results import iter_runs
    from lab.settings import Settings

    with pytest.raises(ValueError, match=r"runs/x/run.json is corrupt"):
        list(iter_runs(settings=Settings().replace(data_dir=base / "data")))


@pytest.mark.parametrize("steps", ["100,1e308", "nan", "5,inf"])
def test_rate_steps_checks_each_rate(steps: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cli.rate_steps(steps)


@pytest.mark.parametrize("command", [["stack", "down"], ["stack", "up"], ["stack", "status"]])
def test_a_stack_dir_that_cannot_be_used_is_one_line(tmp_path: object, command: list[str]) -> None:
    """A stack dir that is a file (as root, the way one owned by another user fails otherwise)."""
    from pathlib import Path

    stack = Path(str(tmp_path)) / "stack"
    stack.write_text("not a dir")
    env = {**os.environ, "LAB_STACK_DIR": str(stack), "LAB_DATA_DIR": str(Path(str(tmp_path)) / "data")}
    done = subprocess.run([sys.executable, "-m", "lab", *command], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(stack) in done.stderr, done.stderr


def test_consumer_counts_are_distinct_n_within_bounds() -> None:
    assert cli.consumer_counts(" 1, 4,4,16 ") == (1, 4, 16)
    for bad in ("", ",", "0", "x", "1,nan", str(10**6)):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.consumer_counts(bad)


@pytest.mark.parametrize("command", [
    ["run", "--pipeline", "wal", "--consumers", "1", "--messages", "10"],
    ["stack", "debezium", "start", "kafka"],
])
def test_a_command_that_reaches_the_services_refuses_while_the_netns_layout_is_not_up(
        command: list[str], capsys: pytest.CaptureFixture[str], tmp_path: object,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import lab.runner
    from lab.stack import hosts

    started: list[object] = []
    monkeypatch.setattr(lab.runner, "run_scenario", lambda *a, **kw: started.append(a))
    monkeypatch.setenv("LAB_STACK_DIR", str(tmp_path))  # a stack whose layout was never made
    monkeypatch.setenv("LAB_HOSTS", "netns")
    monkeypatch.setattr(cli, "get_settings", Settings.from_env)  # not the process's cached settings
    assert cli.main(command) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"lab: error: {hosts.NOT_UP}"]
    assert not started


def test_a_non_finite_vary_value_is_refused_in_one_line_before_any_run(
        capsys: pytest.CaptureFixture[str], tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lab bench options --vary cooldown_s=0,inf`: the values are not the options' own argparse
    types, so the scenario refuses inf, and before the first value's runs."""
    import lab.study.options

    started: list[object] = []

    async def never(*args: object, **kwargs: object) -> dict[str, object]:
        started.append(args)
        raise AssertionError("a run started")

    monkeypatch.setattr(lab.study.options, "run_scenario", never)
    monkeypatch.setenv("LAB_STACK_DIR", str(tmp_path))
    monkeypatch.setattr(cli, "get_settings", Settings.from_env)
    assert cli.main(["bench", "options", "--vary", "cooldown_s=0,inf", "--messages", "10"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "lab: error: cooldown_s must be a finite number, got inf"]
    assert not started


def test_verbose_shows_the_traceback_of_an_unexpected_error(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-v` promises the traceback of an error the lab does not recognise (exit status 1): it is logged
    at INFO, the level `-v` sets (WARNING without it, which keeps the one line alone)."""
    import logging

    def boom(args: object, settings: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli.stack, "_stack_status", boom)  # the handler `lab stack status` is built with
    caplog.set_level(logging.DEBUG, logger="lab.cli")
    assert cli.main(["-v", "stack", "status"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == ["lab: error: RuntimeError: boom"]
    [record] = [r for r in caplog.records if r.name == "lab.cli" and r.exc_info]
    assert record.levelno == logging.INFO and record.exc_info[0] is RuntimeError  # type: ignore[index]
