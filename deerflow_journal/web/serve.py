"""Running the viewer: loopback unless the caller says the server is exposed on purpose."""

from __future__ import annotations

import ipaddress

import uvicorn

from deerflow_journal.web.app import create_app

__all__ = ["LOOPBACK_NAMES", "is_loopback", "serve"]

#: Host names that always mean this machine.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    url: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    user_id: str | None = None,
    expose: bool = False,
    poll_interval: float = 1.0,
) -> None:
    """Serve the viewer of the store at ``url`` until interrupted.

    A host other than loopback needs ``expose=True``: the journal holds prompts and model
    output, and the viewer has no login. On loopback, only requests naming this machine are
    answered (a page elsewhere cannot reach the server by rebinding a name of its own to it).
    """
    if not is_loopback(host) and not expose:
        raise PermissionError(
            f"{host} is not a loopback address: the viewer has no login, so anyone who can "
            "reach it reads the journal; pass --expose to serve it there anyway"
        )
    allowed = None if expose else [*LOOPBACK_NAMES, host]
    app = create_app(url, user_id=user_id, allowed_hosts=allowed, poll_interval=poll_interval)
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)
