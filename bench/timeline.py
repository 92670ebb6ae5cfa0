"""Where a request's time goes at c=1: the server's system calls, recorded by perf, read as a timeline.

    python bench/timeline.py text_grpc [--server oipgen|floor|triton] [--perf-analyzer] [-d 1] [--json FILE]

Starts the server pinned to the server CPU as `make bench` does (`floor`: our server's answer to the workload,
recorded, then replayed by the bare transport), drives it at c=1 from the client CPU with bench/loadgen.py (or
perf_analyzer), and meanwhile records the server process's system calls for `-d` seconds (`perf record -e
raw_syscalls:*`: needs perf, and root or kernel.perf_event_paranoid <= 1; x86-64 syscall numbers). On the socket the
replies are written to (the descriptor written the most bytes), each request is one cycle:

- server: from the read that returns the request's first bytes to the write of its reply (the server's share of
  the latency);
- after: from that write to the writing thread's next wait (epoll or poll), when that thread reads the next request
  after it: its work once the reply is out, done while the client has its turn (none where another thread reads
  the next request, as in Triton);
- client: from the reply's write to the next request's first bytes read (the client's turn, the loopback and the
  server's wake-up);
- idle: how long the thread that reads the next request waited for it (its last wait before the read, when that
  began after the reply): about 0 when the request was there before the server was ready for it, so that the
  server's work after the reply was on the cycle too.

At c=1 server + client is the cycle, so the rate is 1 / (server + client): a change to the server's work shows in
its share before the reply. Medians over the cycles recorded; syscall tracing slows every system call a little, so
read the figures side by side (ours against the floor in the same minute), not as latencies.
"""

from __future__ import annotations

import argparse
import bisect
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pa
import servers
from servers import BENCH

# x86-64 system call numbers of what a server reads and writes its sockets with, and waits with.
READS = {0: "read", 19: "readv", 45: "recvfrom", 47: "recvmsg"}
WRITES = {1: "write", 20: "writev", 44: "sendto", 46: "sendmsg"}
WAITS = {7: "poll", 232: "epoll_wait", 271: "ppoll", 281: "epoll_pwait"}


@dataclass(frozen=True)
class Call:
    """One system call of the server: its thread, number, first argument (the descriptor, for I/O), when it was
    entered and left (seconds), and what it returned."""

    tid: int
    number: int
    fd: int
    enter: float
    exit: float
    result: int


def calls(lines: Iterable[str]) -> Iterator[Call]:
    """The completed system calls in `perf script -F tid,time,event,trace` output of raw_syscalls events, in the
    order they were entered (an enter without its exit in the recording is left out)."""
    entered: dict[int, tuple[int, int, float]] = {}
    done: list[Call] = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or not parts[0].isdigit():
            continue
        tid, moment, event = int(parts[0]), float(parts[1].rstrip(":")), parts[2]
        try:
            number = int(parts[4])
        except ValueError:
            continue
        if event.endswith("sys_enter:"):
            argument = parts[5].strip("(,")
            try:
                fd = int(argument, 16)
            except ValueError:
                fd = -1
            entered[tid] = (number, fd, moment)
        elif event.endswith("sys_exit:") and tid in entered and parts[5] == "=":
            number_in, fd, began = entered.pop(tid)
            if number_in == number:
                done.append(Call(tid, number, fd, began, moment, int(parts[6])))
    return iter(sorted(done, key=lambda call: call.enter))


def timeline(recorded: Iterable[Call]) -> dict[str, Any]:
    """The cycles of the socket written the most bytes (see the module's description): their count and the
    medians (microseconds) of each share."""
    every = list(recorded)
    written: Counter[int] = Counter()
    for call in every:
        if call.number in WRITES and call.result > 0:
            written[call.fd] += call.result
    if not written:
        return {"cycles": 0, "error": "no write with a result in the recording"}
    socket = written.most_common(1)[0][0]
    waits: dict[int, list[Call]] = defaultdict(list)  # by thread, in order
    for call in every:
        if call.number in WAITS:
            waits[call.tid].append(call)
    entered = {tid: [wait.enter for wait in spans] for tid, spans in waits.items()}
    left = {tid: [wait.exit for wait in spans] for tid, spans in waits.items()}
    server: list[float] = []
    after: list[float] = []
    client: list[float] = []
    idle: list[float] = []
    read_at: float | None = None  # the current request's first bytes read
    reply: Call | None = None  # the current request's reply written
    wait: float | None = None  # when the thread that wrote it waited next
    for call in every:
        if call.fd != socket or call.result <= 0:
            continue
        if call.number in READS and read_at is None:
            if reply is not None:
                client.append(call.exit - reply.enter)
                if wait is not None and wait <= call.enter and call.tid == reply.tid:  # its work, then this read
                    after.append(wait - reply.exit)
                # The reading thread's last wait before this read, if it began after the reply: how long the
                # request kept it waiting (about 0: the request was there before the server was ready for it).
                last = bisect.bisect_right(left.get(call.tid, []), call.enter) - 1
                if last >= 0 and waits[call.tid][last].enter >= reply.exit:
                    idle.append(waits[call.tid][last].exit - waits[call.tid][last].enter)
                reply = None
            read_at = call.exit
        elif call.number in WRITES and read_at is not None:
            server.append(call.enter - read_at)
            read_at = None
            reply = call
            moments = entered.get(call.tid, [])
            later = bisect.bisect_left(moments, call.exit)
            wait = moments[later] if later < len(moments) else None

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values) * 1e6, 1) if values else None

    return {"socket": socket, "cycles": len(server), "server_us": median(server), "after_us": median(after),
            "client_us": median(client), "idle_us": median(idle)}


