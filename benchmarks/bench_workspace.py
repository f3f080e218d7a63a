"""Benchmark: snapshot and diff a generated workspace, and count which files get opened.

Usage: ``python benchmarks/bench_workspace.py [--files 2000] [--changed 0.10] [--repeat 5]``

The workspace holds ``--files`` text files (1 to 8 KiB, mtimes an hour old as in a workspace
that exists before the run); ``--changed`` of them change (80 % modified, 10 % deleted, and as
many new files created). Each phase is timed (best of ``--repeat``) and an audit hook counts
the files it opens. The baseline, measured in the same run, reads and hashes every file twice
(before and after), the naive way to detect changes. The script exits non-zero if any
unchanged file is opened after the first snapshot.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

from deerflow_journal import WorkspaceChangeLimits, WorkspaceRoot
from deerflow_journal.workspace import compare_workspace_snapshots, scan_workspace

HOUR_NS = 3600 * 10**9
_opened: list[str] | None = None
_watched = ""


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        path = os.fsdecode(args[0])
        if path.startswith(_watched):
            _opened.append(path)


def generate(root: Path, count: int, rng: random.Random) -> list[Path]:
    """Write ``count`` text files in 40 folders, backdated by an hour."""
    paths = []
    old = time.time_ns() - HOUR_NS
    for i in range(count):
        path = root / f"dir{i % 40:02}" / f"file{i:05}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = rng.randint(16, 128)
        path.write_text("".join(f"line {n} of file {i}: {'x' * 48}\n" for n in range(lines)))
        os.utime(path, ns=(old, old))
        paths.append(path)
    return paths


def change(root: Path, paths: list[Path], ratio: float, rng: random.Random) -> set[str]:
    """Modify, delete and create files; return the paths that changed."""
    total = int(len(paths) * ratio)
    new_count = total // 10
    picked = rng.sample(paths, total - new_count)
    deleted = picked[:new_count]
    modified = picked[new_count:]
    created = [root / "new" / f"created{i:04}.txt" for i in range(new_count)]
    for path in modified:
        with path.open("a") as handle:
            handle.write("an appended line\n")
    for path in deleted:
        path.unlink()
    for path in created:
        path.parent.mkdir(exist_ok=True)
        path.write_text("a new file\n" * 8)
    return {str(p) for p in (*modified, *deleted, *created)}


def timed(repeat: int, work: Callable[[], Any]) -> tuple[float, Any, list[str]]:
    """Best wall time of ``repeat`` runs in ms, the last result, and the last run's opens."""
    global _opened
    best, result, opened = float("inf"), None, []
    for _ in range(repeat):
        _opened = []
        start = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - start)
        opened, _opened = _opened, None
    return best * 1000, result, opened


def read_everything(root: Path) -> dict[str, str]:
    """The baseline: read and hash every file."""
    digests = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                digests[path] = sha256(handle.read()).hexdigest()
    return digests


def main() -> int:
    global _watched
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--changed", type=float, default=0.10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.addaudithook(_audit)
    rng = random.Random(42)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        _watched = str(root) + os.sep
        paths = generate(root, args.files, rng)
        size = sum(p.stat().st_size for p in paths)
        roots = [WorkspaceRoot("outputs", root, "/mnt/user-data/outputs")]
        limits = WorkspaceChangeLimits(max_scanned_files=args.files * 2)
        bare = WorkspaceChangeLimits(max_scanned_files=args.files * 2, max_snapshot_bytes=0)

        t_before, before, opened_before = timed(
            args.repeat, lambda: scan_workspace(roots, limits=limits)
        )
        _, bare_before, opened_bare = timed(1, lambda: scan_workspace(roots, limits=bare))
        t_base_before, base_before, _ = timed(args.repeat, lambda: read_everything(root))
        changed = change(root, paths, args.changed, rng)
        t_after, after, opened_after = timed(
            args.repeat, lambda: scan_workspace(roots, limits=limits, keep_content=False)
        )
        t_diff, event, opened_diff = timed(
            args.repeat, lambda: compare_workspace_snapshots(before, after)
        )
        t_base_after, base_after, _ = timed(args.repeat, lambda: read_everything(root))
        base_changed = {
            p
            for p in base_before.keys() | base_after.keys()
            if base_before.get(p) != base_after.get(p)
        }
        bare_event = compare_workspace_snapshots(bare_before, after)

    kept = sum(len(state.data or b"") for state in before.files.values())
    summary = event["metadata"]["workspace_changes"]["summary"]
    needless = [p for p in opened_after + opened_diff if p not in changed]
    ours = t_before + t_after + t_diff
    baseline = t_base_before + t_base_after
    print(f"workspace: {args.files} files, {size / 2**20:.1f} MiB, {len(changed)} changed")
    print(
        f"snapshot-before  {t_before:8.1f} ms  opened {len(opened_before):5} files "
        f"(diff bases kept: {kept / 2**20:.1f} MiB)"
    )
    print(
        f"  without a before-content budget: opened {len(opened_bare)} files; "
        f"modified files then say not_captured "
        f"({_reasons(bare_event).get('not_captured', 0)} of them)"
    )
    print(f"snapshot-after   {t_after:8.1f} ms  opened {len(opened_after):5} files")
    print(
        f"diff             {t_diff:8.1f} ms  opened {len(opened_diff):5} files "
        f"(changed files that still exist: {len(changed) - summary['deleted']})"
    )
    print(f"event: {event['content']!r}")
    print(
        f"baseline (read+hash every file): before pass {t_base_before:.1f} ms, "
        f"after pass {t_base_after:.1f} ms, {len(base_changed)} changed found"
    )
    print(
        f"ratio: snapshot-after / baseline after pass = {t_after / t_base_after:.2f}; "
        f"snapshot-after + diff (with unified diffs) / baseline after pass = "
        f"{(t_after + t_diff) / t_base_after:.2f}; all three phases / baseline = "
        f"{ours / baseline:.2f}"
    )
    print(f"unchanged files opened after the snapshot: {len(needless)}")
    return 1 if needless or len(base_changed) != len(changed) else 0


def _reasons(event: dict[str, Any] | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in event["metadata"]["workspace_changes"]["files"] if event else []:
        reason = entry["diff_unavailable_reason"]
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
