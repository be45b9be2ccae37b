"""Disk bytes per participant (lab.measure.diskio): the parsers, the window's differences, the
io controller's refusal, run.json's ``disk`` block, and one window over real processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lab.measure.diskio import (
    DiskWindow,
    cgroup_parents,
    consumer_bytes,
    delta,
    disk_block,
    enable_io,
    host_block,
    parse_diskstats,
    parse_io_stat,
    parse_proc_io,
    seen,
    tree,
    whole_disks,
)
from lab.measure.sampler import Participant

IO_STAT = """\
254:0 rbytes=4096 wbytes=1048576 rios=1 wios=16 dbytes=0 dios=0
253:0 rbytes=0 wbytes=8192 rios=0 wios=2 dbytes=0 dios=0
"""
PROC_IO = """\
rchar: 1685995
wchar: 3001854
syscr: 827
syscw: 31
read_bytes: 12288
write_bytes: 3002368
cancelled_write_bytes: 4096
"""


def test_io_stat_is_summed_over_devices() -> None:
    assert parse_io_stat(IO_STAT) == (1048576 + 8192, 4096)
    assert parse_io_stat("") == (0, 0)


def test_proc_io_writes_are_net_of_cancelled_writes() -> None:
    assert parse_proc_io(PROC_IO) == (3002368 - 4096, 12288)
    assert parse_proc_io("rchar: 1\n") == (0, 0)


def test_a_root_that_exited_keeps_its_last_reading_and_a_new_one_counts_from_zero() -> None:
    first = {"consumers": {"10:5": (100, 1)}, "postgres": {"1:1": (1_000, 0)}}
    inside = {"consumers": {"10:5": (600, 1)}, "postgres": {"1:1": (5_000, 0)}}
    end = {"consumers": {"11:9": (70, 0)}, "postgres": {"1:1": (9_000, 0)}}  # 10 exited, 11 replaced it
    last = seen(seen(seen({}, first), inside), end)
    assert last["consumers"] == {"10:5": (600, 1), "11:9": (70, 0)}
    assert delta(first["consumers"], last["consumers"]) == (500 + 70, 0)
    assert delta(first["postgres"], last["postgres"]) == (8_000, 0)


def test_a_tree_does_not_walk_into_another_participants_root() -> None:
    children = {1: [2, 3], 2: [4], 3: [5], 5: [6]}
    assert sorted(tree(1, children)) == [1, 2, 3, 4, 5, 6]
    assert sorted(tree(1, children, stop=[3, 1])) == [1, 2, 4]


def test_enable_io_says_why_when_the_kernel_does_not_offer_it(tmp_path: Path) -> None:
    parents = cgroup_parents(tmp_path, "stack-x")
    for p in parents:
        p.mkdir(parents=True, exist_ok=True)
        (p / "cgroup.controllers").write_text("cpu memory io\n")
        (p / "cgroup.subtree_control").write_text("cpu\n")
    assert enable_io(parents) is None  # a plain file takes the write: "+io" written at every level
    assert all((p / "cgroup.subtree_control").read_text() == "+io" for p in parents)
    (parents[0] / "cgroup.controllers").write_text("hugetlb\n")
    reason = enable_io(parents)
    assert reason is not None and "not offered" in reason and "hugetlb" in reason
    (parents[0] / "cgroup.controllers").write_text("io\n")
    (parents[1] / "cgroup.controllers").unlink()
    reason = enable_io(parents)
    assert reason is not None and reason.startswith("could not enable io")


def test_the_block_groups_the_consumers_and_divides_by_the_messages() -> None:
    counted = {"io_controller": "the io controller is not offered", "participants": {
        "postgres": {"write_bytes": 2_000_000, "read_bytes": 0, "method": "proc-io", "group": None,
                     "roots_exited": 0},
        "consumer-0": {"write_bytes": 300, "read_bytes": 0, "method": "proc-io", "group": "consumers",
                       "roots_exited": 1},
        "consumer-1": {"write_bytes": 700, "read_bytes": 10, "method": "proc-io", "group": "consumers",
                       "roots_exited": 0},
        "kafka": {"write_bytes": None, "read_bytes": None, "method": "not measured", "group": None},
    }}
    block = disk_block(counted, 1_000)
    assert block is not None
    assert block["postgres"] == {"write_bytes": 2_000_000, "read_bytes": 0, "write_bytes_per_msg": 2_000.0,
                                 "method": "proc-io", "roots_exited": 0}
    assert block["consumers"] == {"write_bytes": 1_000, "read_bytes": 10, "write_bytes_per_msg": 1.0,
                                  "method": "proc-io", "roots_exited": 1}
    assert block["kafka"]["write_bytes_per_msg"] is None and block["kafka"]["method"] == "not measured"
    assert "consumer-0" not in block
    assert consumer_bytes(counted, 1) == 700 and consumer_bytes(counted, 5) is None
    assert disk_block(None, 1_000) is None and disk_block(counted, 0) is None


def test_a_window_over_real_processes_counts_what_each_tree_wrote(tmp_path: Path) -> None:
    """A writer whose child writes and exits (reaped inside the tree), and an idle process."""
    script = (
        "import os, subprocess, sys, time\n"
        "open(sys.argv[1] + '.ready', 'w').close()\n"
        "while not os.path.exists(sys.argv[1] + '.go'): time.sleep(0.01)\n"
        "def write(path, n):\n"
        "    with open(path, 'wb') as f:\n"
        "        f.write(b'x' * n); f.flush(); os.fsync(f.fileno())\n"
        "write(sys.argv[1] + '.a', 3 << 20)\n"
        "subprocess.run([sys.executable, '-c', 'import os\\nwith open(%r, \"wb\") as f: f.write(b\"y\" * (2 << 20));"
        " f.flush(); os.fsync(f.fileno())' % (sys.argv[1] + '.b')], check=True)\n"
        "open(sys.argv[1] + '.done', 'w').close()\n"
        "time.sleep(30)\n"
    )
    base = tmp_path / "w"
    writer = psutil.Popen([sys.executable, "-c", script, str(base)])
    idle = psutil.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _wait(Path(f"{base}.ready"))
        window = DiskWindow([Participant("writer", [writer]), Participant("idle", [idle]),
                             Participant("probe", [idle])], "no cgroups")
        window.start()
        Path(f"{base}.go").touch()
        _wait(Path(f"{base}.done"))
        window.stop()
        rec = window.record()
    finally:
        for p in (writer, idle):
            p.kill()
            p.wait()
    if rec is not None and rec["participants"]["writer"]["write_bytes"] == 0:
        pytest.skip("this filesystem does not account write_bytes")  # e.g. tmpfs
    assert rec is not None and rec["io_controller"] == "no cgroups" and "probe" not in rec["participants"]
    w = rec["participants"]["writer"]
    assert w["method"] == "proc-io" and w["roots_exited"] == 0
    assert (5 << 20) <= w["write_bytes"] < (5 << 20) + (1 << 20)  # the child's 2 MB through its parent
    assert rec["participants"]["idle"]["write_bytes"] == 0


def _wait(path: Path, timeout: float = 20.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def test_the_runner_counts_its_own_threads_not_what_it_reaped(tmp_path: Path) -> None:
    me = psutil.Process()
    window = DiskWindow([Participant("runner", [me], recursive=False)], "no cgroups")
    window.start()
    code = (f"import os\nwith open({str(tmp_path / 'c')!r}, 'wb') as f: f.write(b'z' * (4 << 20)); "
            "f.flush(); os.fsync(f.fileno())")
    subprocess.run([sys.executable, "-c", code], check=True)
    window.stop()
    rec = window.record()
    assert rec is not None and rec["participants"]["runner"]["write_bytes"] < (1 << 20)


DISKSTATS = """\
   7       0 loop0 5 0 80 0 3 0 24 0 0 0 0 0 0 0 0 0 0
 254       0 vda 216278 34675 9544786 670634 309640 204522 26046504 1146287 0 167584 1907975 94522 99 13012880
 254       1 vda1 100 0 800 0 200 0 1600 0 0 0 0 0 0 0
 253       0 zram0 1 0 8 0 1 0 8 0 0 0 0 0 0 0
"""


def test_the_hosts_disks_are_its_whole_disks_in_512_byte_sectors() -> None:
    disks = whole_disks(["loop0", "vda", "zram0", "ram1", "nvme0n1"])
    assert disks == ["nvme0n1", "vda"]
    assert parse_diskstats(DISKSTATS, disks) == (26046504 * 512, 9544786 * 512)  # vda1 is a partition of vda
    counted = {"participants": {}, "host": {"write_bytes": 4_000_000, "read_bytes": 0}}
    assert host_block(counted, 1_000) == {"write_bytes": 4_000_000, "read_bytes": 0, "write_bytes_per_msg": 4000.0}
    assert host_block({"participants": {}, "host": None}, 1_000) is None and host_block(counted, 0) is None


def test_a_reading_that_fails_leaves_no_block_and_never_raises() -> None:
    def gone() -> list[psutil.Process]:
        raise psutil.NoSuchProcess(1)

    window = DiskWindow([Participant("postgres", gone)], "no cgroups")
    window.start()
    window.observe()
    window.stop()
    assert window.record() is None
