"""``lab bench harness``: its web and senders run where a run's do, as a run's children do."""

from __future__ import annotations

from pathlib import Path

from lab.settings import Settings
from lab.study.harness import harness_commands


def test_under_the_netns_layout_the_web_listens_on_the_web_host_and_the_senders_reach_it_there() -> None:
    s = Settings(stack_dir=Path("/x/stack"), hosts="netns")
    for naive in (True, False):
        web, senders = harness_commands(s, 1000, 20, naive=naive)
        assert web[web.index("--host") + 1] == s.address("web") == s.web_host
        assert web[web.index("--port") + 1] == str(s.web_port)
        assert senders[senders.index("--url") + 1] == f"http://{s.address('web')}:{s.web_port}" == s.web_url
    web, senders = harness_commands(Settings(), 10, 2, naive=False, client="aiohttp", http="aiohttp")
    assert web[web.index("--host") + 1] == "127.0.0.1" and web[-2:] == ["--http", "aiohttp"]
    assert senders[-2:] == ["--client", "aiohttp"]

