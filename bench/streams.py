"""Large streams against a running OIP server, and what they cost the other requests: `streams` connections each
ask `generate_stream` of the example model `text_stream` for `words` words (one event per word) and read the events
as fast as the sockets give them (one thread for all, in 1 MiB reads), while one probe asks GET /v2/health/live
again and again on a connection of its own for `duration` seconds. Shared by the fault suite
(tests/server/process/test_faults.py) and run alone to measure how long a request waits behind the streams (the
probe's latencies).

    python bench/streams.py --rest 127.0.0.1:8000 [--streams 50] [--words 500000] [-d 10]   # one JSON object
"""

from __future__ import annotations

import argparse
import contextlib
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

PROBE_TIMEOUT = 30.0  # seconds one probe may wait for its answer before it counts as unanswered


@dataclass
class Readers:
    """The streams' sockets, read in one thread: the bytes and events each received, and whether it ended."""

    sockets: list[socket.socket]
    received: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.received = [0] * len(self.sockets)
        self.events = [0] * len(self.sockets)
        self.ended = [False] * len(self.sockets)

    def run(self) -> None:
        tails = [b""] * len(self.sockets)  # the last bytes of each stream: an event's mark split over two reads
        with selectors.DefaultSelector() as selector:
            for index, sock in enumerate(self.sockets):
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ, index)
            while not self.stop.is_set() and not all(self.ended):
                for key, _ in selector.select(0.1):
                    index = key.data
                    try:
                        data = self.sockets[index].recv(1 << 20)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data or data.endswith(b"0\r\n\r\n"):  # closed, or the chunked body's last chunk
                        self.ended[index] = True
                        selector.unregister(self.sockets[index])
                    self.received[index] += len(data)
                    seen = tails[index] + data
                    self.events[index] += seen.count(b"data: ") - tails[index].count(b"data: ")
                    tails[index] = seen[-5:]


def open_streams(rest: str, streams: int, words: int) -> list[socket.socket]:
    """`streams` connections, each having sent its generate_stream request for `words` words."""
    host, port = rest.rsplit(":", 1)
    body = json.dumps({"text_input": " ".join(["word"] * words)}).encode()
    head = (f"POST /v2/models/text_stream/generate_stream HTTP/1.1\r\nHost: {rest}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    out = []
    for _ in range(streams):
        sock = socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT)
        sock.sendall(head + body)
        out.append(sock)
    return out


def _live(sock: socket.socket, buffer: bytearray) -> bool:
    """One GET /v2/health/live on a kept-alive connection: whether `{"live":true}` came back."""
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: probe\r\n\r\n")
    while b'{"live":true}' not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return False
        buffer += chunk
    del buffer[:buffer.index(b'{"live":true}') + len(b'{"live":true}')]
    return True


def probe(rest: str, duration: float) -> tuple[list[float], bool]:
    """GET /v2/health/live one after another for `duration` seconds, on one connection: each answer's latency
    (seconds), and whether one went unanswered (within PROBE_TIMEOUT; the probing stops there)."""
    host, port = rest.rsplit(":", 1)
    latencies: list[float] = []
    with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT) as sock:
        buffer = bytearray()
        end = time.monotonic() + duration
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                answered = _live(sock, buffer)
            except OSError:  # timed out
                answered = False
            if not answered:
                return latencies, True
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
    return latencies, False


@contextlib.contextmanager
def streaming(rest: str, streams: int, words: int) -> Iterator[Readers]:
    """The streams, open and read in a thread for the length of the block; then closed."""
    readers = Readers(open_streams(rest, streams, words))
    thread = threading.Thread(target=readers.run, name="stream-readers", daemon=True)
    thread.start()
    try:
        yield readers
    finally:
        readers.stop.set()
        thread.join(5.0)
        for sock in readers.sockets:
            with contextlib.suppress(OSError):
                sock.close()


def probe_under_streams(rest: str, streams: int = 50, words: int = 500_000, duration: float = 10.0) -> dict[str, Any]:
    """Open the streams, probe for `duration` seconds while they run, then close them all. What was measured: the
    probes' latencies (ms: p50, p99, max), how many were answered and whether one went unanswered, the events the
    streams received, and how many streams were still running when the probing ended."""
    with streaming(rest, streams, words) as readers:
        latencies, unanswered = probe(rest, duration)
        running = sum(not ended for ended in readers.ended)
    ordered = sorted(latencies)

    def ms(q: float) -> float | None:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2) if ordered else None

    return {"streams": streams, "words": words, "probes": len(latencies), "unanswered": unanswered,
            "probe_ms": {"p50": ms(0.5), "p99": ms(0.99), "max": ms(1.0)},
            "events": sum(readers.events), "running_at_end": running}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rest", required=True, help="host:port of the REST endpoint")
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--words", type=int, default=500_000)
    parser.add_argument("-d", "--duration", type=float, default=10.0)
    args = parser.parse_args(argv)
    print(json.dumps(probe_under_streams(args.rest, args.streams, args.words, args.duration)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
