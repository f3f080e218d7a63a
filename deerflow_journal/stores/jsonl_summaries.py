"""Run summaries of the JSONL store: one JSON line per write, the last line of a run wins."""

from __future__ import annotations

from typing import Any

import orjson

from deerflow_journal.stores.jsonl_files import (
    read_lines,
    rewrite_file,
)
from deerflow_journal.stores.jsonl_paths import ThreadPaths

__all__ = [
    "delete_summaries",
    "parse_summaries",
    "read_summaries",
    "read_summary_lines",
    "summary_line",
]

_NEWLINE = orjson.OPT_APPEND_NEWLINE


def summary_line(summary: dict[str, Any]) -> bytes:
    """One summary as its line of ``summaries.jsonl``."""
    return orjson.dumps(summary, option=_NEWLINE)


def read_summaries(paths: ThreadPaths) -> dict[str, dict[str, Any]]:
    """The thread's summaries by run, in first-written order, each the last one written."""
    return parse_summaries(paths, read_summary_lines(paths))


def read_summary_lines(paths: ThreadPaths) -> list[bytes]:
    """The complete lines of the thread's summaries file."""
    try:
        return read_lines(paths.summaries, 0)[0]
    except FileNotFoundError:
        return []


def parse_summaries(paths: ThreadPaths, lines: list[bytes]) -> dict[str, dict[str, Any]]:
    """The summaries ``lines`` hold by run, as ``read_summaries`` returns them."""
    summaries: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict) and data.get("thread_id") == paths.thread_id:
            run_id = data.get("run_id")
            if isinstance(run_id, str):
                summaries[run_id] = data
    return summaries


def delete_summaries(paths: ThreadPaths, run_id: str | None, user_id: str | None) -> None:
    """Drop the summaries of one run (or all), optionally only one user's (thread locked)."""
    summaries = read_summaries(paths)
    kept = [
        s
        for s in summaries.values()
        if not (
            (run_id is None or s["run_id"] == run_id)
            and (user_id is None or s.get("user_id") == user_id)
        )
    ]
    if len(kept) == len(summaries):
        return
    if kept:
        rewrite_file(paths.summaries, [orjson.dumps(s, option=_NEWLINE) for s in kept])
    else:
        paths.summaries.unlink(missing_ok=True)
