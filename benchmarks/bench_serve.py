"""The web viewer's JSON API over HTTP against the store's direct read, in the same run.

A SQLite journal holds one thread of ``--events`` events (100,000 by default, one run);
``deerflow-journal serve`` runs as a program on 127.0.0.1, and a bounded client (a fixed
number of requests, ``--concurrency`` at a time, keep-alive connections) asks it for:

- a page of 500 events of the run (``/api/threads/{t}/runs/{r}/events?after_seq=...``);
- a page of 50 messages (``/api/threads/{t}/messages/page?before_seq=...``),

at seqs spread over the whole thread. The same pages read straight from a store in this
process (``list_events``; ``list_messages`` then ``visible_messages``, what the endpoint does)
are the baseline: the ratio is what the HTTP layer (routing, JSON encoding, the socket) adds.

Run: ``.venv/bin/python benchmarks/bench_serve.py [--events 100000] [--requests 200]
[--concurrency 4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads import THREAD, make_events

from deerflow_journal import open_store, visible_messages

ROOT = Path(__file__).resolve().parent.parent
RUN = "run-0000"
EVENTS_PAGE = 500
MESSAGES_PAGE = 50
BATCH = 1000


async def fill(url: str, count: int) -> None:
    """One thread of ``count`` events in one run, written a batch at a time."""
    events = make_events(count, 1)
    async with open_store(url, max_trace_content=None) as store:
        for start in range(0, count, BATCH):
            await store.put_batch(events[start : start + BATCH])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(
        [sys.executable, "-m", "deerflow_journal", "--url", url, "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit("the server exited at start")
        try:
            httpx.get(f"http://127.0.0.1:{port}/api/threads", timeout=5).raise_for_status()
            return server
        except httpx.TransportError:
            time.sleep(0.1)
    server.kill()
    sys.exit("the server did not start within 60 s")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Figures:
    """Latencies of one measured series and the wall time it took."""

    def __init__(self, samples: list[float], wall: float) -> None:
        self.samples, self.wall = samples, wall

    @property
    def rps(self) -> float:
        return len(self.samples) / self.wall

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        return percentile(self.samples, 0.99)


def over_http(base: str, paths: list[str], concurrency: int) -> Figures:
    """Each path requested once, ``concurrency`` clients at a time, each with one connection."""
    samples: list[float] = []
    lock = threading.Lock()
    shares = [paths[i::concurrency] for i in range(concurrency)]

    def client(share: list[str]) -> None:
        with httpx.Client(base_url=base, timeout=60) as http:
            http.get(share[0]).raise_for_status()  # connect and warm up
            for path in share:
                start = time.perf_counter()
                http.get(path).raise_for_status()
                took = time.perf_counter() - start
                with lock:
                    samples.append(took)

    threads = [threading.Thread(target=client, args=(share,)) for share in shares if share]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Figures(samples, time.perf_counter() - start)


async def direct(calls: list[Callable[[], Awaitable[Any]]]) -> Figures:
    """Each call awaited once, one after another (after a warm-up call)."""
    await calls[0]()
    samples = []
    start = time.perf_counter()
    for call in calls:
        began = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - began)
    return Figures(samples, time.perf_counter() - start)


def report(label: str, figures: Figures, baseline: Figures | None = None) -> None:
    text = (
        f"{label:<44} {figures.rps:>9,.1f} req/s  p50 {figures.p50 * 1000:>8.2f} ms  "
        f"p99 {figures.p99 * 1000:>8.2f} ms"
    )
    if baseline is not None:
        text += f"  = {figures.p50 / baseline.p50:.2f}x direct p50"
    print(text, flush=True)


async def measure(url: str, base: str, count: int, requests: int, concurrency: int) -> None:
    step = max(1, (count - EVENTS_PAGE) // requests)
    afters = [(i * step) % max(1, count - EVENTS_PAGE) for i in range(requests)]
    befores = [count - (i * step) % max(1, count - MESSAGES_PAGE) for i in range(requests)]
    async with open_store(url, read_only=True) as store:

        def events_at(after: int) -> Callable[[], Awaitable[Any]]:
            return lambda: store.list_events(THREAD, RUN, limit=EVENTS_PAGE, after_seq=after)

        def messages_at(before: int) -> Callable[[], Awaitable[Any]]:
            async def read() -> Any:
                rows = await store.list_messages(THREAD, limit=MESSAGES_PAGE, before_seq=before)
                return visible_messages(rows)

            return read

        events_direct = await direct([events_at(a) for a in afters])
        messages_direct = await direct([messages_at(b) for b in befores])
    events_path = f"/api/threads/{THREAD}/runs/{RUN}/events?limit={EVENTS_PAGE}&after_seq="
    messages_path = f"/api/threads/{THREAD}/messages/page?limit={MESSAGES_PAGE}&before_seq="
    events_http_1 = over_http(base, [f"{events_path}{a}" for a in afters], 1)
    events_http_n = over_http(base, [f"{events_path}{a}" for a in afters], concurrency)
    messages_http_1 = over_http(base, [f"{messages_path}{b}" for b in befores], 1)
    messages_http_n = over_http(base, [f"{messages_path}{b}" for b in befores], concurrency)
    print(f"serve: {count:,}-event thread, {requests} requests per series")
    report(f"events page of {EVENTS_PAGE}: direct list_events", events_direct)
    report(f"events page of {EVENTS_PAGE}: HTTP, 1 client", events_http_1, events_direct)
    report(f"events page of {EVENTS_PAGE}: HTTP, {concurrency} clients", events_http_n)
    report(f"messages page of {MESSAGES_PAGE}: direct read", messages_direct)
    report(f"messages page of {MESSAGES_PAGE}: HTTP, 1 client", messages_http_1, messages_direct)
    report(f"messages page of {MESSAGES_PAGE}: HTTP, {concurrency} clients", messages_http_n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'journal.db'}"
        started = time.perf_counter()
        asyncio.run(fill(url, args.events))
        print(f"wrote {args.events:,} events in {time.perf_counter() - started:.1f} s")
        port = free_port()
        server = start_server(url, port)
        try:
            asyncio.run(
                measure(
                    url, f"http://127.0.0.1:{port}", args.events, args.requests, args.concurrency
                )
            )
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
