"""The SQLite store's schema as a list of migrations; a migration's index is its version.

``SqliteRunEventStore.setup()`` records each applied version in ``run_event_migrations`` and
applies the missing ones in one write transaction (``Schema.upgrade``), so several processes may
set up at once. Append new migrations at the end; never edit one that has shipped.
"""

from __future__ import annotations

from deerflow_journal.stores.base import Schema

__all__ = ["MIGRATIONS", "SCHEMA", "SCHEMA_VERSION"]


_NEXT_SEQ = """
            SELECT RAISE(ABORT, 'run_events.seq must be run_thread_seq.last_seq + 1')
            WHERE NEW.seq IS NOT coalesce(
                (SELECT last_seq FROM run_thread_seq WHERE thread_id = NEW.thread_id), 0) + 1;
            INSERT INTO run_thread_seq (thread_id, last_seq) VALUES (NEW.thread_id, NEW.seq)
            ON CONFLICT (thread_id) DO UPDATE SET last_seq = excluded.last_seq;"""


def _thread_added(user_key: str, same_user: str, only_if: str = "") -> str:
    """The body of a trigger that moves the ``user_key`` row of ``run_threads`` on to a new
    row (``same_user`` narrows the probe for the run's earlier rows to that user's;
    ``only_if`` is a further condition of the insert)."""
    return f"""
            UPDATE run_threads SET last_seq = NEW.seq
            WHERE user_key = {user_key} AND thread_id = NEW.thread_id
              AND last_run_id = NEW.run_id AND last_event_at = NEW.created_at;
            INSERT INTO run_threads
                (user_key, thread_id, last_seq, last_event_at, run_count, last_run_id)
            SELECT {user_key}, NEW.thread_id, NEW.seq, NEW.created_at, 1, NEW.run_id
            WHERE changes() = 0{only_if}
            ON CONFLICT (user_key, thread_id) DO UPDATE SET
                last_seq = excluded.last_seq,
                last_event_at = excluded.last_event_at,
                last_run_id = excluded.last_run_id,
                run_count = run_count + (last_run_id IS NOT excluded.last_run_id AND NOT EXISTS (
                    SELECT 1 FROM run_events
                    WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id
                      {same_user}AND seq < NEW.seq));"""


