"""Every secret file is created with its final mode: never written wider and narrowed after.

A subprocess (audit hooks cannot be removed) sets umask 0, so a file created with the default
mode would be world-readable, and records every ``os.chmod`` and every write-mode ``open()``;
then it writes the stack's secrets, the pgpass and AMQP URL files, a single node's and a
cluster's Erlang cookie and RabbitMQ's definitions (a password hash).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import json, os, sys
from pathlib import Path
events = []
def hook(event, args):
    if event == "os.chmod":
        events.append(["chmod", str(args[0])])
    elif event == "open" and isinstance(args[1], str) and any(c in args[1] for c in "wax+"):
        events.append(["open", str(args[0])])
sys.addaudithook(hook)
os.umask(0)
from lab.settings import Settings
from lab.stack.rabbitmq_broker import RabbitMQService, write_cookie
base = Path(sys.argv[1])
s = Settings().replace(stack_dir=base / "stack", data_dir=base / "data")
s.connect_env()  # secrets.json, pgpass, amqp-url
RabbitMQService(s)._write_config()  # definitions.json, the node's cookie
write_cookie(base / "stack" / "node2" / ".erlang.cookie", "COOKIE")
write_cookie(base / "stack" / "node2" / ".erlang.cookie", "OTHER")  # replaced: a new file again
print(json.dumps(events))
"""


def test_secrets_are_created_with_their_final_mode(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    env.pop("LAB_PG_PASSWORD", None)
    env.pop("LAB_RABBITMQ_PASSWORD", None)
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    events = json.loads(res.stdout.strip().splitlines()[-1])
    stack = tmp_path / "stack"
    expected = {stack / "secrets" / "secrets.json": 0o600, stack / "secrets" / "pgpass": 0o600,
                stack / "secrets" / "amqp-url": 0o600, stack / "node2" / ".erlang.cookie": 0o400}
    expected |= {p: 0o600 for p in stack.rglob("definitions.json")}
    expected |= {p: 0o400 for p in stack.rglob(".erlang.cookie")}
    assert len(expected) == 6, sorted(map(str, expected))
    for path, mode in expected.items():
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
        touched = [e for e in events if Path(e[1]).name == path.name
                   or Path(e[1]).name.startswith(f".{path.name}.")]
        assert not [e for e in touched if e[0] == "chmod"], (path, touched)
        assert not [e for e in touched if e[0] == "open"], (path, touched)  # only os.open with its mode
    assert (stack / "node2" / ".erlang.cookie").read_text() == "OTHER"
    assert not list(stack.rglob("*.tmp"))
