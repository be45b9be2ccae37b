"""A consumer stops promptly on SIGTERM even when its broker no longer answers.

The consumer reaches RabbitMQ through a TCP relay that the test freezes: the connection stays
open but nothing comes back, as with a hung or vanished broker. Closing the AMQP channel then
waits for an answer that never comes; the consumer must still exit within its bounds and
write its result.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab.consumer import CLOSE_TIMEOUT_S, STOP_GRACE_S
from lab.pipelines.rabbitmq import RabbitPipeline
from lab.scenario import Scenario
from lab.settings import Settings
from tests.conftest import lab_env

pytestmark = pytest.mark.integration


class Relay:
    """127.0.0.1:<port> → 127.0.0.1:<target>; while ``frozen`` it holds every byte."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.frozen = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.target))
            self.socks += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.05)
                b.sendall(data)
        except OSError:
            return

    def close(self) -> None:
        self.frozen.clear()
        for s in self.socks:
            s.close()


def test_sigterm_with_a_hung_broker(stack: object, settings: Settings, tmp_path: Path) -> None:
    scenario = Scenario(pipeline="rabbitmq", consumers=1, messages=10)
    pipeline = RabbitPipeline(scenario, settings, stack)
    asyncio.run(pipeline.prepare())
    relay = Relay(settings.amqp_port)
    argv = [sys.executable, "-m", "lab.consumer", "--pipeline", "rabbitmq", "--index", "0",
            "--run-dir", str(tmp_path), "--scenario", json.dumps(scenario.as_parameters())]
    consumer = subprocess.Popen(argv, env=lab_env(settings.replace(amqp_port=relay.port)),
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "consumer-0.ready").exists():
            assert consumer.poll() is None, consumer.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        relay.frozen.set()  # the broker stops answering; the connection stays open
        time.sleep(1.0)
        t0 = time.monotonic()
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(timeout=STOP_GRACE_S + 10)
        took = time.monotonic() - t0
    finally:
        if consumer.poll() is None:
            consumer.kill()
        relay.close()
        asyncio.run(pipeline.teardown())
    assert took < STOP_GRACE_S + 2, f"took {took:.1f} s"
    result = json.loads((tmp_path / "consumer-0.json").read_text())
    assert result["index"] == 0 and result["processed"] == 0
    sys.stderr.write(f"\n[consumer stop] SIGTERM to exit with a hung broker: {took:.1f} s "
                     f"(close bound {CLOSE_TIMEOUT_S:.0f} s, hard bound {STOP_GRACE_S:.0f} s)\n")
