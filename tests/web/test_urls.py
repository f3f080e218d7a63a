"""How the viewer puts thread and run ids into URL paths (tests/web/test_pages.py follows the
links of awkward ids; tests/web/test_browser.py follows one in a real browser)."""

from __future__ import annotations

import pytest

from deerflow_journal.web.params import ParamError
from deerflow_journal.web.urls import path_id, url


def test_ordinary_ids_keep_their_plain_urls():
    uuid = "0b7e6a6c-3f1e-4c52-9a57-1f0f8d0e9b1c"
    assert url("thread-1") == "/threads/thread-1"
    assert url(uuid, "run_2.b") == f"/threads/{uuid}/runs/run_2.b"
    assert url("team/a 1%") == "/threads/team%2Fa%201%25"


@pytest.mark.parametrize(
    ("id_", "segment"),
    [(".", "~."), ("..", "~.."), ("~", "~~"), ("~..", "~~.."), ("~x", "~~x")],
)
def test_dot_segments_and_ids_starting_with_the_escape_are_escaped(id_: str, segment: str):
    assert url(id_, id_) == f"/threads/{segment}/runs/{segment}"
    assert path_id({"run_id": segment}, "run_id") == id_


def test_an_escape_alone_is_no_id():
    with pytest.raises(ParamError, match="run_id"):
        path_id({"run_id": "~"}, "run_id")
