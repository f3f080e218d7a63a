"""``deerflow-journal serve``: a read-only web viewer and JSON API over any store URL.

Needs the ``ui`` extra (``pip install 'deerflow-journal[ui]'``). ``create_app`` builds the
Starlette app; ``serve`` runs it with uvicorn.
"""

from __future__ import annotations

from deerflow_journal.web.app import CONTENT_SECURITY_POLICY, create_app
from deerflow_journal.web.serve import is_loopback, serve

__all__ = ["CONTENT_SECURITY_POLICY", "create_app", "is_loopback", "serve"]