# The user's thread row in a trigger that also runs for rows without a user.
_USER_THREAD_ADDED = _thread_added(
    "NEW.user_id", "AND +user_id = NEW.user_id ", " AND NEW.user_id IS NOT NULL"
)

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
        f"""CREATE TRIGGER run_events_next_seq BEFORE INSERT ON run_events
        BEGIN{_NEXT_SEQ}
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
    (
        # Each thread's last event and run count, over every user's rows (user_key '', never
        # a user id) and over each user's: list_threads reads a page of it, newest first.
        """CREATE TABLE run_threads (
            user_key TEXT NOT NULL,
            thread_id TEXT NOT NULL,
            last_seq INTEGER NOT NULL,
            last_event_at TEXT NOT NULL,
            run_count INTEGER NOT NULL,
            PRIMARY KEY (user_key, thread_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX run_threads_recent ON run_threads (user_key, last_event_at, thread_id)",
        # A new row is its thread's last (seq only grows); its run counts if it is the run's
        # first row. Unary + keeps the probe on the run index, not the per-user one.
        """CREATE TRIGGER run_events_thread_added AFTER INSERT ON run_events
        BEGIN
            INSERT INTO run_threads (user_key, thread_id, last_seq, last_event_at, run_count)
            VALUES ('', NEW.thread_id, NEW.seq, NEW.created_at, 1)
            ON CONFLICT (user_key, thread_id) DO UPDATE SET
                last_seq = excluded.last_seq,
                last_event_at = excluded.last_event_at,
                run_count = run_count + NOT EXISTS (
                    SELECT 1 FROM run_events
                    WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id AND seq < NEW.seq);
        END""",
        # The same for the row's user, in a trigger of its own: rows without one skip it.
        """CREATE TRIGGER run_events_thread_added_for_user AFTER INSERT ON run_events
        WHEN NEW.user_id IS NOT NULL
        BEGIN
            INSERT INTO run_threads (user_key, thread_id, last_seq, last_event_at, run_count)
            VALUES (NEW.user_id, NEW.thread_id, NEW.seq, NEW.created_at, 1)
            ON CONFLICT (user_key, thread_id) DO UPDATE SET
                last_seq = excluded.last_seq,
                last_event_at = excluded.last_event_at,
                run_count = run_count + NOT EXISTS (
                    SELECT 1 FROM run_events
                    WHERE thread_id = NEW.thread_id AND run_id = NEW.run_id
                      AND +user_id = NEW.user_id AND seq < NEW.seq);
        END""",
        # A run whose last row went stops counting, a thread without rows goes, and when its
        # last event goes the one before it is the last.
        """CREATE TRIGGER run_events_thread_removed AFTER DELETE ON run_events
        BEGIN
            UPDATE run_threads SET run_count = run_count - 1
            WHERE user_key = '' AND thread_id = OLD.thread_id AND NOT EXISTS (
                SELECT 1 FROM run_events WHERE thread_id = OLD.thread_id AND run_id = OLD.run_id);
            UPDATE run_threads SET run_count = run_count - 1
            WHERE user_key = OLD.user_id AND thread_id = OLD.thread_id AND NOT EXISTS (
                SELECT 1 FROM run_events
                WHERE thread_id = OLD.thread_id AND run_id = OLD.run_id
                  AND +user_id = OLD.user_id);
            DELETE FROM run_threads
            WHERE user_key IN ('', OLD.user_id) AND thread_id = OLD.thread_id AND run_count = 0;
            UPDATE run_threads SET (last_seq, last_event_at) = (
                SELECT seq, created_at FROM run_events
                WHERE thread_id = OLD.thread_id ORDER BY seq DESC LIMIT 1)
            WHERE user_key = '' AND thread_id = OLD.thread_id AND last_seq = OLD.seq;
            UPDATE run_threads SET (last_seq, last_event_at) = (
                SELECT seq, created_at FROM run_events
                WHERE thread_id = OLD.thread_id AND +user_id = OLD.user_id
                ORDER BY seq DESC LIMIT 1)
            WHERE user_key = OLD.user_id AND thread_id = OLD.thread_id AND last_seq = OLD.seq;
        END""",
        # What the triggers count depends on these too.
        """CREATE TRIGGER run_events_fixed_run_and_time
        BEFORE UPDATE OF run_id, created_at ON run_events
        BEGIN
            SELECT RAISE(ABORT, 'run_events rows keep their run and created_at');
        END""",
        """INSERT INTO run_threads (user_key, thread_id, last_seq, last_event_at, run_count)
        SELECT '', e.thread_id, e.seq, e.created_at, r.runs
        FROM (SELECT thread_id, max(seq) AS seq, count(DISTINCT run_id) AS runs
              FROM run_events GROUP BY thread_id) AS r
        JOIN run_events AS e ON e.thread_id = r.thread_id AND e.seq = r.seq""",
        """INSERT INTO run_threads (user_key, thread_id, last_seq, last_event_at, run_count)
        SELECT e.user_id, e.thread_id, e.seq, e.created_at, r.runs
        FROM (SELECT user_id, thread_id, max(seq) AS seq, count(DISTINCT run_id) AS runs
              FROM run_events WHERE user_id IS NOT NULL GROUP BY user_id, thread_id) AS r
        JOIN run_events AS e ON e.thread_id = r.thread_id AND e.seq = r.seq""",
        # Summaries newest first: the start time as UTC text to the microsecond, which sorts
        # as time does ('' when unknown). A stored summary spells it as pydantic writes it:
        # seconds, then six fraction digits or none, then Z, an offset or nothing (UTC); the
        # fraction is cut off before strftime, which would round it to milliseconds.
        """ALTER TABLE run_summaries ADD COLUMN started_at TEXT
            GENERATED ALWAYS AS (json_extract(summary, '$.started_at')) VIRTUAL""",
        """ALTER TABLE run_summaries ADD COLUMN started_key TEXT GENERATED ALWAYS AS (coalesce(
            strftime('%Y-%m-%dT%H:%M:%S', substr(started_at, 1, 19)
                || substr(started_at,
                          CASE WHEN substr(started_at, 20, 1) = '.' THEN 27 ELSE 20 END))
            || CASE WHEN substr(started_at, 20, 1) = '.' THEN substr(started_at, 20, 7)
                    ELSE '.000000' END,
            '')) VIRTUAL""",
        """ALTER TABLE run_summaries ADD COLUMN status TEXT
            GENERATED ALWAYS AS (json_extract(summary, '$.status')) VIRTUAL""",
        "CREATE INDEX run_summaries_recent ON run_summaries (started_key, thread_id, run_id)",
        """CREATE INDEX run_summaries_status_recent
            ON run_summaries (status, started_key, thread_id, run_id)""",
        # Scoped pages search by user_key: an index on user_id would draw the per-thread
        # summary reads, which filter on user_id, away from their (thread_id, run_id) index.
        """ALTER TABLE run_summaries ADD COLUMN user_key TEXT
            GENERATED ALWAYS AS (coalesce(user_id, '')) VIRTUAL""",
        """CREATE INDEX run_summaries_user_recent
            ON run_summaries (user_key, started_key, thread_id, run_id)""",
        """CREATE INDEX run_summaries_user_status_recent
            ON run_summaries (user_key, status, started_key, thread_id, run_id)""",
    ),
    (
        # Each thread row also names the run of its last event. A batch's rows share a run and
        # a created_at, so most rows then only move last_seq: a plain UPDATE, which neither
        # rewrites the run_threads_recent entry nor probes for the run's earlier rows (an
        # upsert that sets last_event_at does both, for every row).
        "ALTER TABLE run_threads ADD COLUMN last_run_id TEXT",
        """UPDATE run_threads SET last_run_id = (
            SELECT run_id FROM run_events
            WHERE thread_id = run_threads.thread_id AND seq = run_threads.last_seq)""",
        "DROP TRIGGER run_events_thread_added",
        "DROP TRIGGER run_events_thread_added_for_user",
        "DROP TRIGGER run_events_thread_removed",
        # changes() in a trigger's second statement counts the rows of its first: the upsert
        # runs only when the UPDATE found no row to move on. A run is new unless it is the
        # run of the last row, or has an earlier row.
        f"""CREATE TRIGGER run_events_thread_added AFTER INSERT ON run_events
        BEGIN{_thread_added("''", "")}
        END""",
        f"""CREATE TRIGGER run_events_thread_added_for_user AFTER INSERT ON run_events
        WHEN NEW.user_id IS NOT NULL
        BEGIN{_thread_added("NEW.user_id", "AND +user_id = NEW.user_id ")}
        END""",
        # As before, and the row that becomes a thread's last names its run.
        """CREATE TRIGGER run_events_thread_removed AFTER DELETE ON run_events
        BEGIN
            UPDATE run_threads SET run_count = run_count - 1
            WHERE user_key = '' AND thread_id = OLD.thread_id AND NOT EXISTS (
                SELECT 1 FROM run_events WHERE thread_id = OLD.thread_id AND run_id = OLD.run_id);
            UPDATE run_threads SET run_count = run_count - 1
            WHERE user_key = OLD.user_id AND thread_id = OLD.thread_id AND NOT EXISTS (
                SELECT 1 FROM run_events
                WHERE thread_id = OLD.thread_id AND run_id = OLD.run_id
                  AND +user_id = OLD.user_id);
            DELETE FROM run_threads
            WHERE user_key IN ('', OLD.user_id) AND thread_id = OLD.thread_id AND run_count = 0;
            UPDATE run_threads SET (last_seq, last_event_at, last_run_id) = (
                SELECT seq, created_at, run_id FROM run_events
                WHERE thread_id = OLD.thread_id ORDER BY seq DESC LIMIT 1)
            WHERE user_key = '' AND thread_id = OLD.thread_id AND last_seq = OLD.seq;
            UPDATE run_threads SET (last_seq, last_event_at, last_run_id) = (
                SELECT seq, created_at, run_id FROM run_events
                WHERE thread_id = OLD.thread_id AND +user_id = OLD.user_id
                ORDER BY seq DESC LIMIT 1)
            WHERE user_key = OLD.user_id AND thread_id = OLD.thread_id AND last_seq = OLD.seq;
        END""",
    ),
    (
        # The store keeps the counters of its own batches once per batch rather than once per
        # row (sqlite._bookings) and marks their rows booked (1); one trigger keeps them for
        # every other row, such as another program's or an older writer's during an upgrade.
        # Only the store may mark a row. A trigger costs each insert even when its WHEN clause
        # skips it, a BEFORE trigger twice what an AFTER one does: so one AFTER trigger, which
        # checks the seq after the UNIQUE constraint has refused a seq already taken.
        "ALTER TABLE run_events ADD COLUMN booked INTEGER",
        "DROP TRIGGER run_events_next_seq",
        "DROP TRIGGER run_events_count_message",
        "DROP TRIGGER run_events_thread_added",
        "DROP TRIGGER run_events_thread_added_for_user",
        f"""CREATE TRIGGER run_events_added AFTER INSERT ON run_events
        WHEN NEW.booked IS NOT 1
        BEGIN{_NEXT_SEQ}
            INSERT INTO run_message_counts (thread_id, user_key, messages)
            SELECT NEW.thread_id, coalesce(NEW.user_id, ''), 1 WHERE NEW.category = 'message'
            ON CONFLICT (thread_id, user_key) DO UPDATE SET messages = messages + 1;{
            _thread_added("''", "")
        }{_USER_THREAD_ADDED}
        END""",
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
