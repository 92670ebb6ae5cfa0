"""Profile our server under one workload with py-spy (from bench/setup.sh's tools venv).

    python bench/profile.py simple_grpc -c 8 [-d 8] [--elements N] [--native] [--gil] [--out DIR]

Starts our server on CPU 0, drives it with bench/loadgen.py on CPU 1, records it with py-spy meanwhile (collapsed
stacks, `profile-<workload>.txt`, and an SVG flame graph), and prints where the samples fall: the functions
with the most samples inclusive and exclusive.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run
import servers
from servers import BENCH, CLIENT_CPU


def summarize(collapsed: Path, top: int = 25, every_thread: bool = False) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    exclusive: collections.Counter[str] = collections.Counter()
    total = others = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        if "Runner.run" not in stack and not every_thread:  # worker threads: mostly waiting, unless sampled by GIL
            others += count
            continue
        total += count
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")" for f in stack.split(";")
        ]
        for frame in set(frames):
            inclusive[frame] += count
        exclusive[frames[-1]] += count
    whose = "every thread holding the GIL" if every_thread else "the event loop's thread"
    lines = [f"{total} samples of {whose} ({others} of other threads)", "", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    lines += ["", "exclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in exclusive.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("-d", "--duration", type=float, default=8.0)
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument("--native", action="store_true", help="include native (C) frames")
    p.add_argument("--gil", action="store_true",
                   help="sample only the thread holding the GIL (where a threaded server's Python time goes)")
    p.add_argument("--out", type=Path, default=BENCH / ".work")
    p.add_argument("--models", type=Path, help="the model repository (default: examples/models)")
    p.add_argument("--server", default="oipgen", choices=("oipgen", *servers.VARIANTS),
                   help="our server as shipped, or a variant (oipgen_traced: exporting to bench/otlp_sink.py)")
    args = p.parse_args(argv)
    pyspy = BENCH / ".cache" / "venv-tools" / "bin" / "py-spy"
    if not pyspy.exists():
        p.error(f"{pyspy} is missing: bash bench/setup.sh")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"profile-{args.workload}-c{args.concurrency}" + ("" if args.server == "oipgen" else f"-{args.server}")
    if args.models:
        servers.OIPGEN_MODELS = args.models.resolve()
    sink = run.start_sink(print) if args.server == "oipgen_traced" else None
    try:
        return _profile(args, pyspy, stem)
    finally:
        if sink is not None:
            print("OTLP sink received:", run.stop_sink(sink))


def _profile(args: argparse.Namespace, pyspy: Path, stem: str) -> int:
    with servers.running(args.server, BENCH / ".cache", args.out) as server:
        load = subprocess.Popen(
            ["taskset", "-c", CLIENT_CPU, sys.executable, str(BENCH / "loadgen.py"), "--rest", server.rest,
             "--grpc", server.grpc, "--workload", args.workload, "-c", str(args.concurrency),
             "-d", str(args.duration + 2), "-w", "1", "--elements", str(args.elements),
             "--server-pid", str(server.pid)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.5)
        common = [
            "-p",
            str(server.pid),
            "-d",
            str(int(args.duration)),
            "-r",
            "250",
            *(["--native"] if args.native else []),
            *(["--gil"] if args.gil else []),
        ]
        for fmt, suffix in (("raw", ".txt"),):
            subprocess.run(["taskset", "-c", CLIENT_CPU, str(pyspy), "record", *common, "-f", fmt,
                            "-o", str(args.out / (stem + suffix))], check=True, timeout=args.duration + 60,
                           capture_output=True)  # fmt: skip
        out, _ = load.communicate(timeout=args.duration + 120)
    print(out.strip())
    print(summarize(args.out / (stem + ".txt"), every_thread=args.gil))
    return 0


if __name__ == "__main__":
    sys.exit(main())
