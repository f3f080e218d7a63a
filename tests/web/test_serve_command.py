"""``deerflow-journal serve`` mistakes: one line naming the fix, exit status 1, no server."""

from __future__ import annotations

import pytest

from deerflow_journal.web import is_loopback, serve
from tests.test_cli import cli, mistake


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "example.com"])
def test_a_host_off_loopback_needs_expose(host: str, tmp_path):
    line = mistake("--url", f"sqlite:///{tmp_path / 'j.db'}", "serve", "--host", host)
    assert line.startswith(f"deerflow-journal: error: {host} is not a loopback address")
    assert "--expose" in line
    with pytest.raises(PermissionError, match="--expose"):
        serve(f"sqlite:///{tmp_path / 'j.db'}", host=host)


def test_loopback_hosts():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "localhost.example.com"):
        assert not is_loopback(host), host


def test_a_missing_journal_is_one_line(tmp_path):
    line = mistake("--url", f"sqlite:///{tmp_path / 'none.db'}", "serve", "--port", "1")
    assert "no SQLite journal at" in line and "--url" in line


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--port", "70000"], "at most 65535"), (["--user", ""], "--user must be 1 to")],
)
def test_bad_arguments_are_refused(args: list[str], says: str, tmp_path):
    done = cli("--url", f"sqlite:///{tmp_path / 'j.db'}", "serve", *args)
    assert done.returncode == 2 and says in done.stderr
