"""Every unit test reads the settings from its own environment, on a stack directory not the user's.

``lab.settings.get_settings`` reads the environment once per process. Without this fixture the
first test that calls it fixes the settings for every later one: a test that sets
``LAB_STACK_DIR`` and then calls ``lab.cli.main`` would take the lock of the user's own stack
(``.stack/run.lock``), and fail whenever a ``lab`` command holds it there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.settings import get_settings


@pytest.fixture(autouse=True)
def _settings_of_this_test(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LAB_STACK_DIR", str(tmp_path_factory.getbasetemp() / "stack"))  # a test may set its own
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
