"""The SQLite store's schema as a list of migrations; a migration's index is its version.

``SqliteRunEventStore.setup()`` records each applied version in ``run_event_migrations`` and
applies the missing ones in one write transaction (``Schema.upgrade``), so several processes may
set up at once. Append new migrations at the end; never edit one that has shipped.
"""

from __future__ import annotations

from deerflow_journal.stores.base import Schema

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION"]

#: Schema migrations; a migration's index in this list is the schema version it creates.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE run_events (
            id INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event_type TEXT NOT NULL,
            category TEXT NOT NULL,
            content TEXT NOT NULL,
            metadata TEXT NOT NULL,
            created_at TEXT NOT NULL,
            user_id TEXT,
            task_id TEXT,
            caller TEXT,
            UNIQUE (thread_id, seq)
        )""",
        """CREATE TABLE run_thread_seq (
            thread_id TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL
        ) WITHOUT ROWID""",
        # Any insert, by this store or anyone else, must take the thread's next seq.
        """CREATE TRIGGER run_events_next_seq BEFORE INSERT ON run_events
        BEGIN
            SELECT RAISE(ABORT, 'run_events.seq must be run_thread_seq.last_seq + 1')
            WHERE NEW.seq IS NOT coalesce(
                (SELECT last_seq FROM run_thread_seq WHERE thread_id = NEW.thread_id), 0) + 1;
            INSERT INTO run_thread_seq (thread_id, last_seq) VALUES (NEW.thread_id, NEW.seq)
            ON CONFLICT (thread_id) DO UPDATE SET last_seq = excluded.last_seq;
        END""",
        # Rows are append-only in what seq and the message counts depend on.
        """CREATE TRIGGER run_events_fixed_keys
        BEFORE UPDATE OF thread_id, seq, category, user_id ON run_events
        BEGIN
            SELECT RAISE(ABORT, 'run_events rows keep their thread, seq, category and user');
        END""",
        """CREATE TABLE run_message_counts (
            thread_id TEXT NOT NULL,
            user_key TEXT NOT NULL,
            messages INTEGER NOT NULL,
            PRIMARY KEY (thread_id, user_key)
        ) WITHOUT ROWID""",
        """CREATE TRIGGER run_events_count_message AFTER INSERT ON run_events
        WHEN NEW.category = 'message'
        BEGIN
            INSERT INTO run_message_counts (thread_id, user_key, messages)
            VALUES (NEW.thread_id, coalesce(NEW.user_id, ''), 1)
            ON CONFLICT (thread_id, user_key) DO UPDATE SET messages = messages + 1;
        END""",
        """CREATE TRIGGER run_events_uncount_message AFTER DELETE ON run_events
        WHEN OLD.category = 'message'
        BEGIN
            UPDATE run_message_counts SET messages = messages - 1
            WHERE thread_id = OLD.thread_id AND user_key = coalesce(OLD.user_id, '');
        END""",
        "CREATE INDEX run_events_thread_category ON run_events (thread_id, category, seq)",
        "CREATE INDEX run_events_thread_run ON run_events (thread_id, run_id, seq)",
        """CREATE INDEX run_events_thread_run_task
            ON run_events (thread_id, run_id, task_id, seq) WHERE task_id IS NOT NULL""",
        """CREATE INDEX run_events_thread_user_category
            ON run_events (thread_id, user_id, category, seq) WHERE user_id IS NOT NULL""",
    ),
    (
        """CREATE TABLE run_summaries (
            id INTEGER PRIMARY KEY,
            thread_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            user_id TEXT,
            summary TEXT NOT NULL,
            UNIQUE (thread_id, run_id)
        )""",
    ),
    (
        # The latest journal batch ids, recorded with their batch: a retried batch the
        # database took already (its answer lost) is not written twice.
        """CREATE TABLE run_journal_batches (
            n INTEGER PRIMARY KEY,
            batch_id TEXT NOT NULL UNIQUE
        )""",
    ),
)

#: The migrations with the SQL that finds, reads and records the version of a database.
SCHEMA = Schema(
    MIGRATIONS,
    find_table="SELECT 1 FROM sqlite_schema WHERE name = 'run_event_migrations'",
    create_table="CREATE TABLE IF NOT EXISTS run_event_migrations "
    "(v INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    read_version="SELECT max(v) FROM run_event_migrations",
    record_version="INSERT INTO run_event_migrations (v, applied_at) "
    "VALUES (?, strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))",
)

#: The schema version a fully set-up database records.
SCHEMA_VERSION = SCHEMA.version
