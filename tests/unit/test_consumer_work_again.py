"""A consumer's work call that timed out is made again (lab.consumer.Consumer.work_again), against a
real HTTP server on loopback: the first answers come after the client's deadline, like the answer
to a consumer that was SIGSTOPped across its deadline."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import aiohttp
from aiohttp import web

from lab.consumer import WORK_ATTEMPTS, Consumer


async def _exchange(late: int) -> tuple[SimpleNamespace, list[bytes], bool | BaseException]:
    seen: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.read())
        if len(seen) <= late:
            await asyncio.sleep(0.6)  # past the client's 0.2 s deadline
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/send-email", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    me = SimpleNamespace(work_retries=0)
    url = f"http://127.0.0.1:{port}/send-email"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as http:
            try:
                async with http.post(url, data=b'{"id": 7}') as resp:  # the first call, as run() makes it
                    await resp.read()
                outcome: bool | BaseException = True
            except TimeoutError:
                try:
                    outcome = await Consumer.work_again(me, http.post, url, b'{"id": 7}')  # type: ignore[arg-type]
                except TimeoutError as exc:
                    outcome = exc
    finally:
        await runner.cleanup()
    return me, seen, outcome


def test_a_timed_out_work_call_is_made_again_and_counted() -> None:
    me, seen, outcome = asyncio.run(_exchange(late=1))
    assert outcome is True and me.work_retries == 1
    assert seen == [b'{"id": 7}', b'{"id": 7}']  # the same message twice: at-least-once


def test_work_calls_give_up_after_the_last_attempt() -> None:
    me, seen, outcome = asyncio.run(_exchange(late=WORK_ATTEMPTS))
    assert isinstance(outcome, TimeoutError)
    assert len(seen) == WORK_ATTEMPTS and me.work_retries == WORK_ATTEMPTS - 1


def test_an_answer_in_time_is_not_repeated() -> None:
    me, seen, outcome = asyncio.run(_exchange(late=0))
    assert outcome is True and me.work_retries == 0 and len(seen) == 1
