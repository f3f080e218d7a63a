"""``RunJournal`` and the pieces it is made of (mapping, usage, outcomes, buffer)."""

from deerflow_journal.journal.handler import RunJournal

__all__ = ["RunJournal"]
