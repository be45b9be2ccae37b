"""Run results on disk: the only module that knows paths under ``data/``.

One directory per run, ``data/runs/<run-id>/``, holding ``run.json`` (self-describing: scenario,
pipeline settings, versions, window, counters, per-participant CPU and memory, success, error)
and ``samples.csv`` (the timeline). A run directory is written under a temporary name and
renamed into place, so a reader never sees half a run. Failed runs are stored like any other.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from lab.settings import Settings, get_settings

# run.json's shape. 2: ``cost_split`` (the window's CPU as F + c·M per participant and in total,
# lab.measure.steady) and ``postgres_backends`` (PostgreSQL's CPU by walsenders, claims, inserts,
# shards and the rest, lab.measure.pgbackends) added beside ``cpu_s``; everything of 1 is still
# there and read the same way. 3: a fault run's ``fault`` block says what the fault is beyond its
# kind (``family``, ``stops_service``, ``stops_source``, ``hit_consumers``: lab.faults), so that
# readers need not know kinds by name; everything of 2 is still there. 4: ``disk`` (bytes each
# participant wrote and read over the window, lab.measure.diskio), ``disk_io_controller`` and ``wal``
# (WAL generated over the window, lab.measure.walstats) and ``disk_host`` (the host's disks over
# the window); everything of 3 is still there.
SCHEMA_VERSION = 4
SAMPLE_COLUMNS = ("t", "participant", "cpu_s", "rss_mb")


def runs_dir(settings: Settings | None = None) -> Path:
    return (settings or get_settings()).data_dir / "runs"


def reports_dir(settings: Settings | None = None) -> Path:
    return (settings or get_settings()).data_dir / "reports"


def reference_dir(settings: Settings | None = None) -> Path:
    return (settings or get_settings()).data_dir / "reference"


def load_reference(name: str, *, settings: Settings | None = None) -> pd.DataFrame:
    """A published table, ``data/reference/<name>.csv`` (``#`` lines are its source notes).

    Looked up under the configured data dir first, then under the checkout's ``data/``, where the
    tables ship (a ``LAB_DATA_DIR`` elsewhere holds runs, not the published tables).
    """
    s = settings or get_settings()
    dirs = (reference_dir(s), s.root / "data" / "reference")
    for path in (d / f"{name}.csv" for d in dirs):
        if path.is_file():
            return pd.read_csv(path, comment="#")
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.csv")})
    choices = ", ".join(known) or "(none found)"
    raise ValueError(f"no reference table {name!r}: choose one of {choices}")


def report_dir(report_id: str, settings: Settings | None = None) -> Path:
    """Where one report goes: executed notebooks, ``report.html``, figures and tables."""
    return reports_dir(settings) / report_id


def latest_report(settings: Settings | None = None) -> Path | None:
    """The newest report folder that has its page (``report.html``), or None."""
    root = reports_dir(settings)
    pages = sorted(root.glob("*/report.html")) if root.is_dir() else []
    return pages[-1].parent if pages else None  # report ids start with their UTC timestamp


def site_dir(settings: Settings | None = None) -> Path:
    """Where ``lab site`` writes the static site by default (git-ignored, like the reports)."""
    return (settings or get_settings()).data_dir / "site"


def new_report_id(profile: str) -> str:
    """``<UTC timestamp>-<profile>-<4 hex>``, e.g. ``20261130T120000Z-quick-3f9a``: two reports
    started in the same second get two folders."""
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{profile}-{secrets.token_hex(2)}"


def new_run_id(pipeline: str, consumers: int) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{pipeline}-c{consumers}-{secrets.token_hex(2)}"


def write_run(
    run: Mapping[str, Any],
    samples: Iterable[Mapping[str, Any]] = (),
    *,
    settings: Settings | None = None,
) -> Path:
    """Write ``run.json`` and ``samples.csv`` atomically; returns the run directory."""
    final = runs_dir(settings) / str(run["run_id"])
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    payload = {"schema_version": SCHEMA_VERSION, **run}
    (tmp / "run.json").write_text(json.dumps(payload, indent=2, default=str, sort_keys=False))
    with open(tmp / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(samples)
    os.replace(tmp, final)
    return final


def sittings_dir(settings: Settings | None = None) -> Path:
    """``data/sittings``: one small record per sitting (lab.study.sitting), committed with the code."""
    return (settings or get_settings()).data_dir / "sittings"


def write_sitting(record: Mapping[str, Any], *, settings: Settings | None = None) -> Path:
    """``data/sittings/<id>.json`` (:func:`sitting_json`), written whole under a temporary name and
    renamed into place. A record of the same series, machine and first run as one already stored (a
    report that resumed a finished series and ran nothing new) replaces it under its id: the ledger
    never counts one sitting twice."""
    out = sittings_dir(settings)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{record['id']}.json"
    known = None if path.exists() else known_sitting(record, settings=settings)
    if known is not None:  # the same runs again (a report that resumed a finished series): one sitting, one record
        path = out / f"{known['id']}.json"
        record = {**record, "id": known["id"]}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(sitting_json(record), encoding="utf-8")
    tmp.replace(path)
    return path


def known_sitting(record: Mapping[str, Any], *, settings: Settings | None = None) -> dict[str, Any] | None:
    """The stored record of the same runs as ``record`` (same series, first run and machine id),
    under whatever id it was written: what a report that resumes its series finds of itself."""
    out = sittings_dir(settings)
    for old in sorted(out.glob("*.json")) if out.exists() else []:
        known = read_json(old)
        if (known.get("series_id"), known.get("started_at"), (known.get("machine") or {}).get("id")) == (
                record.get("series_id"), record.get("started_at"), (record.get("machine") or {}).get("id")):
            return known
    return None


def sitting_json(record: Mapping[str, Any]) -> str:
    """A record as JSON that reads in a diff: one top-level key a line, a list's items one a line,
    each item compact."""
    def one(v: Any) -> str:
        return json.dumps(v, sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    lines = []
    for key in sorted(record):
        v = record[key]
        if isinstance(v, list) and v:
            body = ",\n".join(f"  {one(x)}" for x in v)
            lines.append(f"{one(key)}: [\n{body}\n ]")
        else:
            lines.append(f"{one(key)}: {one(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def load_sittings(*, settings: Settings | None = None) -> list[dict[str, Any]]:
    """Every committed sitting record, oldest first."""
    root = sittings_dir(settings)
    records = [read_json(p) for p in sorted(root.glob("*.json"))] if root.exists() else []
    return sorted(records, key=lambda r: (str(r.get("started_at") or ""), str(r.get("id"))))


def idle_dir(settings: Settings | None = None) -> Path:
    return (settings or get_settings()).data_dir / "idle"


def write_idle(series_id: str, record: Mapping[str, Any], *, settings: Settings | None = None) -> Path:
    """Store a series' idle baseline (:mod:`lab.measure.idle`) as ``data/idle/<series-id>.json``, atomically."""
    if not series_id or "/" in series_id:
        raise ValueError(f"not a usable series id: {series_id!r}")
    path = idle_dir(settings) / f"{series_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"series_id": series_id, **record}, indent=2))
    os.replace(tmp, path)
    return path


def read_idle(series_id: str, *, settings: Settings | None = None) -> dict[str, Any] | None:
    """The stored idle baseline of a series, or None."""
    path = idle_dir(settings) / f"{series_id}.json"
    return read_json(path) if path.is_file() else None


def read_json(path: Path) -> Any:
    """A stored JSON file; a corrupt one (a disk filled mid-write, an edit) is a ValueError naming it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is corrupt ({exc}): move it away or delete its run directory") from None


def read_run(run_id: str, *, settings: Settings | None = None) -> dict[str, Any]:
    return dict(read_json(runs_dir(settings) / run_id / "run.json"))


def read_samples(run_id: str, *, settings: Settings | None = None) -> pd.DataFrame:
    return pd.read_csv(runs_dir(settings) / run_id / "samples.csv")


def iter_runs(*, settings: Settings | None = None) -> Iterator[dict[str, Any]]:
    """Every stored run's ``run.json`` content, as written (in run-id order)."""
    root = runs_dir(settings)
    for path in sorted(root.glob("*/run.json")) if root.exists() else []:
        if not path.parent.name.endswith(".tmp"):
            yield read_json(path)


def _flatten(run: Mapping[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, value in run.items():
        if key in ("scenario", "counters"):
            row.update(value)
        elif (key in ("cpu_s", "mem_mb", "mem_mb_max", "latency_ms", "latency_from_due_ms", "speed")
              and isinstance(value, Mapping)):
            row.update({f"{key}.{k}": v for k, v in value.items()})
        elif key == "senders" and isinstance(value, Mapping):  # the senders' record: send times, p95, ...
            row.update({f"senders.{k}": v for k, v in value.items() if not isinstance(v, Mapping | list)})
        elif key == "idle" and isinstance(value, Mapping):
            row["cpu_ms_per_msg_net"] = value.get("cpu_ms_per_msg_net")
            row.update({f"idle_cpu_s.{k}": v for k, v in (value.get("idle_cpu_s") or {}).items()})
        elif key == "cost_split" and isinstance(value, Mapping) and isinstance(value.get("total"), Mapping):
            row.update({k: value["total"].get(k) for k in ("fixed_cpu_s", "steady_ms_per_msg", "unsplit_cpu_s")})
            for name, part in (value.get("participants") or {}).items():
                row[f"steady.{name}"], row[f"fixed.{name}"] = part.get("steady_ms_per_msg"), part.get("fixed_cpu_s")
        elif key == "postgres_backends" and isinstance(value, Mapping):
            row.update({f"pg.{k}": v for k, v in (value.get("cpu_s") or {}).items()})
        elif key == "disk" and isinstance(value, Mapping):  # lab.measure.diskio
            row.update(disk_columns(value))
        elif key == "disk_host" and isinstance(value, Mapping):  # the host's disks over the window
            row["disk_host_write_bytes_per_msg"] = value.get("write_bytes_per_msg")
        elif key == "wal" and isinstance(value, Mapping):  # lab.measure.walstats
            row.update({"wal_bytes_per_msg": value.get("per_msg"),
                        "wal_stats_bytes_per_msg": value.get("stats_per_msg"),
                        "wal_records_per_msg": value.get("records_per_msg"),
                        "wal_fpi_per_msg": value.get("fpi_per_msg")})
        elif key == "network" and isinstance(value, Mapping):  # lab.measure.network, LAB_HOSTS=netns
            row.update({f"net_bytes_per_msg_{pair.replace('>', '_')}": v.get("bytes_per_msg")
                        for pair, v in (value.get("pairs") or {}).items()})
            row.update({"link_delay_ms": value.get("link_delay_ms"),
                        "link_delay_mechanism": value.get("link_delay_mechanism"),
                        "delayer_cpu_s": value.get("delayer_cpu_s")})
        elif key == "slots" and isinstance(value, Mapping):
            row["decoded_mb"] = sum(v.get("total_bytes") or 0 for v in value.values()) / 2**20
            row["slots"] = len(value)
        elif not isinstance(value, Mapping | list):
            row[key] = value
    if isinstance(run.get("consumer_layout"), str):  # what ran, over the scenario's (maybe "auto")
        row["consumer_layout"] = run["consumer_layout"]
    return row


def disk_columns(disk: Mapping[str, Any]) -> dict[str, Any]:
    """run.json's ``disk`` as columns: ``disk_write_bytes_per_msg_<participant>`` and
    ``disk_read_bytes_<participant>`` for every participant read, their sum
    ``disk_write_bytes_per_msg`` (None when a participant was not measured) and ``disk_method``
    (the participants' methods, ``+``-joined)."""
    row: dict[str, Any] = {}
    total: float | None = 0.0
    methods = set()
    for name, v in disk.items():
        if not isinstance(v, Mapping):
            continue
        per = v.get("write_bytes_per_msg")
        row[f"disk_write_bytes_per_msg_{name}"] = per
        row[f"disk_read_bytes_{name}"] = v.get("read_bytes")
        if v.get("method") == "not measured":
            continue  # a container: nothing read, not in the sum
        methods.add(str(v.get("method")))
        total = total + per if total is not None and per is not None else None
    row["disk_write_bytes_per_msg"] = round(total, 1) if total is not None else None
    row["disk_method"] = "+".join(sorted(methods)) or None
    return row


def load_runs(*, settings: Settings | None = None, include_failed: bool = True) -> pd.DataFrame:
    """All stored runs, one row each: scenario fields, counters, ``cpu_s.<participant>``, the cost
    split (``steady_ms_per_msg``, ``fixed_cpu_s``, ``steady.<participant>``, ``fixed.<participant>``),
    ``senders.<field>`` (send times, ``send_p95_ms``, ...), the bytes per message: disk
    (:func:`disk_columns`), WAL (``wal_bytes_per_msg`` from the LSN distance,
    ``wal_stats_bytes_per_msg`` from ``pg_stat_wal``, ``wal_records_per_msg``, ``wal_fpi_per_msg``)
    and, under ``LAB_HOSTS=netns``, per pair of hosts ``net_bytes_per_msg_<from>_<to>`` with
    ``link_delay_ms``, ``link_delay_mechanism`` and ``delayer_cpu_s`` (the userspace delayer's), ...

    Sorted by start time. Empty (with no columns) when there are no runs.
    """
    root = runs_dir(settings)
    rows = []
    for path in sorted(root.glob("*/run.json")) if root.exists() else []:
        if path.parent.name.endswith(".tmp"):
            continue
        rows.append(_flatten(read_json(path)))
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    if not include_failed:
        df = df[df["success"]]
    return df.sort_values("started_at").reset_index(drop=True)