def record(pid: int, seconds: float, into: Path) -> list[str]:
    """`seconds` of the system calls of process `pid`, as `perf script` prints them."""
    data = into / "syscalls.data"
    subprocess.run(["perf", "record", "-q", "-e", "raw_syscalls:sys_enter,raw_syscalls:sys_exit", "-p", str(pid),
                    "-o", str(data), "--", "sleep", str(seconds)], check=True, capture_output=True,
                   timeout=seconds + 60)  # fmt: skip
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,time,event,trace"], check=True,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    return script.stdout.splitlines()


def measure(running: servers.Running, args: argparse.Namespace, into: Path) -> dict[str, Any]:
    """Drive `running` at c=1 and record it meanwhile: the timeline and the load generator's figures."""
    load: dict[str, Any] = {}
    if args.perf_analyzer:
        window = int((args.duration + 3) * 1000)
        driver = threading.Thread(target=lambda: load.update(
            pa.run(BENCH / ".cache", args.workload, running.rest, running.grpc, 1, args.elements, window, 1)))
    else:
        driver = threading.Thread(target=lambda: load.update(servers.run_loadgen(
            running, args.workload, concurrency=1, duration=args.duration + 3, warmup=1.0, elements=args.elements,
            request_timeout=60.0)))
    driver.start()
    try:
        time.sleep(2.0)  # past the warm-up
        lines = record(running.pid, args.duration, into)
    finally:
        driver.join()
    return {**timeline(calls(lines)), "infer_per_s": load.get("infer_per_s"), "p50_ms": load.get("p50_ms"),
            "load_error": load.get("error")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("--server", default="oipgen", choices=("oipgen", "floor", "triton"))
    p.add_argument("--perf-analyzer", action="store_true", help="drive it with perf_analyzer (its workloads)")
    p.add_argument("-d", "--duration", type=float, default=1.0, help="seconds recorded")
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    args = p.parse_args(argv)
    if platform.machine() != "x86_64":
        p.error("the system call numbers here are x86-64's")
    if shutil.which("perf") is None:
        p.error("perf is missing (Debian: apt-get install linux-perf)")
    if args.workload not in servers.WORKLOAD_MODEL:
        p.error(f"unknown workload {args.workload!r}")
    if args.server == "floor" and args.perf_analyzer:
        p.error("the floor answers ModelInfer alone, and perf_analyzer asks for the model's metadata first")
    with tempfile.TemporaryDirectory(prefix="oipgen-timeline-") as tmp:
        into = Path(tmp)
        if args.server == "floor":
            answer = into / "answer.json"
            with servers.running("oipgen", BENCH / ".cache", into) as ours:
                servers.record_answer(ours, args.workload, args.elements, answer)
            floor = servers.start_floor(answer, into)
            try:
                result = measure(floor, args, into)
            finally:
                servers.stop(floor)
        else:
            with servers.running(args.server, BENCH / ".cache", into) as running:
                result = measure(running, args, into)
    print(f"{args.server} {args.workload} c=1 ({'perf_analyzer' if args.perf_analyzer else 'loadgen'}): "
          f"{result['cycles']} cycles; median server {result.get('server_us')} us, after the reply "
          f"{result.get('after_us')} us, client {result.get('client_us')} us (the server idle "
          f"{result.get('idle_us')} us of it); "
          f"{result['infer_per_s']} infer/s, p50 {result['p50_ms']} ms")
    if args.json:
        args.json.write_text(json.dumps({"server": args.server, "workload": args.workload, **result}, indent=1))
    for key in ("error", "load_error"):
        if result.get(key):
            print(f"{key}: {result[key]}")
    return 0 if result["cycles"] and not result.get("load_error") else 1


if __name__ == "__main__":
    sys.exit(main())
