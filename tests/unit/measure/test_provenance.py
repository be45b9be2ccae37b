from __future__ import annotations

import time
from pathlib import Path

from lab.measure.provenance import HostWindow, client_versions, git_state, provenance
from lab.pipelines.versions import broker_client_versions

ROOT = Path(__file__).resolve().parents[3]


def test_client_versions_name_every_library_on_the_measured_path() -> None:
    v = client_versions() | broker_client_versions()
    for name in ("python", "psycopg", "libpq", "aiohttp", "uvloop", "orjson", "confluent-kafka",
                 "librdkafka", "aio-pika", "aiormq"):
        assert v.get(name), name
    assert v["libpq"].count(".") == 1  # e.g. 17.5, not libpq's integer


def test_host_window_reads_steal_and_load_over_a_span() -> None:
    w = HostWindow()
    assert w.summary() == {}
    w.start()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # some busy time inside the span
        pass
    w.stop()
    s = w.summary()
    assert s["span_s"] >= 0.3 and s["busy_cpu_s"] > 0 and s["steal_cpu_s"] >= 0
    assert 0 <= s["steal_pct"] <= 100 and len(s["loadavg_end"]) == 3


def test_git_state_says_sha_and_dirty_or_none_outside_a_checkout(tmp_path: Path) -> None:
    here = git_state(ROOT)
    assert len(here["sha"]) == 40 and here["dirty"] in (True, False)
    assert git_state(tmp_path) == {"sha": None, "dirty": None}
    rec = provenance(root=tmp_path, cpu_method="schedstat", clients={}, services={}, window=HostWindow())
    assert rec["cpu_method"] == "schedstat" and rec["host"]["cpus"] >= 1 and rec["git_sha"] is None
