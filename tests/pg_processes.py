"""Work for spawned writer processes; kept free of LangGraph so that children start fast."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from deerflow_journal.stores.postgres import PostgresRunEventStore

THREAD = "shared-thread"
TASKS = 4
BATCHES = 6
BATCH_SIZE = 5


def _child(target: Callable[..., Any], barrier: Any, results: Any, *args: Any) -> None:
    try:
        results.put(("ok", asyncio.run(target(barrier, *args))))
    except BaseException:
        results.put(("error", traceback.format_exc()))


class Children:
    """Spawned processes that meet at a shared barrier and report through a queue."""

    def __init__(self, target: Callable[..., Any], args: list[tuple[Any, ...]]) -> None:
        ctx = multiprocessing.get_context("spawn")
        # Kept on self: the barrier and queue must outlive the children's start-up.
        self.barrier, self.results = ctx.Barrier(len(args)), ctx.Queue()
        self.processes = [
            ctx.Process(target=_child, args=(target, self.barrier, self.results, *a)) for a in args
        ]
        for process in self.processes:
            process.start()

    def alive(self) -> bool:
        return any(p.is_alive() for p in self.processes)

    async def collect(self) -> list[Any]:
        """Every child's result; a failed or vanished child fails the test."""
        outcomes: list[tuple[str, Any]] = []
        while len(outcomes) < len(self.processes):
            try:
                outcomes.append(await asyncio.to_thread(self.results.get, timeout=1))
            except queue.Empty:
                codes = [p.exitcode for p in self.processes]
                assert self.alive() or not self.results.empty(), f"children died: {codes}"
        for process in self.processes:
            await asyncio.to_thread(process.join, 30)
        failures = [value for status, value in outcomes if status == "error"]
        assert not failures, "\n".join(failures)
        return [value for _, value in outcomes]


async def write_from_tasks(barrier: Any, dsn: str, process: int) -> dict[str, Any]:
    """Four tasks of one process race one put_if_absent, then write batches and singles."""
    async with PostgresRunEventStore(dsn) as store:
        await asyncio.to_thread(barrier.wait)
        spans: list[tuple[float, float, list[int]]] = []
        absent: list[tuple[int, bool]] = []

        async def task(number: int) -> None:
            # Every task of every process races for the same put_if_absent first.
            record, created = await store.put_if_absent(
                thread_id=THREAD,
                run_id="once",
                event_type="context:memory",
                category="message",
                content={"writer": [process, number]},
            )
            absent.append((record["seq"], created))
            for batch in range(BATCHES):
                events = [
                    {
                        "thread_id": THREAD,
                        "run_id": f"run-{process}-{number}",
                        "event_type": "llm.ai.response",
                        "category": "message",
                        "content": {"writer": [process, number, batch, i]},
                    }
                    for i in range(BATCH_SIZE if batch % 2 else 1)
                ]
                start = time.monotonic()
                if len(events) == 1:
                    records = [await store.put(**events[0])]
                else:
                    records = await store.put_batch(events)
                spans.append((start, time.monotonic(), [r["seq"] for r in records]))

        await asyncio.gather(*(task(n) for n in range(TASKS)))
        return {"spans": spans, "absent": absent}


async def set_up_once(barrier: Any, dsn: str, process: int) -> int:
    store = PostgresRunEventStore(dsn)
    await asyncio.to_thread(barrier.wait)
    try:
        await store.setup()
        return (
            await store.put(
                thread_id=THREAD, run_id=f"r{process}", event_type="e", category="message"
            )
        )["seq"]
    finally:
        await store.close()
