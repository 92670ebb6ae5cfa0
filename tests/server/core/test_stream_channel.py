"""A stream's responses on their way to the transport (`streaming._Channel`, and `serve_stream` over it).

First in, first out; writers wait while the channel is full and no more than its limit ever waits; a writer
cancelled while it waits, even one already woken, never takes a place nor keeps another writer from one; a reader
waits while it is empty. Over a whole stream, a decoupled model whose responses are not read is held at the
channel's limit, and every response arrives once the reader reads again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from oip.server import InferRequest, InferResponse
from oip.server.core import streaming
from oip.server.core.streaming import Answer, _Channel, serve_stream

pytestmark = pytest.mark.anyio

GUARD = 5.0  # seconds: a hang guard, never a measure


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _settle() -> None:
    """Let every task that can run do so."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_writers_wait_while_full_and_items_keep_their_order() -> None:
    channel: _Channel[tuple[int, int]] = _Channel(4)
    put = [0, 0, 0]

    async def writer(number: int) -> None:
        for i in range(50):
            await channel.put((number, i))
            put[number] += 1

    writers = [asyncio.create_task(writer(n)) for n in range(3)]
    got: list[tuple[int, int]] = []
    while len(got) < 150:
        await _settle()
        assert sum(put) - len(got) <= 4  # never more than the limit waiting, however long the reader is away
        got.append(await asyncio.wait_for(channel.get(), GUARD))
    await asyncio.gather(*writers)
    assert sorted(got) == [(n, i) for n in range(3) for i in range(50)]
    for number in range(3):
        assert [i for n, i in got if n == number] == list(range(50))


async def test_a_reader_waits_until_an_item_comes() -> None:
    channel: _Channel[str] = _Channel(2)
    reader = asyncio.create_task(channel.get())
    await _settle()
    assert not reader.done()
    await channel.put("a")
    assert await asyncio.wait_for(reader, GUARD) == "a"


async def test_a_writer_cancelled_while_waiting_takes_no_place() -> None:
    channel: _Channel[str] = _Channel(1)
    await channel.put("a")
    b = asyncio.create_task(channel.put("b"))
    c = asyncio.create_task(channel.put("c"))
    await _settle()
    b.cancel()
    await _settle()
    assert await channel.get() == "a"
    await asyncio.wait_for(c, GUARD)
    assert await asyncio.wait_for(channel.get(), GUARD) == "c"
    assert b.cancelled()


async def test_a_writer_woken_then_cancelled_passes_its_place_on() -> None:
    channel: _Channel[str] = _Channel(1)
    await channel.put("a")
    b = asyncio.create_task(channel.put("b"))
    c = asyncio.create_task(channel.put("c"))
    await _settle()
    assert await channel.get() == "a"  # wakes b, which has not run yet
    b.cancel()  # before it takes the place
    await asyncio.wait_for(c, GUARD)  # the place went on to c
    assert await asyncio.wait_for(channel.get(), GUARD) == "c"
    assert b.cancelled()


async def test_a_decoupled_stream_not_read_is_held_at_the_limit_and_loses_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "_QUEUE", 8)
    made = 0

    async def responses() -> AsyncIterator[InferResponse]:
        nonlocal made
        for i in range(1000):
            made += 1
            yield InferResponse("m", "1", str(i))

    async def requests() -> AsyncIterator[InferRequest | Exception]:
        yield InferRequest("m")

    stream = serve_stream(requests(), lambda request: Answer(responses, decoupled=True))
    first = await asyncio.wait_for(anext(stream), GUARD)
    await _settle()
    assert first.id == "0"
    assert made <= 1 + 8 + 1  # the one read, the channel full, the one waiting for a place
    rest = [response async for response in stream]
    assert [r.id for r in rest] == [str(i) for i in range(1, 1000)]
