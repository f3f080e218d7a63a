"""Write a few events to the default store and page them back."""

from __future__ import annotations

import asyncio
import uuid

from deerflow_journal import open_store


async def main() -> None:
    """Write one small run and print it."""
    thread_id, run_id = "quickstart", uuid.uuid4().hex
    async with open_store() as store:  # $DEERFLOW_JOURNAL_URL, else .deer-flow/journal.db
        await store.put_batch(
            [
                {
                    "thread_id": thread_id,
                    "run_id": run_id,
                    "event_type": "run.start",
                    "category": "trace",
                    "content": {"chain": "demo"},
                    "metadata": {"caller": "lead_agent"},
                },
                {
                    "thread_id": thread_id,
                    "run_id": run_id,
                    "event_type": "llm.human.input",
                    "category": "message",
                    "content": {"type": "human", "content": "hi"},
                    "metadata": {"caller": "lead_agent"},
                },
            ]
        )
        for event in await store.list_events(thread_id, run_id):
            print(event["seq"], event["event_type"], event["category"], event["content"])


if __name__ == "__main__":
    asyncio.run(main())
