"""Workspace snapshots and ``workspace_changes`` events (see docs/events.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from deerflow_journal import (
    WORKSPACE_CHANGES_EVENT,
    RunEventStore,
    WorkspaceChangeLimits,
    WorkspaceRoot,
    WorkspaceSnapshot,
    capture_workspace_snapshot,
    record_workspace_changes,
    validate_event,
)
from deerflow_journal.workspace import (
    WORKSPACE_DIFF_UNAVAILABLE_REASONS,
    compare_workspace_snapshots,
    diff_workspace,
    scan_workspace,
)
from deerflow_journal.workspace_diff import cut_diff, decode_text, unified_diff

PREFIX = "/mnt/user-data/outputs"
HOUR_NS = 3600 * 10**9

# Paths opened while a test records (the audit hook stays installed; it costs one check).
_opened: list[tuple[str, int]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | bytes | Path):
        _opened.append((os.fsdecode(args[0]), threading.get_ident()))


sys.addaudithook(_audit)


@contextmanager
def recording_opens() -> Iterator[list[tuple[str, int]]]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "outputs"
    path.mkdir()
    return path


@pytest.fixture
def roots(ws: Path) -> list[WorkspaceRoot]:
    return [WorkspaceRoot("outputs", ws, PREFIX)]


def write(path: Path, data: str | bytes, *, age_ns: int = 0) -> Path:
    """Write a file (parents too); ``age_ns`` backdates its mtime as an older workspace's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)
    if age_ns:
        moment = time.time_ns() - age_ns
        os.utime(path, ns=(moment, moment))
    return path


async def record(
    store: RunEventStore, before: WorkspaceSnapshot, roots, **kw
) -> dict[str, Any] | None:
    """Record through the store; check the event validates and reads back identically."""
    event = await record_workspace_changes(store, "th", "r1", before, roots, **kw)
    stored = await store.list_events("th", "r1")
    if event is None:
        assert stored == []
        return None
    assert stored == [event]
    validate_event(event)
    assert event["event_type"] == WORKSPACE_CHANGES_EVENT.event_type
    assert event["category"] == WORKSPACE_CHANGES_EVENT.category == "workspace"
    return event


def payload(event: dict[str, Any]) -> dict[str, Any]:
    return event["metadata"]["workspace_changes"]


def by_path(event: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["path"]: entry for entry in payload(event)["files"]}


# -- statuses and diffs -----------------------------------------------------------------------


