"""The cost in money: a price per million messages from what a run measured, and N* in money.

Three parts, each a price per million messages, every price a parameter (:class:`Prices`) with a
cited default (docs/method.md, "Cost in money"):

* **CPU**: CPU-seconds per message (per participant from ``cpu_s.<participant>``, in total from
  ``cpu_ms_per_msg``, the study's metric) times the on-demand price of one vCPU-second of a
  general-purpose instance (a busy core-second is billed as a vCPU-second: the instances are
  assumed sized to the load, with no idle headroom);
* **cross-zone transfer**: the bytes each hop carried per message (run.json's ``network``, under
  ``LAB_HOSTS=netns`` only; the columns ``net_bytes_per_msg_<from>_<to>``) on every hop whose two
  hosts are in different zones of a placement (:data:`ZONES`, a parameter; under the ``ha``
  topology a broker node's replication to its peers and the primary's WAL stream to its standby
  are such hops), times the price of a GB crossing zones (billed once leaving one zone and once
  entering the other);
* **disk writes**: the bytes written per message (``disk_write_bytes_per_msg``) times a price per
  GB written; general-purpose block storage includes its baseline I/O, so the default is 0 and
  a per-request storage (:data:`PER_REQUEST_STORAGE`) is the alternative.

N* in money is :func:`lab.study.crossover.crossings` on the runs with the study's metric replaced
by the price per million messages (:func:`money_runs`): the same models, the same intervals.
:func:`crossover_shift` sets N* in CPU beside N* in money with and without the transfer, and
under the placements of :data:`PLACEMENTS`, to show where cross-zone traffic moves it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from lab.study import crossover
from lab.study.costmodel import METRIC

MILLION = 1_000_000
GIB = 2**30  # the providers bill transfer and storage in GB of 2^30 bytes


@dataclass(frozen=True)
class Prices:
    """USD list prices (docs/method.md cites each default and the day it was read)."""

    vcpu_hour: float = 0.0816 / 2  # m7g.large, 2 vCPU, Linux on-demand, us-east-1: $0.0816 an hour
    cross_zone_gb: float = 0.01 + 0.01  # between availability zones: $0.01/GB out of one, $0.01/GB into the other
    disk_write_gb: float = 0.0  # gp3 block storage: 3,000 IOPS and 125 MiB/s included, no charge per write
    gb_bytes: int = GIB

    @property
    def vcpu_second(self) -> float:
        return self.vcpu_hour / 3600


#: A per-request storage: $0.20 per million I/O requests, a write billed per 4 KiB or part of it
#: (Aurora Standard, us-east-1), as a price per GB written in 4 KiB requests.
PER_REQUEST_STORAGE = Prices(disk_write_gb=0.20 / MILLION * GIB / 4096)

#: Default placement of the lab's hosts (``lab.stack.hosts``' groups) in zones: the database with
#: its CDC source and the web service in one, the brokers (Kafka's host ``broker``, RabbitMQ's
#: ``rabbitmq``) and the consumers in another. The ``ha`` topology's hosts are placed as a
#: multi-AZ deployment places them: the three nodes of each broker in three zones (``b``, ``c``,
#: ``a``), the standby in another zone than its primary (``b``), so that node-to-node replication
#: and the primary's WAL stream to the standby cross zones.
ZONES: Mapping[str, str] = {"postgres": "a", "debezium": "a", "web": "a", "broker": "b", "rabbitmq": "b",
                            "consumers": "b",
                            "broker-2": "c", "broker-3": "a", "rabbitmq-2": "c", "rabbitmq-3": "a",
                            "postgres-standby": "b"}

#: Placements compared by :func:`crossover_shift` besides :data:`ZONES`.
PLACEMENTS: Mapping[str, Mapping[str, str]] = {
    "one zone": {h: "a" for h in ZONES},
    "consumers beside the broker, away from the database": ZONES,
    "every host in a zone of its own": {h: str(i) for i, h in enumerate(ZONES)},
}


def cpu_per_million(cpu_ms_per_msg: float, prices: Prices = Prices()) -> float:
    """USD per million messages for ``cpu_ms_per_msg`` CPU-milliseconds per message."""
    return cpu_ms_per_msg / 1000 * prices.vcpu_second * MILLION


def crosses(pair: str, zones: Mapping[str, str]) -> bool:
    """Whether hop ``from>to`` (or ``from_to``) leaves its zone. A host the placement does not name
    (the runner, whose reads and resets are the lab's, not the pipeline's) is never priced."""
    a, _, b = pair.replace(">", "_").partition("_")
    return a in zones and b in zones and zones[a] != zones[b]


def transfer_by_hop(bytes_per_msg: Mapping[str, float], zones: Mapping[str, str] = ZONES,
                    prices: Prices = Prices()) -> dict[str, float]:
    """USD per million messages on each hop (``from>to`` -> bytes per message) that crosses zones
    under ``zones``; the hops that do not are left out."""
    return {pair: b / prices.gb_bytes * prices.cross_zone_gb * MILLION for pair, b in bytes_per_msg.items()
            if b and not math.isnan(b) and crosses(pair, zones)}


def transfer_per_million(bytes_per_msg: Mapping[str, float], zones: Mapping[str, str] = ZONES,
                         prices: Prices = Prices()) -> float:
    """USD per million messages for the bytes per message on each hop (``from>to`` -> bytes) that
    crosses zones under ``zones``."""
    return sum(transfer_by_hop(bytes_per_msg, zones, prices).values())


def disk_per_million(write_bytes_per_msg: float, prices: Prices = Prices()) -> float:
    """USD per million messages for the bytes written per message."""
    return write_bytes_per_msg / prices.gb_bytes * prices.disk_write_gb * MILLION


def _pairs(row: Mapping[str, object]) -> dict[str, float]:
    return {k.removeprefix("net_bytes_per_msg_"): float(v)  # type: ignore[arg-type]
            for k, v in row.items() if k.startswith("net_bytes_per_msg_") and v is not None}


def price_row(row: Mapping[str, object], prices: Prices = Prices(), zones: Mapping[str, str] = ZONES,
              participants: Iterable[str] = ()) -> dict[str, float | None]:
    """One run's price per million messages: ``cpu``, ``transfer`` (None without a network block),
    ``disk`` (None without a disk block), ``total`` (the parts that were measured) and
    ``cpu.<participant>`` for each of ``participants``."""
    cpu = cpu_per_million(float(row[METRIC]), prices)  # type: ignore[arg-type]
    pairs = _pairs(row)
    transfer = transfer_per_million(pairs, zones, prices) if pairs else None
    written = row.get("disk_write_bytes_per_msg")
    disk = disk_per_million(float(written), prices) if written is not None and not _nan(written) else None  # type: ignore[arg-type]
    out: dict[str, float | None] = {"cpu": cpu, "transfer": transfer, "disk": disk,
                                    "total": cpu + (transfer or 0.0) + (disk or 0.0)}
    messages = float(row.get("messages") or 0)  # type: ignore[arg-type]
    for p in participants:
        s = row.get(f"cpu_s.{p}")
        out[f"cpu.{p}"] = (cpu_per_million(float(s) * 1000 / messages, prices)  # type: ignore[arg-type]
                           if s is not None and not _nan(s) and messages else None)
    return out


def _nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def price_table(df: pd.DataFrame, prices: Prices = Prices(), zones: Mapping[str, str] = ZONES,
                participants: Iterable[str] = ()) -> pd.DataFrame:
    """:func:`price_row` for every run of ``df`` (same index), columns ``usd_per_million.<part>``."""
    parts = tuple(participants)
    rows = [price_row(r, prices, zones, parts) for r in df.to_dict("records")]
    return pd.DataFrame(rows, index=df.index).add_prefix("usd_per_million.")


def money_runs(df: pd.DataFrame, prices: Prices = Prices(), zones: Mapping[str, str] = ZONES,
               *, transfer: bool = True) -> pd.DataFrame:
    """``df`` with the study's metric replaced by each run's price per million messages (without
    the transfer when ``transfer`` is False), so that :mod:`lab.study.crossover` reads it."""
    if df.empty:
        return df
    table = price_table(df, prices, zones)
    total = table["usd_per_million.total"]
    if not transfer:
        total = total - table["usd_per_million.transfer"].fillna(0.0)
    return df.assign(**{METRIC: total})


def money_crossing(df: pd.DataFrame, direct: str, broker: str, prices: Prices = Prices(),
                   zones: Mapping[str, str] = ZONES, *, transfer: bool = True, condition: str = "",
                   n_boot: int = 500, seed: int = 0) -> crossover.Answer:
    """N* in money between ``direct`` and ``broker`` (:func:`lab.study.crossover.crossings`)."""
    return crossover.crossings(money_runs(df, prices, zones, transfer=transfer), direct, broker,
                               condition=condition, n_boot=n_boot, seed=seed)


def crossover_shift(df: pd.DataFrame, direct: str, broker: str, prices: Prices = Prices(),
                    placements: Mapping[str, Mapping[str, str]] = PLACEMENTS, *, n_boot: int = 200,
                    seed: int = 0) -> pd.DataFrame:
    """N* in CPU, in money without the transfer, and in money under each placement (its cross-zone
    transfer priced): one row per condition with the first model's N* (straight direct line, flat
    broker), the range over the models and whether the transfer was measured at all."""
    has_net = any(c.startswith("net_bytes_per_msg_") for c in df.columns)
    rows = []

    def add(condition: str, ans: crossover.Answer) -> None:
        first = ans.models[0].n_star if ans.models else None
        rng = ans.range
        rows.append({"condition": condition, "n_star": first, "lo": rng[0] if rng else None,
                     "hi": rng[1] if rng else None, "measured": ans.measured, "transfer_measured": has_net})

    add("CPU", crossover.crossings(df, direct, broker, condition="CPU", n_boot=n_boot, seed=seed))
    add("money, no transfer", money_crossing(df, direct, broker, prices, transfer=False, n_boot=n_boot, seed=seed))
    for name, zones in placements.items():
        add(f"money, {name}", money_crossing(df, direct, broker, prices, zones, n_boot=n_boot, seed=seed))
    return pd.DataFrame(rows, columns=["condition", "n_star", "lo", "hi", "measured", "transfer_measured"])


def with_prices(prices: Prices = Prices(), *, vcpu_hour: float | None = None, cross_zone_gb: float | None = None,
                disk_write_gb: float | None = None) -> Prices:
    """``prices`` with some prices changed (e.g. ``cross_zone_gb=0.0``)."""
    return Prices(vcpu_hour=prices.vcpu_hour if vcpu_hour is None else vcpu_hour,
                  cross_zone_gb=prices.cross_zone_gb if cross_zone_gb is None else cross_zone_gb,
                  disk_write_gb=prices.disk_write_gb if disk_write_gb is None else disk_write_gb,
                  gb_bytes=prices.gb_bytes)
