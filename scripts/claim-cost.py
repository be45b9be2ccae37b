"""Happy-path cost of one inbox claim statement (100 new ids), owner against takeover (issue 14):
the claiming backend's CPU (psutil, user+system) over alternating blocks of statements; ids from 1.5e9, deleted after."""
import asyncio, statistics, sys, time
import psutil, psycopg
from lab.settings import get_settings
from lab.workload.inbox import claim_ids, take_lease

BLOCKS, PER_BLOCK, BATCH, BASE = int(sys.argv[1]) if len(sys.argv) > 1 else 20, 200, 100, 1_500_000_000

async def main() -> None:
    s = get_settings()
    async with await psycopg.AsyncConnection.connect(s.pg_dsn, autocommit=True) as c:
        backend = psutil.Process(c.info.backend_pid)
        me = await take_lease(c, "bench-0")
        await c.execute("DELETE FROM inbox WHERE id >= %s", (BASE,))
        cpu = {"owner": [], "takeover": []}
        wall = {"owner": [], "takeover": []}
        n = BASE
        for b in range(BLOCKS):
            for mode in (("owner", "takeover") if b % 2 == 0 else ("takeover", "owner")):
                t0, c0 = time.perf_counter(), sum(backend.cpu_times()[:2])
                for _ in range(PER_BLOCK):
                    ids = list(range(n, n + BATCH)); n += BATCH
                    won = await claim_ids(c, ids, "bench-0" if mode == "owner" else me, takeover=mode == "takeover")
                    assert len(won) == BATCH
                cpu[mode].append((sum(backend.cpu_times()[:2]) - c0) / (PER_BLOCK * BATCH) * 1e6)
                wall[mode].append((time.perf_counter() - t0) / (PER_BLOCK * BATCH) * 1e6)
        await c.execute("DELETE FROM inbox WHERE id >= %s", (BASE,))
    for mode in cpu:
        print(f"{mode:9s} backend CPU us/msg median {statistics.median(cpu[mode]):.2f} "
              f"(blocks {min(cpu[mode]):.2f}..{max(cpu[mode]):.2f}), wall us/msg median {statistics.median(wall[mode]):.2f}")
    print("loadavg", psutil.getloadavg())

asyncio.run(main())