async def test_created_modified_and_deleted_text_files_get_unified_diffs(store, ws, roots):
    write(ws / "mod.txt", "one\ntwo\nthree\n", age_ns=HOUR_NS)
    write(ws / "gone.txt", "bye\n", age_ns=HOUR_NS)
    write(ws / "same.txt", "same\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    write(ws / "mod.txt", "one\n2\nthree\nfour")
    (ws / "gone.txt").unlink()
    write(ws / "sub" / "new.md", "# title\nbody\n")

    event = await record(store, before, roots)
    assert event["content"] == "3 files changed +4 -2"
    files = by_path(event)
    assert list(files) == [f"{PREFIX}/gone.txt", f"{PREFIX}/mod.txt", f"{PREFIX}/sub/new.md"]
    created, modified, deleted = (
        files[f"{PREFIX}/sub/new.md"],
        files[f"{PREFIX}/mod.txt"],
        files[f"{PREFIX}/gone.txt"],
    )
    assert created["status"] == "created"
    assert created["diff"] == (
        f"--- /dev/null\n+++ b{PREFIX}/sub/new.md\n@@ -0,0 +1,2 @@\n+# title\n+body\n"
    )
    assert (created["additions"], created["deletions"]) == (2, 0)
    assert (created["size_before"], created["size_after"]) == (None, 13)
    assert created["sha256_before"] is None and len(created["sha256_after"]) == 64
    assert modified["status"] == "modified"
    assert modified["diff"].endswith("+four\n\\ No newline at end of file\n")
    assert (modified["additions"], modified["deletions"]) == (2, 1)
    assert modified["sha256_before"] != modified["sha256_after"]
    assert deleted["status"] == "deleted"
    assert (deleted["additions"], deleted["deletions"]) == (0, 1)
    assert deleted["diff"].startswith(f"--- a{PREFIX}/gone.txt\n+++ /dev/null\n")
    for entry in files.values():
        assert entry["root"] == "outputs"
        assert entry["diff_unavailable_reason"] is None
        assert not (entry["binary"] or entry["sensitive"] or entry["symlink"])
    assert payload(event)["summary"] == {
        "created": 1,
        "modified": 1,
        "deleted": 1,
        "symlink_created": 0,
        "additions": 4,
        "deletions": 2,
        "truncated": False,
    }
    assert payload(event)["version"] == 1
    assert payload(event)["limits"] == WorkspaceChangeLimits().to_dict()


async def test_a_single_change_is_summarised_in_the_singular(store, ws, roots):
    before = await capture_workspace_snapshot(roots)
    write(ws / "a.txt", "x\n")
    event = await record(store, before, roots)
    assert event["content"] == "1 file changed +1 -0"


async def test_nothing_changed_writes_no_event(store, ws, roots):
    write(ws / "a.txt", "a\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    assert await record(store, before, roots) is None


async def test_touching_a_file_without_changing_it_is_no_change(store, ws, roots):
    write(ws / "a.txt", "a\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    os.utime(ws / "a.txt")
    assert await record(store, before, roots) is None


async def test_a_same_size_rewrite_right_after_the_snapshot_is_detected(store, ws, roots):
    # Written, snapshotted and rewritten within one mtime tick: lstat facts may be equal.
    write(ws / "a.txt", "aaaa\n")
    before = await capture_workspace_snapshot(roots)
    stat = (ws / "a.txt").stat()
    write(ws / "a.txt", "bbbb\n")
    os.utime(ws / "a.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    event = await record(store, before, roots)
    assert by_path(event)[f"{PREFIX}/a.txt"]["status"] == "modified"


async def test_an_atomic_replace_with_equal_size_and_mtime_is_detected(store, ws, roots):
    write(ws / "a.txt", "aaaa\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    stat = (ws / "a.txt").stat()
    write(ws / "tmp", "bbbb\n")
    os.utime(ws / "tmp", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(ws / "tmp", ws / "a.txt")
    event = await record(store, before, roots)
    assert by_path(event)[f"{PREFIX}/a.txt"]["diff"].endswith("-aaaa\n+bbbb\n")


# -- symlinks ---------------------------------------------------------------------------------


async def test_a_new_symlink_is_recorded_with_its_target_and_never_followed(
    store, ws, roots, tmp_path
):
    secret = write(tmp_path / "outside.txt", "not yours\n")
    write(ws / "dir" / "inner.txt", "x\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    os.symlink(secret, ws / "escape")
    os.symlink(ws / "dir", ws / "dirlink")
    with recording_opens() as opened:
        event = await record(store, before, roots)
    assert all(not path.startswith(str(secret)) for path, _ in opened)
    files = by_path(event)
    assert list(files) == [f"{PREFIX}/dirlink", f"{PREFIX}/escape"]
    escape = files[f"{PREFIX}/escape"]
    assert escape["status"] == "symlink_created"
    assert escape["symlink"] is True
    assert escape["symlink_target_before"] is None
    assert escape["symlink_target_after"] == str(secret)
    assert (escape["diff"], escape["diff_unavailable_reason"]) == ("", "symlink")
    assert escape["sha256_after"] is None and escape["size_after"] is None
    assert payload(event)["summary"]["symlink_created"] == 2


async def test_a_retargeted_symlink_is_modified_and_a_removed_one_deleted(store, ws, roots):
    os.symlink("a", ws / "moving")
    os.symlink("b", ws / "removed")
    os.symlink("c", ws / "steady")
    before = await capture_workspace_snapshot(roots)
    (ws / "moving").unlink()
    os.symlink("z", ws / "moving")
    (ws / "removed").unlink()
    files = by_path(await record(store, before, roots))
    assert set(files) == {f"{PREFIX}/moving", f"{PREFIX}/removed"}
    moving, removed = files[f"{PREFIX}/moving"], files[f"{PREFIX}/removed"]
    assert moving["status"] == "modified"
    assert (moving["symlink_target_before"], moving["symlink_target_after"]) == ("a", "z")
    assert removed["status"] == "deleted"
    assert (removed["symlink_target_before"], removed["symlink_target_after"]) == ("b", None)


async def test_a_file_replaced_by_a_symlink_is_symlink_created(store, ws, roots):
    write(ws / "a.txt", "x\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    (ws / "a.txt").unlink()
    os.symlink("elsewhere", ws / "a.txt")
    entry = by_path(await record(store, before, roots))[f"{PREFIX}/a.txt"]
    assert entry["status"] == "symlink_created"
    assert (entry["size_before"], entry["size_after"]) == (2, None)
    assert entry["symlink_target_after"] == "elsewhere"


# -- files that get no diff -------------------------------------------------------------------


async def test_binary_files_get_digests_but_no_diff(store, ws, roots):
    write(ws / "img.bin", b"\x89PNG\x00\x01", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    write(ws / "img.bin", b"\x89PNG\x00\x02\x03")
    write(ws / "new.bin", b"\x00" * 10)
    files = by_path(await record(store, before, roots))
    for name in ("img.bin", "new.bin"):
        entry = files[f"{PREFIX}/{name}"]
        assert entry["binary"] is True
        assert (entry["diff"], entry["diff_unavailable_reason"]) == ("", "binary")
        assert len(entry["sha256_after"]) == 64
        assert (entry["additions"], entry["deletions"]) == (0, 0)
    assert len(files[f"{PREFIX}/img.bin"]["sha256_before"]) == 64


async def test_a_text_file_turned_binary_has_no_diff(store, ws, roots):
    write(ws / "f", "text\n", age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    write(ws / "f", b"bin\x00ary")
    entry = by_path(await record(store, before, roots))[f"{PREFIX}/f"]
    assert (entry["binary"], entry["diff_unavailable_reason"]) == (True, "binary")


async def test_files_over_the_diff_size_limit_get_digests_but_no_diff(store, ws, roots):
    limits = WorkspaceChangeLimits(max_file_bytes_for_diff=100)
    write(ws / "big.txt", "a" * 101, age_ns=HOUR_NS)
    write(ws / "edge.txt", "b" * 100, age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots, limits=limits)
    write(ws / "big.txt", "c" * 150)
    write(ws / "edge.txt", "d" * 100)
    write(ws / "huge.txt", "e" * 5000)
    files = by_path(await record(store, before, roots))
    big, huge, edge = (files[f"{PREFIX}/{n}"] for n in ("big.txt", "huge.txt", "edge.txt"))
    assert (big["diff_unavailable_reason"], big["diff"]) == ("too_large", "")
    assert big["sha256_before"] is None  # never read before it changed
    assert len(big["sha256_after"]) == 64 and big["binary"] is False
    assert (big["size_before"], big["size_after"]) == (101, 150)
    assert huge["diff_unavailable_reason"] == "too_large"
    assert edge["diff_unavailable_reason"] is None
    assert (edge["additions"], edge["deletions"]) == (1, 1)


SENSITIVE = [
    ".env",
    ".env.local",
    "prod.env",
    "server.key",
    "cert.pem",
    "my_secret.txt",
    "github_token",
    "Passwords.csv",
    "aws_credentials",
    "api_key.json",
    "private_key.txt",
    "secrets/config.yaml",
]


async def test_sensitive_paths_are_never_read_and_get_no_diff(store, ws, roots):
    for name in SENSITIVE:
        write(ws / name, "hunter2\n", age_ns=HOUR_NS)
    with recording_opens() as opened_before:
        before = await capture_workspace_snapshot(roots)
    for name in SENSITIVE:
        write(ws / name, "hunter3-changed\n")
        write(ws / f"new-{name}", "s3cr3t\n")
    with recording_opens() as opened_after:
        files = by_path(await record(store, before, roots))
    opened = {path for path, _ in opened_before + opened_after}
    assert not [path for path in opened if path.startswith(str(ws))]
    assert len(files) == 2 * len(SENSITIVE)
    for entry in files.values():
        assert entry["sensitive"] is True, entry["path"]
        assert (entry["diff"], entry["diff_unavailable_reason"]) == ("", "sensitive")
        assert entry["sha256_before"] is None and entry["sha256_after"] is None
        assert "hunter" not in str(entry) and "s3cr3t" not in str(entry)


async def test_non_utf8_text_gets_no_diff_and_is_not_called_binary(store, ws, roots):
    write(ws / "latin1.txt", "café\n".encode("latin-1"), age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    write(ws / "latin1.txt", "crème brûlée\n".encode("latin-1"))
    entry = by_path(await record(store, before, roots))[f"{PREFIX}/latin1.txt"]
    assert (entry["binary"], entry["diff_unavailable_reason"]) == (False, "encoding")
    assert len(entry["sha256_before"]) == len(entry["sha256_after"]) == 64


async def test_utf16_and_utf8_bom_text_is_decoded_and_diffed(store, ws, roots):
    write(ws / "u16.txt", "hello\nwörld\n".encode("utf-16"), age_ns=HOUR_NS)
    write(ws / "bom.txt", "\ufeffa\n".encode(), age_ns=HOUR_NS)
    before = await capture_workspace_snapshot(roots)
    write(ws / "u16.txt", "hello\nwelt\n".encode("utf-16"))
    write(ws / "bom.txt", "\ufeffb\n".encode())
    files = by_path(await record(store, before, roots))
    u16, bom = files[f"{PREFIX}/u16.txt"], files[f"{PREFIX}/bom.txt"]
    assert u16["binary"] is False
    assert u16["diff"].endswith(" hello\n-wörld\n+welt\n")
    assert bom["diff"].endswith("-a\n+b\n")


async def test_without_a_snapshot_budget_modified_files_say_not_captured(store, ws, roots):
    limits = WorkspaceChangeLimits(max_snapshot_bytes=0)
    write(ws / "a.txt", "a\n", age_ns=HOUR_NS)
    with recording_opens() as opened:
        before = await capture_workspace_snapshot(roots, limits=limits)
    assert not any(path.startswith(str(ws)) for path, _ in opened)
    write(ws / "a.txt", "b\n")
    write(ws / "b.txt", "new\n")
    files = by_path(await record(store, before, roots))
    assert files[f"{PREFIX}/a.txt"]["diff_unavailable_reason"] == "not_captured"
    assert files[f"{PREFIX}/b.txt"]["diff"].endswith("+new\n")


# -- limits -----------------------------------------------------------------------------------


async def test_max_files_lists_the_first_files_and_keeps_the_totals(store, ws, roots):
    before = await capture_workspace_snapshot(roots)
    for i in range(5):
        write(ws / f"f{i}.txt", "line\n" * (i + 1))
    event = await record(store, before, roots, limits=WorkspaceChangeLimits(max_files=2))
    data = payload(event)
    assert [e["path"] for e in data["files"]] == [f"{PREFIX}/f0.txt", f"{PREFIX}/f1.txt"]
    assert data["summary"]["created"] == 5
    assert data["summary"]["additions"] == 1 + 2 + 3 + 4 + 5
    assert data["summary"]["truncated"] is True
    assert data["limits"]["max_files"] == 2
    assert event["content"] == "5 files changed +15 -0"


async def test_the_total_diff_budget_cuts_diffs_and_keeps_the_counts(store, ws, roots):
    before = await capture_workspace_snapshot(roots)
    for i in range(3):
        write(ws / f"f{i}.txt", "".join(f"line {n}\n" for n in range(20)))
    limits = WorkspaceChangeLimits(max_total_diff_bytes=150)
    data = payload(await record(store, before, roots, limits=limits))
    first, second, third = data["files"]
    assert first["diff_truncated"] is True and 0 < len(first["diff"].encode()) <= 150
    assert first["diff"].endswith("\n")
    assert (second["diff"], second["diff_truncated"]) == ("", True)
    assert second["diff_unavailable_reason"] == "diff_budget"
    assert third["diff_unavailable_reason"] == "diff_budget"
    assert [f["additions"] for f in data["files"]] == [20, 20, 20]
    assert data["summary"]["additions"] == 60
    assert data["summary"]["truncated"] is True


async def test_max_scanned_files_stops_the_scan_without_false_changes(store, ws, roots):
    for i in range(10):
        write(ws / f"f{i}.txt", f"{i}\n", age_ns=HOUR_NS)
    limits = WorkspaceChangeLimits(max_scanned_files=5)
    before = await capture_workspace_snapshot(roots, limits=limits)
    assert before.truncated and len(before.files) == 5
    write(ws / "a_first.txt", "new\n")  # sorts first: the after scan now stops earlier
    write(ws / "f1.txt", "changed\n")
    write(ws / "f8.txt", "beyond the scan\n")
    data = payload(await record(store, before, roots))
    assert {e["path"]: e["status"] for e in data["files"]} == {
        f"{PREFIX}/a_first.txt": "created",
        f"{PREFIX}/f1.txt": "modified",
    }
    assert data["summary"]["truncated"] is True
    assert data["summary"]["deleted"] == 0


async def test_vcs_and_build_folders_are_skipped(store, ws, roots):
    before = await capture_workspace_snapshot(roots)
    for folder in (".git", "node_modules/pkg", "__pycache__", ".venv/lib", "dist", "x.egg-info"):
        write(ws / folder / "file.txt", "x\n")
    write(ws / "src" / "build", "a file named build is kept\n")
    files = by_path(await record(store, before, roots))
    assert list(files) == [f"{PREFIX}/src/build"]


async def test_special_files_are_skipped_not_opened(store, ws, roots):
    before = await capture_workspace_snapshot(roots)
    os.mkfifo(ws / "pipe")
    assert await record(store, before, roots) is None


async def test_several_roots_keep_their_names_and_virtual_prefixes(store, tmp_path):
    uploads, outputs = tmp_path / "up", tmp_path / "out"
    roots = [WorkspaceRoot("uploads", uploads, "/mnt/uploads/"), WorkspaceRoot("o", outputs, "")]
    before = await capture_workspace_snapshot(roots)  # neither folder exists yet
    write(uploads / "a.txt", "a\n")
    write(outputs / "b.txt", "b\n")
    data = payload(await record(store, before, roots))
    assert [(e["root"], e["path"]) for e in data["files"]] == [
        ("uploads", "/mnt/uploads/a.txt"),
        ("o", "b.txt"),
    ]


# -- no blocking I/O on the loop, no needless reads -------------------------------------------


async def test_unchanged_files_are_not_read_after_the_snapshot_and_io_is_off_the_loop(
    store, ws, roots
):
    for i in range(20):
        write(ws / f"f{i:02}.txt", f"{i}\n", age_ns=HOUR_NS)
    with recording_opens() as opened_before:
        before = await capture_workspace_snapshot(roots)
    write(ws / "f03.txt", "three\n")
    with recording_opens() as opened_after:
        await record(store, before, roots)
    loop_thread = threading.get_ident()
    in_ws = [(p, t) for p, t in opened_before + opened_after if p.startswith(str(ws))]
    assert in_ws and all(thread != loop_thread for _, thread in in_ws)
    assert [p for p, _ in opened_after if p.startswith(str(ws))] == [str(ws / "f03.txt")]


# -- API checks and pure helpers --------------------------------------------------------------


def test_limits_default_to_the_spec_values_and_reject_bad_ones():
    assert WorkspaceChangeLimits().to_dict() == {
        "max_files": 200,
        "max_scanned_files": 2000,
        "max_file_bytes_for_diff": 256 * 1024,
        "max_total_diff_bytes": 1024 * 1024,
        "max_snapshot_bytes": 16 * 1024 * 1024,
    }
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="max_files"):
            WorkspaceChangeLimits(max_files=bad)


def test_roots_must_have_unique_names(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        scan_workspace([WorkspaceRoot("a", tmp_path, "/a"), WorkspaceRoot("a", tmp_path, "/b")])
    with pytest.raises(ValueError, match="name"):
        WorkspaceRoot("", tmp_path, "/a")
    with pytest.raises(TypeError, match="WorkspaceRoot"):
        scan_workspace([str(tmp_path)])


def test_diff_workspace_wants_a_snapshot(roots):
    with pytest.raises(TypeError, match="WorkspaceSnapshot"):
        diff_workspace({}, roots)
    with pytest.raises(TypeError, match="WorkspaceSnapshot"):
        compare_workspace_snapshots(scan_workspace(roots), None)


def test_compare_workspace_snapshots_reads_only_what_changed(ws, roots):
    write(ws / "a.txt", "a\n", age_ns=HOUR_NS)
    write(ws / "b.txt", "b\n", age_ns=HOUR_NS)
    before = scan_workspace(roots)
    write(ws / "b.txt", "bb\n")
    after = scan_workspace(roots, keep_content=False)
    with recording_opens() as opened:
        event = compare_workspace_snapshots(before, after)
    assert [p for p, _ in opened] == [str(ws / "b.txt")]
    assert event["content"] == "1 file changed +1 -1"
    assert compare_workspace_snapshots(before, before) is None


def test_diff_reasons_are_documented():
    assert set(WORKSPACE_DIFF_UNAVAILABLE_REASONS) == {
        "sensitive",
        "symlink",
        "binary",
        "too_large",
        "encoding",
        "unreadable",
        "not_captured",
        "diff_budget",
    }


def test_decode_text_accepts_utf8_and_bom_marked_utf16_and_utf32_only():
    assert decode_text("é\n".encode()) == "é\n"
    assert decode_text("\ufeffé".encode()) == "é"
    assert decode_text("é".encode("utf-16")) == "é"
    assert decode_text("é".encode("utf-32")) == "é"
    assert decode_text("é".encode("latin-1")) is None


def test_unified_diff_splits_on_newlines_only():
    diff, additions, deletions = unified_diff("a\fb\n", "a\fc\n", "a/x", "b/x")
    assert (additions, deletions) == (1, 1)
    assert diff == "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\fb\n+a\fc\n"


def test_cut_diff_cuts_at_a_line_boundary():
    assert cut_diff("ab\ncd\n", 6) == ("ab\ncd\n", False)
    assert cut_diff("ab\ncd\n", 5) == ("ab\n", True)
    assert cut_diff("ab\ncd\n", 0) == ("", True)


def test_a_file_gone_or_grown_between_rescan_and_compare_is_unreadable_or_too_large(ws, roots):
    limits = WorkspaceChangeLimits(max_file_bytes_for_diff=50)
    before = scan_workspace(roots, limits=limits)
    write(ws / "gone.txt", "x\n")
    write(ws / "grown.txt", "y\n")
    after = scan_workspace(roots, limits=limits, keep_content=False)
    (ws / "gone.txt").unlink()
    write(ws / "grown.txt", "z" * 100)
    files = {e["path"]: e for e in payload(compare_workspace_snapshots(before, after))["files"]}
    gone, grown = files[f"{PREFIX}/gone.txt"], files[f"{PREFIX}/grown.txt"]
    assert (gone["diff_unavailable_reason"], gone["sha256_after"]) == ("unreadable", None)
    assert grown["diff_unavailable_reason"] == "too_large"
    assert len(grown["sha256_after"]) == 64


def test_the_workspace_benchmark_runs_and_opens_no_unchanged_file():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_workspace.py"
    env = {**os.environ, "PYTHONPATH": str(script.parent.parent)}
    done = subprocess.run(
        [sys.executable, str(script), "--files", "60", "--repeat", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unchanged files opened after the snapshot: 0" in done.stdout


# -- awkward trees ----------------------------------------------------------------------------


async def test_a_file_name_that_is_not_utf8_is_shown_with_replacement_characters(store, ws, roots):
    name = Path(os.fsdecode(os.fsencode(ws) + b"/caf\xe9.txt"))  # Latin-1: legal on Linux
    write(name, "a\n", age_ns=HOUR_NS)
    write(ws / "ok.txt", "a\n", age_ns=HOUR_NS)
    before = scan_workspace(roots)
    name.write_text("b\n")
    write(ws / "ok.txt", "b\n")
    entries = by_path(await record(store, before, roots))
    bad = entries[f"{PREFIX}/caf\ufffd.txt"]
    assert bad["status"] == "modified"
    assert f"b{PREFIX}/caf\ufffd.txt" in bad["diff"]
    assert entries[f"{PREFIX}/ok.txt"]["status"] == "modified"


def test_a_tree_deeper_than_the_recursion_limit_is_scanned(ws, roots):
    levels = ["d"] * (sys.getrecursionlimit() + 100)  # about 2 KB of path: far below PATH_MAX
    folders = [ws.joinpath(*levels[:depth]) for depth in range(1, len(levels) + 1)]
    for folder in folders:  # one by one: pathlib's mkdir(parents=True) recurses
        folder.mkdir()
    write(folders[-1] / "f.txt", "x")
    write(ws / "top.txt", "x")
    try:
        files = scan_workspace(roots).files
    finally:  # deepest first: pytest's recursive cleanup would hit the recursion limit too
        (folders[-1] / "f.txt").unlink()
        for folder in reversed(folders):
            folder.rmdir()
    assert ("outputs", "top.txt") in files
    assert ("outputs", "/".join([*levels, "f.txt"])) in files


async def test_files_in_a_folder_that_cannot_be_listed_are_not_reported_deleted(
    store, ws, roots, monkeypatch
):
    write(ws / "sub" / "keep.txt", "x\n", age_ns=HOUR_NS)
    write(ws / "other.txt", "a\n", age_ns=HOUR_NS)
    before = scan_workspace(roots)
    write(ws / "other.txt", "b\n")
    scandir = os.scandir

    def refuse_sub(path: Any) -> Any:  # as chmod 000 does to anyone but root
        if Path(path) == ws / "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse_sub)
    event = await record(store, before, roots)
    assert set(by_path(event)) == {f"{PREFIX}/other.txt"}
    assert payload(event)["summary"]["truncated"] is True


def test_memory_while_diffing_stays_within_the_limits_not_the_changes(ws, roots):
    limits = WorkspaceChangeLimits(max_files=5, max_total_diff_bytes=64 * 1024)
    before = scan_workspace(roots, limits=limits)
    body = ("x" * 63 + "\n") * 1600  # 100 KiB each: 12.5 MiB of new text in all
    for i in range(128):
        write(ws / f"f{i:03}.txt", body)
    tracemalloc.start()
    try:
        event = diff_workspace(before, roots, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert payload(event)["summary"]["created"] == 128
    assert len(payload(event)["files"]) == 5
    # One file and its diff at a time, plus what the event keeps: far below all the changes.
    assert peak < 2 * 1024 * 1024, peak
