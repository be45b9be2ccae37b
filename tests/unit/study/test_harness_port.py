"""`lab bench harness` refuses a taken web port instead of timing someone else's web service."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from lab.settings import Settings
from lab.stack.base import StackError
from lab.study.harness import _inserts_only


def test_a_taken_web_port_is_refused_naming_its_pid(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        settings = Settings().replace(stack_dir=tmp_path / "stack", data_dir=tmp_path / "data", web_port=port)
        with pytest.raises(StackError, match=rf"port {port} .* taken by pid {os.getpid()}"):
            _inserts_only(settings, [], [], lambda out, path: 0.0, 1)
