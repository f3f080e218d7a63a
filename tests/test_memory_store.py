"""What only the memory store promises, beyond the shared store suite."""

from __future__ import annotations

import gc

from deerflow_journal import MemoryRunEventStore


async def test_stored_events_add_nothing_for_the_garbage_collector_to_scan():
    # A long-lived process keeps every event: if each one stayed tracked, every full
    # collection would walk them all.
    store = MemoryRunEventStore()
    event = {"thread_id": "t", "run_id": "r", "event_type": "llm.human.input"}
    await store.put_batch(
        [{**event, "category": "message", "content": {"text": f"hi {i}"}} for i in range(2000)]
    )
    gc.collect()
    before = len(gc.get_objects())
    await store.put_batch(
        [{**event, "category": "message", "content": {"text": f"hi {i}"}} for i in range(2000)]
    )
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    assert await store.count_messages("t") == 4000
