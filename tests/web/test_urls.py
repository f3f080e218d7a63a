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
    [(".", "~."), ("..", "~.."), ("~.", "~~."), ("~~..", "~~~.."), ("~", "~"), ("~x", "~x")],
)
def test_dot_segments_are_escaped_and_other_ids_kept(id_: str, segment: str):
    """Only ids a URL parser would fold change: a URL built before means what it meant."""
    assert url(id_, id_) == f"/threads/{segment}/runs/{segment}"
    assert path_id({"run_id": segment}, "run_id") == id_


def test_a_bad_id_is_a_param_error():
    with pytest.raises(ParamError, match="run_id"):
        path_id({"run_id": "%09"}, "run_id")
