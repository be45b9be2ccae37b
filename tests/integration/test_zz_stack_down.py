"""Runs last: `lab stack down` stops every process of the session's stack, by pid."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from lab.settings import Settings
from tests.conftest import lab_env

pytestmark = pytest.mark.integration


def test_down_leaves_no_process_of_ours(stack: object, settings: Settings) -> None:
    env = lab_env(settings)
    status = json.loads(subprocess.run([sys.executable, "-m", "lab", "stack", "status", "--json"],
                                       env=env, capture_output=True, text=True, check=True).stdout)
    roots = [psutil.Process(pid) for r in status for pid in r["pids"]]
    tree = roots + [c for p in roots for c in p.children(recursive=True)]
    assert len(tree) > 5
    res = subprocess.run([sys.executable, "-m", "lab", "stack", "down"], env=env,
                         capture_output=True, text=True, check=False, timeout=180)
    assert res.returncode == 0, res.stderr
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == []
    status = json.loads(subprocess.run([sys.executable, "-m", "lab", "stack", "status", "--json"],
                                       env=env, capture_output=True, text=True, check=True).stdout)
    assert all(r["state"] == "stopped" for r in status)
