"""wal-filtered's publications: names, row filters and the split they make, without a server."""

from __future__ import annotations

import pytest

from lab.pipelines.wal import PUBLICATION
from lab.pipelines.wal_filtered import (
    PUBLICATION_PREFIX,
    FilteredWalPipeline,
    FilteredWalSource,
    create_publication,
    publication_name,
    row_filter,
    share,
)
from lab.scenario import Scenario
from lab.settings import Settings
from lab.stack.native import NativeStack


def test_publication_names_are_per_split_and_share() -> None:
    assert publication_name(4, 0) == "filtered_pub_n4_k0"
    assert publication_name(16, 15) == "filtered_pub_n16_k15"
    names = {publication_name(n, k) for n in (1, 2, 4, 16) for k in range(n)}
    assert len(names) == 1 + 2 + 4 + 16  # no two splits share a publication
    assert all(name.startswith(PUBLICATION_PREFIX) for name in names)
    assert not PUBLICATION.startswith(PUBLICATION_PREFIX)  # dropping the splits never drops wal's


@pytest.mark.parametrize(("n", "k"), [(4, 4), (4, -1), (1, 1)])
def test_a_consumer_outside_the_split_has_no_publication(n: int, k: int) -> None:
    with pytest.raises(ValueError, match="no consumer"):
        publication_name(n, k)


def test_the_statement_quotes_names_and_filters_on_the_key() -> None:
    assert row_filter(4, 1).as_string(None) == '("id" % 4 = 1)'
    assert create_publication(4, 1).as_string(None) == (
        'CREATE PUBLICATION "filtered_pub_n4_k1" FOR TABLE "messages" WHERE ("id" % 4 = 1)')


@pytest.mark.parametrize("n", [1, 2, 3, 4, 16])
def test_the_shares_partition_the_ids(n: int) -> None:
    ids = list(range(1, 1001))
    shares = [share(ids, n, k) for k in range(n)]
    assert sorted(i for s in shares for i in s) == ids  # every id in exactly one share
    assert max(map(len, shares)) - min(map(len, shares)) <= 1  # consecutive ids: an even split


def test_each_source_streams_its_own_publication_and_slot() -> None:
    scenario = Scenario(pipeline="wal-filtered", consumers=4)
    sources = [FilteredWalSource(scenario, Settings(), k) for k in range(4)]
    assert [s.publication for s in sources] == [publication_name(4, k) for k in range(4)]
    assert [s.slot for s in sources] == [f"load_test_slot_{k}" for k in range(4)]


def test_describe_names_the_runs_publications_not_wals() -> None:
    settings = Settings()
    pipeline = FilteredWalPipeline(Scenario(pipeline="wal-filtered", consumers=2), settings, NativeStack(settings))
    d = pipeline.describe()
    assert d["publications"] == ["filtered_pub_n2_k0", "filtered_pub_n2_k1"]
    assert "publication" not in d and d["inbox"] == "inbox_wal" and d["row_filter"] == "id % 2 = k"
    assert not pipeline.capabilities.fan_out
