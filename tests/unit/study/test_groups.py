from __future__ import annotations

import pandas as pd
import pytest

from lab.study import costmodel, groups


def runs(**over: object) -> pd.DataFrame:
    base = dict(run_id=["r1", "r2", "r3"], pipeline="wal", consumers=[1, 2, 4], messages=5000, reset="discard",
                consumer_layout="processes", backend="native", fault="",
                senders=200, batch_size=100, rate=0.0, work_delay_ms=0.0, producer="web",
                cpu_method="cgroup", cpu_ms_per_msg=[1.0, 1.5, 2.5], success=True, warmup=False,
                series_id="s1", started_at=["2026-12-01T01", "2026-12-01T02", "2026-12-01T03"])
    return pd.DataFrame({**base, **over})


def test_runs_of_different_cpu_methods_are_never_pooled() -> None:
    df = runs(cpu_method=["cgroup", "proc-ticks", "cgroup"])
    with pytest.raises(groups.NotComparable) as err:
        costmodel.measured(df)
    msg = str(err.value)
    assert "\n" not in msg and "CPU by cgroup, " in msg and "CPU by proc-ticks, " in msg
    assert msg.index("CPU by cgroup") < msg.index("(2 runs)") < msg.index("CPU by proc-ticks") < msg.index("(1 runs)")
    assert len(costmodel.measured(df[df["cpu_method"] == "cgroup"])) == 2


@pytest.mark.parametrize("column,values", [("messages", [5000, 5000, 20000]), ("rate", [0.0, 0.0, 500.0]),
                                           ("work_delay_ms", [0.0, 5.0, 0.0]), ("senders", [200, 50, 200]),
                                           ("reset", ["discard", "none", "discard"]),
                                           ("consumer_layout", ["processes", "tasks", "processes"]),
                                           ("claim", ["owner", "takeover", "owner"]),
                                           ("claim_retention", ["never", "behind-slots", "never"]),
                                           ("backend", ["native", "compose", "native"]),
                                           ("fault", ["", "consumer-kill:1@3s", ""]),
                                           ("topology", ["single", "ha", "single"])])
def test_every_comparability_key_splits_groups(column: str, values: list) -> None:
    with pytest.raises(groups.NotComparable, match="refusing to pool"):
        costmodel.headline(runs(**{column: values}))


def test_runs_stored_before_topology_count_as_single_and_ha_is_named() -> None:
    assert len(costmodel.measured(runs(topology=[None, "single", None]))) == 3
    with pytest.raises(groups.NotComparable) as err:
        costmodel.measured(runs(topology=[None, "ha", "single"]))
    assert "ha topology" in str(err.value) and "single topology" in str(err.value)


def test_failed_and_warmup_runs_do_not_decide_the_group() -> None:
    df = runs(messages=[1000, 5000, 5000], warmup=[True, False, False])
    assert len(costmodel.measured(df)) == 2
    picked, name = groups.select(df)
    assert len(picked) == 3 and name == ("series s1: web producer, closed loop, no work delay, 5000 messages, "
                                         "200 senders, batch 100, CPU by cgroup, discard on reuse, "
                                         "consumers as processes, native stack, no fault")


def test_default_selection_is_the_newest_series_or_one_line_listing_the_groups() -> None:
    old = runs(series_id="old", messages=20000, cpu_method=None)
    new = runs(series_id="new", run_id=["n1", "n2", "n3"],
               started_at=["2026-12-02T01", "2026-12-02T02", "2026-12-02T03"])
    picked, name = groups.select(pd.concat([old, new]))
    assert set(picked["run_id"]) == {"n1", "n2", "n3"} and name.startswith("series new:")
    picked, name = groups.select(pd.concat([old, new]), "old")
    assert "20000 messages" in name and "CPU by unrecorded" in name
    mixed = pd.concat([old.assign(series_id="new"), new])
    with pytest.raises(groups.NotComparable, match=r"20000 messages.*\(3 runs\); .*5000 messages"):
        groups.select(mixed)
    with pytest.raises(ValueError, match="no runs stored for series 'nope'"):
        groups.select(new, "nope")


def test_tables_without_the_columns_are_one_group() -> None:
    published = costmodel.published_runs()
    assert len(costmodel.measured(published)) == 16


def test_runs_with_their_claims_pruned_are_a_group_of_their_own() -> None:
    assert len(costmodel.measured(runs(claim_retention=[None, "never", None]))) == 3  # stored before: kept
    with pytest.raises(groups.NotComparable) as err:
        costmodel.measured(runs(claim_retention=["behind-slots", "never", "never"]))
    assert "claims pruned behind-slots" in str(err.value) and "claims kept" in str(err.value)


def test_runs_stored_before_a_field_count_as_the_old_behaviour() -> None:
    df = runs(reset=["discard", None, None])  # two runs from before the reset existed: no reset
    with pytest.raises(groups.NotComparable, match="no reset on reuse"):
        costmodel.headline(df)


def test_runs_of_the_old_harness_are_never_pooled_with_the_lean_one() -> None:
    from lab.workload import HARNESS

    df = runs(harness=[HARNESS, None, None])  # two runs from before the field: the old harness
    with pytest.raises(groups.NotComparable, match="harness: aiohttp senders"):
        costmodel.headline(df)
