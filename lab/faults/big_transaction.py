"""``big-transaction[=ROWS]@T``: one transaction of ROWS (default 100,000) executions of the web
service's INSERT, pipelined. Its rows are messages too: the drain waits for its commit and for
them (:meth:`BigTransaction.added_ids`); its accounting (:meth:`BigTransaction.accounting`) says
how many were worked and when the last one was, after its commit."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

import psycopg

from lab.faults.base import BaseFault, FaultContext
from lab.scenario import FaultSpec
from lab.workload.web import INSERT_QUERY

BIG_TRANSACTION_ROWS = 100_000


@dataclass
class BigTransaction(BaseFault):
    kind: ClassVar[str] = "big-transaction"
    family: ClassVar[str] = "big_transaction"
    amount_help: ClassVar[str | None] = "=ROWS"
    adds_messages: ClassVar[bool] = True
    rows: int = BIG_TRANSACTION_ROWS
    ids: list[int] = field(default_factory=list, compare=False)  # its rows' ids, once committed
    committed_at: float | None = field(default=None, compare=False)  # the commit's wall time

    @classmethod
    def parse(cls, spec: FaultSpec) -> Self:
        rows = BIG_TRANSACTION_ROWS
        if spec.amount is not None:
            if not spec.amount.isdigit() or int(spec.amount) <= 0:
                raise ValueError(f"fault {spec.text!r}: big-transaction=ROWS needs a positive whole number")
            rows = int(spec.amount)
        return cls(spec.target, spec.start_s, spec.duration_s or 0.0, rows)

    def added_ids(self) -> list[int]:
        return self.ids

    async def inject(self, ctx: FaultContext) -> None:
        async with await psycopg.AsyncConnection.connect(ctx.settings.pg_dsn) as conn:
            ctx.state.event("big transaction begins", rows=self.rows)
            async with conn.transaction(), conn.cursor() as cur:
                await cur.executemany(INSERT_QUERY, [("helloworld",)] * self.rows, returning=True)
                ids = []
                while True:
                    ids += [r[0] for r in await cur.fetchall()]
                    if not cur.nextset():
                        break
        mono, self.committed_at, self.ids = time.monotonic(), time.time(), ids
        ctx.state.event("big transaction committed", at_mono=mono, at=self.committed_at, rows=len(ids),
                        first_id=min(ids), last_id=max(ids))

    def accounting(self, arrivals: Mapping[str, Any]) -> dict[str, Any]:
        """``big_transaction``: its rows, how many were worked, how long after the commit the last
        one first was (None unless all were) and how many were not."""
        if not self.ids:
            return {}
        mine, first = set(self.ids), dict[int, float]()
        for i, t in zip(arrivals["ids"], arrivals["t"], strict=True):
            if i in mine:
                first.setdefault(i, t)
        at, complete = self.committed_at, len(first) == len(mine)
        return {"big_transaction": {
            "rows": len(self.ids), "worked": len(first),
            "all_worked_after_s": round(max(first.values()) - at, 3) if at is not None and complete else None,
            "lost": len(mine) - len(first),
        }}
