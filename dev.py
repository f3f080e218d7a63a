#!/usr/bin/env python3
"""Project entry point: ``python3 dev.py demo`` runs the journaled example, ``test`` every check.

Both commands create ``.venv`` on first use and install what they need into it: ``demo`` the
package with its ``cost`` extra, ``test`` its ``postgres``, ``otel`` and ``test`` extras too.
They reinstall whenever ``pyproject.toml`` changes, so a fresh clone needs nothing but Python
3.11+ and the registries.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
#: The extras each command needs installed.
EXTRAS = {"demo": ("cost",), "test": ("postgres", "cost", "otel", "test", "ui")}


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env(command: str) -> Path:
    """Create the virtual environment and install what ``command`` needs into it if missing."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be run by an older python3
        sys.exit(f"deerflow-journal needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    python = _venv_python()
    if not python.exists():
        print("creating .venv ...", flush=True)
        venv.create(VENV, with_pip=True)
    stamp = VENV / ".deerflow-journal-installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    spec = install_spec(command, digest, stamp.read_text() if stamp.exists() else "")
    if spec is not None:
        print(f"installing deerflow-journal{spec[1:]} into .venv ...", flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-e",
                spec,
            ],
            cwd=ROOT,
            check=True,
        )
        stamp.write_text(" ".join([digest, *EXTRAS[command]]))
    return python


def install_spec(command: str, digest: str, stamp: str) -> str | None:
    """What ``pip install -e`` needs for ``command``, or ``None`` if ``stamp`` shows it is in.

    The stamp holds the digest of the ``pyproject.toml`` last installed, then its extras.
    """
    installed = stamp.split()
    extras = EXTRAS[command]
    if installed[:1] == [digest] and set(extras) <= set(installed[1:]):
        return None
    return f".[{','.join(extras)}]" if extras else "."


def main(argv: list[str]) -> int:
    """Run the command named by ``argv[0]`` (``demo`` or ``test``) inside ``.venv``."""
    if not argv or argv[0] not in EXTRAS:
        print("usage: python3 dev.py demo | test [pytest arguments]", file=sys.stderr)
        return 2
    python = str(ensure_env(argv[0]))
    if argv[0] == "demo":
        return subprocess.run([python, "examples/quickstart.py", *argv[1:]], cwd=ROOT).returncode
    for check in (["ruff", "check", "."], ["ruff", "format", "--check", "."]):
        code = subprocess.run([python, "-m", *check], cwd=ROOT).returncode
        if code:
            return code
    return subprocess.run([python, "-m", "pytest", *argv[1:]], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
