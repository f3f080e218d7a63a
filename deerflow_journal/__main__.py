"""``python -m deerflow_journal``: the ``deerflow-journal`` command line."""

import sys

from deerflow_journal.cli import main

if __name__ == "__main__":
    sys.exit(main())
