"""``PostgresRunEventStore``: one journal shared by many processes on many machines.

The only module that imports psycopg. Seq numbers come from a per-thread counter row, updated
under a transaction-level advisory lock on the thread, so concurrent writers anywhere keep seq
unique, gap-free and increasing in commit order. On an autocommit session at READ COMMITTED (the
store's own are set so) a write of events alone is one statement, its own transaction; any other
write (run summaries, ``put_if_absent``, a caller's session set otherwise) is one transaction
whose statements, on a libpq with pipeline mode, travel in a single round trip. Content and
metadata are ``json`` columns, which keep the normalised text verbatim (``jsonb`` would reorder
keys and turn -0.0 into 0), so they read back as on every other backend. Statement triggers keep
per-thread, per-user message counts, so ``count_messages`` does not grow with the thread. A row
PostgreSQL can never hold (a data exception, a program limit such as an index entry's size) is
refused with ``EventRefused``. A connection the server closed (a restart) has the pool check its
idle ones, and work safe to repeat (reads, journal batches under their id, setup) runs again on
a fresh one; other errors pass through as psycopg raised them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, Self, TypeVar

try:
    from psycopg import (
        AsyncConnection,
        AsyncCursor,
        Capabilities,
        DataError,
        Error,
        ProgrammingError,
    )
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.rows import TupleRow, tuple_row
    from psycopg_pool import AsyncConnectionPool
except ImportError as exc:
    raise ImportError(
        "PostgresRunEventStore needs psycopg 3 and psycopg-pool; install them with "
        "pip install 'deerflow-journal[postgres]'"
    ) from exc

from deerflow_journal.catalog import MIDDLEWARE_EVENT_PATTERN
from deerflow_journal.records import (
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    EventRefused,
    PendingEvent,
    RunEvent,
    decode_json,
    encode_json,
    make_record,
    normalise_created_at,
    some_names,
)
from deerflow_journal.stores.base import (
    AI_RESPONSE_EVENT_TYPES,
    BATCH_IDS_KEPT,
    BATCH_IDS_PRUNED_EVERY,
    EventQuery,
    MessagePage,
    RunEventStore,
    Schema,
    Statements,
    Write,
    Written,
    run_statements,
)
from deerflow_journal.stores.browsing import SummaryQuery, ThreadInfo, ThreadQuery
from deerflow_journal.summary import other_users_summary_error

__all__ = ["MIGRATIONS", "PostgresRunEventStore"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Schema migrations; the index of a statement in this list is its schema version.
MIGRATIONS: tuple[str, ...] = (
    """CREATE TABLE run_events (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL,
        run_id text NOT NULL,
        seq bigint NOT NULL,
        event_type varchar(32) NOT NULL,
        category varchar(16) NOT NULL,
        content jsonb NOT NULL,
        metadata jsonb NOT NULL,
        created_at timestamptz NOT NULL,
        user_id text,
        task_id text,
        caller text,
        CONSTRAINT run_events_thread_seq UNIQUE (thread_id, seq)
    )""",
    "CREATE INDEX run_events_thread_category_seq ON run_events (thread_id, category, seq)",
    "CREATE INDEX run_events_thread_run_seq ON run_events (thread_id, run_id, seq)",
    """CREATE INDEX run_events_thread_run_task_seq ON run_events (thread_id, run_id, task_id, seq)
        WHERE task_id IS NOT NULL""",
    """CREATE INDEX run_events_thread_user_category_seq
        ON run_events (thread_id, user_id, category, seq) WHERE user_id IS NOT NULL""",
    """CREATE INDEX run_events_thread_user_run_seq
        ON run_events (thread_id, user_id, run_id, seq) WHERE user_id IS NOT NULL""",
    "CREATE TABLE run_thread_seq (thread_id text PRIMARY KEY, last_seq bigint NOT NULL)",
    """CREATE TABLE run_summaries (
        id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        thread_id text NOT NULL,
        run_id text NOT NULL,
        user_id text,
        data jsonb NOT NULL,
        PRIMARY KEY (thread_id, run_id)
    )""",
    # json keeps the text as written: key order and -0.0 read back as on every backend. Rows
    # written before keep the order jsonb gave them.
    """ALTER TABLE run_events ALTER COLUMN content TYPE json USING content::json,
        ALTER COLUMN metadata TYPE json USING metadata::json""",
    "ALTER TABLE run_summaries ALTER COLUMN data TYPE json USING data::json",
    # Message counts per thread and user ('' for rows without one, never a valid user id).
    """CREATE TABLE run_message_counts (
        thread_id text NOT NULL,
        user_key text NOT NULL,
        messages bigint NOT NULL,
        PRIMARY KEY (thread_id, user_key)
    )""",
    # One upsert per statement and (thread, user), whoever inserts or deletes rows.
    """CREATE FUNCTION run_events_count_messages() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO run_message_counts AS c (thread_id, user_key, messages)
        SELECT thread_id, coalesce(user_id, ''),
               CASE TG_OP WHEN 'INSERT' THEN count(*) ELSE -count(*) END
        FROM changed WHERE category = 'message' GROUP BY 1, 2
        ON CONFLICT (thread_id, user_key) DO UPDATE SET messages = c.messages + excluded.messages;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER run_events_count_messages AFTER INSERT ON run_events
        REFERENCING NEW TABLE AS changed
        FOR EACH STATEMENT EXECUTE FUNCTION run_events_count_messages()""",
    """CREATE TRIGGER run_events_uncount_messages AFTER DELETE ON run_events
        REFERENCING OLD TABLE AS changed
        FOR EACH STATEMENT EXECUTE FUNCTION run_events_count_messages()""",
    # The triggers' lock on run_events holds off writers until this commits: the counts are exact.
    """INSERT INTO run_message_counts (thread_id, user_key, messages)
        SELECT thread_id, coalesce(user_id, ''), count(*) FROM run_events
        WHERE category = 'message' GROUP BY 1, 2""",
    # The latest journal batch ids, recorded with their batch: a retried batch the database
    # took already (its answer lost with the connection) is not written twice.
    """CREATE TABLE run_journal_batches (
        n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        batch_id text NOT NULL UNIQUE
    )""",
    # Each thread's last event and run count, over every user's rows (user_key '', never a
    # user id) and over each user's: list_threads reads a page of it, newest first. Thread ids
    # order by code point (COLLATE "C"), as on every backend.
    """CREATE TABLE run_threads (
        user_key text NOT NULL,
        thread_id text NOT NULL,
        last_seq bigint NOT NULL,
        last_event_at timestamptz NOT NULL,
        run_count bigint NOT NULL,
        PRIMARY KEY (user_key, thread_id)
    )""",
    """CREATE INDEX run_threads_recent
        ON run_threads (user_key, last_event_at, thread_id COLLATE "C")""",
    # One upsert per statement: the newest row of each thread (and user) is its last, and a run
    # counts when none of its rows came before the statement's.
    """CREATE FUNCTION run_events_thread_added() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        WITH keyed AS (
            SELECT '' AS user_key, thread_id, run_id, seq, created_at FROM added
            UNION ALL
            SELECT user_id, thread_id, run_id, seq, created_at FROM added
            WHERE user_id IS NOT NULL
        ), last AS (
            SELECT DISTINCT ON (user_key, thread_id) user_key, thread_id, seq, created_at
            FROM keyed ORDER BY user_key, thread_id, seq DESC
        ), new_runs AS (
            SELECT r.user_key, r.thread_id, count(*) AS runs
            FROM (SELECT user_key, thread_id, run_id, min(seq) AS first_seq
                  FROM keyed GROUP BY 1, 2, 3) AS r
            WHERE NOT EXISTS (
                SELECT 1 FROM run_events AS e
                WHERE e.thread_id = r.thread_id AND e.run_id = r.run_id
                  AND e.seq < r.first_seq AND (r.user_key = '' OR e.user_id = r.user_key))
            GROUP BY 1, 2
        )
        INSERT INTO run_threads AS t (user_key, thread_id, last_seq, last_event_at, run_count)
        SELECT l.user_key, l.thread_id, l.seq, l.created_at, coalesce(n.runs, 0)
        FROM last AS l LEFT JOIN new_runs AS n USING (user_key, thread_id)
        ON CONFLICT (user_key, thread_id) DO UPDATE SET
            last_seq = excluded.last_seq,
            last_event_at = excluded.last_event_at,
            run_count = t.run_count + excluded.run_count;
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER run_events_thread_added AFTER INSERT ON run_events
        REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION run_events_thread_added()""",
    # A run without rows left stops counting, a thread without rows goes, and each thread
    # (and user) the statement touched takes its last remaining row as its last event.
    """CREATE FUNCTION run_events_thread_removed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        WITH gone AS (
            SELECT r.user_key, r.thread_id, count(*) AS runs
            FROM (SELECT DISTINCT '' AS user_key, thread_id, run_id FROM removed
                  UNION
                  SELECT user_id, thread_id, run_id FROM removed
                  WHERE user_id IS NOT NULL) AS r
            WHERE NOT EXISTS (
                SELECT 1 FROM run_events AS e
                WHERE e.thread_id = r.thread_id AND e.run_id = r.run_id
                  AND (r.user_key = '' OR e.user_id = r.user_key))
            GROUP BY 1, 2
        )
        UPDATE run_threads AS t SET run_count = t.run_count - gone.runs FROM gone
        WHERE t.user_key = gone.user_key AND t.thread_id = gone.thread_id;
        DELETE FROM run_threads AS t
        WHERE t.run_count <= 0 AND (t.user_key, t.thread_id) IN (
            SELECT '', thread_id FROM removed
            UNION
            SELECT user_id, thread_id FROM removed WHERE user_id IS NOT NULL);
        UPDATE run_threads AS t SET (last_seq, last_event_at) = (
            SELECT e.seq, e.created_at FROM run_events AS e
            WHERE e.thread_id = t.thread_id AND (t.user_key = '' OR e.user_id = t.user_key)
            ORDER BY e.seq DESC LIMIT 1)
        WHERE (t.user_key, t.thread_id) IN (
            SELECT '', thread_id FROM removed
            UNION
            SELECT user_id, thread_id FROM removed WHERE user_id IS NOT NULL);
        RETURN NULL;
    END $$""",
    """CREATE TRIGGER run_events_thread_removed AFTER DELETE ON run_events
        REFERENCING OLD TABLE AS removed
        FOR EACH STATEMENT EXECUTE FUNCTION run_events_thread_removed()""",
    # Filled from the rows already there (the triggers' lock on run_events holds off writers),
    # replacing whatever an earlier version's writes left.
    """INSERT INTO run_threads AS t (user_key, thread_id, last_seq, last_event_at, run_count)
    SELECT k.user_key, k.thread_id, k.seq, e.created_at, k.runs
    FROM (
        SELECT '' AS user_key, thread_id, max(seq) AS seq, count(DISTINCT run_id) AS runs
        FROM run_events GROUP BY thread_id
        UNION ALL
        SELECT user_id, thread_id, max(seq), count(DISTINCT run_id)
        FROM run_events WHERE user_id IS NOT NULL GROUP BY user_id, thread_id
    ) AS k JOIN run_events AS e ON e.thread_id = k.thread_id AND e.seq = k.seq
    ON CONFLICT (user_key, thread_id) DO UPDATE SET
        last_seq = excluded.last_seq,
        last_event_at = excluded.last_event_at,
        run_count = excluded.run_count""",
    # Summaries newest first: a run's start time ('-infinity' when unknown) and status, set from
    # its data by a trigger (a cast to timestamptz is not immutable, so no generated column).
    """ALTER TABLE run_summaries
        ADD COLUMN started_at timestamptz NOT NULL DEFAULT '-infinity',
        ADD COLUMN status text""",
    # A start time without an offset is UTC, as on every backend.
    """CREATE FUNCTION run_summaries_sort_columns() RETURNS trigger LANGUAGE plpgsql
    SET timezone = 'UTC' AS $$
    BEGIN
        NEW.started_at := coalesce((NEW.data ->> 'started_at')::timestamptz, '-infinity');
        NEW.status := NEW.data ->> 'status';
        RETURN NEW;
    END $$""",
    """CREATE TRIGGER run_summaries_sort_columns BEFORE INSERT OR UPDATE ON run_summaries
        FOR EACH ROW EXECUTE FUNCTION run_summaries_sort_columns()""",
    "UPDATE run_summaries SET data = data",
    """CREATE INDEX run_summaries_recent
        ON run_summaries (started_at, thread_id COLLATE "C", run_id COLLATE "C")""",
    """CREATE INDEX run_summaries_status_recent
        ON run_summaries (status, started_at, thread_id COLLATE "C", run_id COLLATE "C")""",
    """CREATE INDEX run_summaries_user_recent
        ON run_summaries (user_id, started_at, thread_id COLLATE "C", run_id COLLATE "C")
        WHERE user_id IS NOT NULL""",
    """CREATE INDEX run_summaries_user_status_recent
        ON run_summaries (user_id, status, started_at, thread_id COLLATE "C", run_id COLLATE "C")
        WHERE user_id IS NOT NULL""",
    # A session plans a trigger's queries once and keeps the plan: one made while run_events
    # was small (reading all of it) made every later write read the whole table. Index
    # lookups are the right plan at every size, so the triggers' queries use nothing else.
    """ALTER FUNCTION run_events_thread_added()
        SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off""",
    """ALTER FUNCTION run_events_thread_removed()
        SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off""",
    # Without hash and merge joins, joining a statement's threads to their new runs took time
    # growing with the square of their number. Each run's earlier rows are now looked up
    # per run (a subquery in a FILTER, which stays a per-row lookup), so only sequential
    # scans need to be ruled out.
    """CREATE OR REPLACE FUNCTION run_events_thread_added() RETURNS trigger LANGUAGE plpgsql
    SET enable_seqscan = off AS $$
    BEGIN
        WITH keyed AS (
            SELECT '' AS user_key, thread_id, run_id, seq, created_at FROM added
            UNION ALL
            SELECT user_id, thread_id, run_id, seq, created_at FROM added
            WHERE user_id IS NOT NULL
        ), last AS (
            SELECT DISTINCT ON (user_key, thread_id) user_key, thread_id, seq, created_at
            FROM keyed ORDER BY user_key, thread_id, seq DESC
        ), runs AS (
            SELECT r.user_key, r.thread_id, count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM run_events AS e
                WHERE e.thread_id = r.thread_id AND e.run_id = r.run_id
                  AND e.seq < r.first_seq AND (r.user_key = '' OR e.user_id = r.user_key)
            )) AS runs
            FROM (SELECT user_key, thread_id, run_id, min(seq) AS first_seq
                  FROM keyed GROUP BY 1, 2, 3) AS r
            GROUP BY 1, 2
        )
        INSERT INTO run_threads AS t (user_key, thread_id, last_seq, last_event_at, run_count)
        SELECT l.user_key, l.thread_id, l.seq, l.created_at, n.runs
        FROM last AS l JOIN runs AS n USING (user_key, thread_id)
        ON CONFLICT (user_key, thread_id) DO UPDATE SET
            last_seq = excluded.last_seq,
            last_event_at = excluded.last_event_at,
            run_count = t.run_count + excluded.run_count;
        RETURN NULL;
    END $$""",
)

_SCHEMA = Schema(
    [(statement,) for statement in MIGRATIONS],
    find_table="SELECT 1 WHERE to_regclass('run_event_migrations') IS NOT NULL",
    create_table="""CREATE TABLE IF NOT EXISTS run_event_migrations (
        v integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())""",
    read_version="SELECT max(v) FROM run_event_migrations",
    record_version="INSERT INTO run_event_migrations (v) VALUES (%s)",
)
_RECORD_BATCH = """INSERT INTO run_journal_batches (batch_id) VALUES (%s)
    ON CONFLICT (batch_id) DO NOTHING RETURNING n"""
_FORGET_OLD_BATCHES = "DELETE FROM run_journal_batches WHERE n <= %s"
# Advisory lock keys: one for migrations, and per thread a 64-bit hash of its id.
_SETUP_LOCK_KEY = 0x6465657266_6A6E  # "deerf" "jn"
_THREAD_LOCK_SEED = 0x6A6F75726E616C  # "journal"
_LOCK_THREADS = f"""SELECT pg_advisory_xact_lock(k) FROM (
    SELECT DISTINCT hashtextextended(t, {_THREAD_LOCK_SEED}) AS k FROM unnest(%s::text[]) AS t
    ORDER BY k) AS keys"""

# created_at is read as a naive UTC timestamp: psycopg converts a timestamptz to the session
# time zone, which cannot hold the extreme years (9999-12-31T23:59:59Z in Tokyo is year 10000).
_COLUMNS = (
    "thread_id, run_id, seq, event_type, category, content::text, metadata::text, "
    "created_at AT TIME ZONE 'UTC', user_id"
)


# A write of events: each thread's counter moves on by its events, which take the seqs before.
# In a transaction the thread locks come first (``_lock_threads``). ``locked`` makes it one
# autocommitted statement: it takes the locks itself before the counter upsert, which waits
# for them (reading ``l``, or for a batch through an InitPlan counting it), and the triggers'
# queries, each with a snapshot of its own, see every write committed before the locks were
# granted. That holds at READ COMMITTED only: at another level the statement writes nothing
# and returns no row. With ``batch`` a batch recorded already writes nothing and returns no
# row either; the rows end with the batch's number otherwise.
def _insert_sql(*, single: bool, locked: bool, batch: bool) -> str:
    """The insert of one event (scalar parameters) or of a batch (arrays, in order)."""
    recorded = f"AND {_AT_READ_COMMITTED}" + (" AND EXISTS (SELECT 1 FROM rec)" if batch else "")
    ctes = [_RECORD_BATCH_CTE] if batch else []
    batch_n = ", (SELECT n FROM rec)" if batch else ""
    if single:
        if locked:
            ctes.append(f"""l AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended(%(thread)s, {_THREAD_LOCK_SEED}))
    WHERE TRUE {recorded})""")
        ctes.append(f"""c AS (
    INSERT INTO run_thread_seq AS t (thread_id, last_seq)
    SELECT %(thread)s, 1 {"FROM l" if locked else ""}
    ON CONFLICT (thread_id) DO UPDATE SET last_seq = t.last_seq + 1
    RETURNING last_seq)""")
        ctes.append("""i AS (
    INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, metadata,
                            created_at, user_id, task_id, caller)
    SELECT %(thread)s, %(run)s, c.last_seq, %(type)s, %(category)s, %(content)s::json,
           %(metadata)s::json, %(at)s::timestamptz, %(user)s, %(task)s, %(caller)s
    FROM c RETURNING seq)""")
        return f"WITH {', '.join(ctes)}\nSELECT seq{batch_n} FROM i"
    arrays = ", ".join(f"%({column})b::text[]" for column in _INSERT_PARAMS)
    ctes.append(f"""b AS (
    SELECT * FROM unnest({arrays})
        WITH ORDINALITY AS b (thread_id, run_id, event_type, category, content, metadata,
                              created_at, user_id, task_id, caller, ord))""")
    if locked:
        ctes.append(f"""l AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(k) FROM (
        SELECT DISTINCT hashtextextended(thread_id, {_THREAD_LOCK_SEED}) AS k FROM b
        WHERE TRUE {recorded} ORDER BY k) AS keys)""")
    ctes.append("n AS (SELECT thread_id, count(*) AS n FROM b GROUP BY thread_id)")
    ctes.append(f"""c AS (
    INSERT INTO run_thread_seq AS t (thread_id, last_seq)
    SELECT thread_id, n FROM n {"WHERE (SELECT count(*) FROM l) > 0" if locked else ""}
    ON CONFLICT (thread_id) DO UPDATE SET last_seq = t.last_seq + excluded.last_seq
    RETURNING thread_id, last_seq)""")
    ctes.append("""i AS (
    INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, metadata,
                            created_at, user_id, task_id, caller)
    SELECT b.thread_id, b.run_id,
           c.last_seq - n.n + row_number() OVER (PARTITION BY b.thread_id ORDER BY b.ord),
           b.event_type, b.category, b.content::json, b.metadata::json,
           b.created_at::timestamptz, b.user_id, b.task_id, b.caller
    FROM b JOIN n USING (thread_id) JOIN c USING (thread_id)
    ORDER BY b.ord)""")
    return f"WITH {', '.join(ctes)}\nSELECT thread_id, last_seq{batch_n} FROM c"


_AT_READ_COMMITTED = "current_setting('transaction_isolation') = 'read committed'"
_RECORD_BATCH_CTE = f"""rec AS (
    INSERT INTO run_journal_batches (batch_id) SELECT %(batch)s WHERE {_AT_READ_COMMITTED}
    ON CONFLICT (batch_id) DO NOTHING RETURNING n)"""
# The insert's parameter names, in ``PendingEvent.columns()`` order.
_INSERT_PARAMS = (
    "thread",
    "run",
    "type",
    "category",
    "content",
    "metadata",
    "at",
    "user",
    "task",
    "caller",
)
# By (single, locked, batch); a batch id is recorded apart in a transaction.
_INSERT = {
    (single, locked, batch): _insert_sql(single=single, locked=locked, batch=batch)
    for single in (True, False)
    for locked, batch in ((False, False), (True, False), (True, True))
}
_FIND_TYPE_IN_RUN = f"""SELECT {_COLUMNS} FROM run_events
    WHERE thread_id = %s AND run_id = %s AND event_type = %s
      AND user_id IS NOT DISTINCT FROM %s::text
    ORDER BY seq LIMIT 1"""
# The caller test is is_middleware_caller in SQL; {user} is filled in per call.
_LAST_VISIBLE_AI = f"""SELECT r.run_id, e.seq FROM unnest(%s::text[]) AS r (run_id)
CROSS JOIN LATERAL (
    SELECT seq FROM run_events
    WHERE thread_id = %s AND run_id = r.run_id AND category = 'message' AND event_type = ANY(%s)
      AND (caller IS NULL OR NOT starts_with(caller, '{MIDDLEWARE_EVENT_PATTERN.prefix}'))
      {{user}}
    ORDER BY seq DESC LIMIT 1
) AS e"""
# A thread's message count: the sum over its users, or one user's ("" holds rows without one).
_COUNT_MESSAGES = (
    "SELECT coalesce(sum(messages), 0)::bigint FROM run_message_counts WHERE thread_id = %s"
)
_DROP_EMPTY_COUNTS = "DELETE FROM run_message_counts WHERE thread_id = %s AND messages = 0"
# Another user's summary is left alone: the statement then returns no row.
_UPSERT_SUMMARY = """INSERT INTO run_summaries (thread_id, run_id, user_id, data)
VALUES (%s, %s, %s, %s::json)
ON CONFLICT (thread_id, run_id) DO UPDATE SET data = excluded.data
WHERE run_summaries.user_id IS NOT DISTINCT FROM excluded.user_id
RETURNING id"""


class PostgresRunEventStore(RunEventStore):
    """Stores events in PostgreSQL through psycopg 3, for any number of writer processes.

    Args:
        dsn_or_pool: A connection string (the store opens, owns and closes its own pool) or an
            open ``psycopg_pool.AsyncConnectionPool`` that the caller owns, for instance the one
            of LangGraph's ``AsyncPostgresSaver``; the store never closes a pool it was given
            and does not depend on its connections' autocommit or row factory settings.
        max_trace_content: Byte limit for trace-category content (``None``: no limit).
        max_outputs_content: Byte limit for outputs-category content, such as ``run.end``'s
            graph state (``None``: no limit).
        read_only: Only read: every write and delete raises ``ReadOnlyStoreError``, setup never
            migrates (it says so when the schema is missing or old), and the sessions of a
            pool the store opens run read-only, so the server refuses writes too; a pool it is
            given stays as the caller made it.
    """

    def __init__(
        self,
        dsn_or_pool: str | AsyncConnectionPool,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
        max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            max_trace_content=max_trace_content,
            max_outputs_content=max_outputs_content,
            read_only=read_only,
        )
        self._probed = False
        #: The loop the pool the store opened itself runs on (its workers are its tasks).
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        if isinstance(dsn_or_pool, AsyncConnectionPool):
            self._dsn: str | None = None
            self._pool: AsyncConnectionPool | None = dsn_or_pool
        elif isinstance(dsn_or_pool, str) and dsn_or_pool:
            _check_dsn(dsn_or_pool)
            self._dsn = _read_only_dsn(dsn_or_pool) if read_only else dsn_or_pool
            self._pool = None
        else:
            raise TypeError(
                "PostgresRunEventStore needs a DSN string or a psycopg_pool.AsyncConnectionPool, "
                f"got {type(dsn_or_pool).__name__}"
            )

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
        max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
    ) -> AsyncIterator[Self]:
        """Open a set-up store with its own pool on ``conn_string``; close it on exit."""
        async with cls(
            conn_string,
            max_trace_content=max_trace_content,
            max_outputs_content=max_outputs_content,
        ) as store:
            yield store

    # -- lifecycle ---------------------------------------------------------------------------

    async def _setup(self) -> None:
        if self._dsn is not None and self._pool_loop is not None and self._pool_loop.is_closed():
            # A setup cut short with its loop left the pool it opened there: unusable.
            self._drop_pool()
        if self._pool is None:
            if not self._probed:
                # One plain connection on the first opening: a wrong DSN fails at once with the
                # server's reason, where the pool would retry quietly until its timeout and
                # then report only that. Reopenings (a journal's own store, between runs) skip it.
                probe = await AsyncConnection.connect(self._dsn or "", autocommit=True)
                await probe.close()
                self._probed = True
            self._pool = await _open_pool(self._dsn)
            self._pool_loop = asyncio.get_running_loop()
        await _SCHEMA.upgrade(
            self._run_statements,
            functools.partial(self._run_statements, migrating=True),
            read_only=self.read_only,
            database="the PostgreSQL database (on its search_path)",
        )

    async def _run_statements(
        self, make: Callable[[], Statements[T]], *, migrating: bool = False
    ) -> T:
        """Run the statements ``make()`` gives in one transaction (``migrating``: under the
        migration lock), again from the start on a new connection if the connection is lost:
        a rolled-back transaction repeats safely."""

        async def work(cur: AsyncCursor[TupleRow]) -> T:
            async with _atomic(cur.connection):
                if migrating:
                    await cur.execute(f"SELECT pg_advisory_xact_lock({_SETUP_LOCK_KEY})")
                return await run_statements(make(), functools.partial(_rows_of, cur))

        return await self._repeatable(work)

    async def _close(self) -> None:
        if self._dsn is not None and self._pool is not None:
            loop = self._pool_loop
            if loop is not None and loop.is_closed():  # it cannot be closed: let go of it
                self._drop_pool()
                return
            pool, self._pool, self._pool_loop = self._pool, None, None
            await pool.close()

    def _let_go_of_closed_loop(self) -> bool:
        # A pool hands out connections through tasks of its loop: once that loop has closed,
        # every request waits for its timeout. Ours is let go and opened again on this loop;
        # one the caller gave cannot be (it is the caller's to open on a live loop).
        if self._dsn is None:
            return False
        self._drop_pool()
        return True

    def _drop_pool(self) -> None:
        """Let go of the pool the store opened on a loop that has closed: its tasks cannot
        run again, so it cannot be closed. Its idle connections' sockets are closed here, and
        its tasks ended quietly (each would say, once collected, that its loop is closed)."""
        pool, self._pool, self._pool_loop = self._pool, None, None
        if pool is None:
            return
        logger.debug("PostgreSQL store reopens its pool: the loop it was opened on has closed")
        # psycopg_pool's own attributes, read if they are there: nothing else reaches them.
        for conn in list(getattr(pool, "_pool", ())):  # idle connections
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
        tasks = [getattr(pool, "_sched_runner", None), *getattr(pool, "_workers", ())]
        for task in tasks:
            if isinstance(task, asyncio.Task) and not task.done():
                with contextlib.suppress(Exception):
                    task._log_destroy_pending = False  # type: ignore[attr-defined]
                with contextlib.suppress(BaseException):
                    task.get_coro().close()  # type: ignore[union-attr]

    @contextlib.asynccontextmanager
    async def _connection(
        self,
    ) -> AsyncIterator[tuple[AsyncConnection[Any], AsyncCursor[TupleRow]]]:
        # Our own cursor and row factory: a shared pool may hand out dict rows.
        assert self._pool is not None
        pool = self._pool
        conn: AsyncConnection[Any] | None = None
        try:
            async with pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
                yield conn, cur
        except Error:
            if conn is not None and conn.closed:
                # A restarted server leaves every idle connection broken: replace them now,
                # not one failed statement each (the pool does not check them on checkout).
                with contextlib.suppress(Exception):
                    await pool.check()
            raise

    async def _repeatable(self, work: Callable[[AsyncCursor[TupleRow]], Awaitable[T]]) -> T:
        """``work(cursor)``, run again while its connection is lost: only work safe to repeat."""
        # A connection checked during a shutdown may die right after: a few attempts, each
        # waiting for the pool to reconnect, rather than one.
        attempt = 1
        while True:
            used: AsyncConnection[Any] | None = None
            try:
                async with self._connection() as (used, cur):
                    return await work(cur)
            except Error:
                if used is None or not used.closed or attempt >= _LOST_CONNECTION_ATTEMPTS:
                    raise
            attempt += 1

    # -- writes ------------------------------------------------------------------------------

    async def _write(self, write: Write) -> Written:
        events, batch_id = write.events, write.batch_id

        async def in_transaction(cur: AsyncCursor[TupleRow]) -> Written:
            conn = cur.connection
            async with _atomic(conn, pipeline=True):
                if batch_id is not None:
                    # Waits for a first attempt still in flight on a dropped connection.
                    await cur.execute(_RECORD_BATCH, (batch_id,))
                    recorded = await cur.fetchone()
                    if recorded is None:
                        return Written([], repeated=True)
                    if recorded[0] % BATCH_IDS_PRUNED_EVERY == 0:
                        await cur.execute(_FORGET_OLD_BATCHES, (recorded[0] - BATCH_IDS_KEPT,))
                if events:
                    await _lock_threads(conn, {e.thread_id for e in events})
                if write.if_absent:
                    key = (events[0].thread_id, events[0].run_id, events[0].event_type)
                    await cur.execute(_FIND_TYPE_IN_RUN, (*key, events[0].user_id))
                    found = await cur.fetchone()
                    if found is not None:
                        return Written([], found=_records([found])[0])
                for summary in write.summaries:
                    await cur.execute(_UPSERT_SUMMARY, _summary_params(summary))
                    if await cur.fetchone() is None:
                        raise other_users_summary_error(summary)
                if events:
                    await cur.execute(
                        _INSERT[len(events) == 1, False, False], _insert_params(events)
                    )
            # Fetched after COMMIT (the insert is the cursor's last statement), so that the
            # insert costs no round trip of its own.
            return Written(_seqs(events, await cur.fetchall()) if events else [])

        async def in_one_statement(cur: AsyncCursor[TupleRow]) -> Written:
            # The store's own sessions autocommit at READ COMMITTED (``_open_pool``); a
            # caller's may be set otherwise, and then take a transaction.
            if cur.connection.autocommit:
                written = await _write_in_one_statement(write, cur)
                if written is not None:
                    return written
            return await in_transaction(cur)

        one_statement = events and not (write.summaries or write.if_absent)
        work = in_one_statement if one_statement else in_transaction
        with _refusing(write):
            if batch_id is None:
                async with self._connection() as (_, cur):
                    return await work(cur)
            # Under its id a batch the lost connection took is not written twice.
            return await self._repeatable(work)

    # -- reads -------------------------------------------------------------------------------

    async def _select(self, sql: str, params: Sequence[Any]) -> list[TupleRow]:
        async def read(cur: AsyncCursor[TupleRow]) -> list[TupleRow]:
            await cur.execute(sql, params)
            return await cur.fetchall()

        return await self._repeatable(read)

    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        where, params = _filters(thread_id, run_id=run_id, user_id=user_id)
        where += " AND category = 'message'"
        if page.before_seq is not None:
            where += " AND seq < %s"
            params.append(page.before_seq)
        if page.after_seq is not None:
            where += " AND seq > %s"
            params.append(page.after_seq)
        order = "DESC" if page.from_end else "ASC"
        sql = f"SELECT {_COLUMNS} FROM run_events WHERE {where} ORDER BY seq {order} LIMIT %s"
        rows = await self._select(sql, [*params, page.limit])
        if page.from_end:
            rows.reverse()
        return _records(rows)

    async def _list_events(self, query: EventQuery) -> list[RunEvent]:
        where, params = _filters(query.thread_id, run_id=query.run_id, user_id=query.user_id)
        if query.event_types is not None:
            where += " AND event_type = ANY(%s::text[])"
            params.append(list(query.event_types))
        if query.task_id is not None:
            where += " AND task_id = %s"
            params.append(query.task_id)
        if query.after_seq is not None:
            where += " AND seq > %s"
            params.append(query.after_seq)
        sql = f"SELECT {_COLUMNS} FROM run_events WHERE {where} ORDER BY seq LIMIT %s"
        return _records(await self._select(sql, [*params, query.limit]))

    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]:
        params: list[Any] = [run_ids, thread_id, list(AI_RESPONSE_EVENT_TYPES)]
        user = ""
        if user_id is not None:
            user = "AND user_id = %s"
            params.append(user_id)
        return dict(await self._select(_LAST_VISIBLE_AI.format(user=user), params))

    async def _count_messages(self, thread_id: str, user_id: str | None) -> int:
        sql, params = _COUNT_MESSAGES, [thread_id]
        if user_id is not None:
            sql, params = f"{sql} AND user_key = %s", [thread_id, user_id]
        return (await self._select(sql, params))[0][0]

    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        where, params = _filters(thread_id, run_id=run_id, user_id=user_id)
        async with self._connection() as (conn, cur), _atomic(conn):
            # Serialised with the thread's appends: both move its message counters.
            await _lock_threads(conn, {thread_id})
            await cur.execute(f"DELETE FROM run_events WHERE {where}", params)
            deleted = cur.rowcount
            await cur.execute(f"DELETE FROM run_summaries WHERE {where}", params)
            await cur.execute(_DROP_EMPTY_COUNTS, (thread_id,))
        return deleted

    # -- run summaries -----------------------------------------------------------------------

    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None:
        where, params = _filters(thread_id, run_id=run_id, user_id=user_id)
        rows = await self._select(f"SELECT data::text FROM run_summaries WHERE {where}", params)
        return _decode(rows[0][0]) if rows else None

    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]:
        where, params = _filters(thread_id, user_id=user_id)
        sql = f"SELECT data::text FROM run_summaries WHERE {where} ORDER BY id"
        return [_decode(row[0]) for row in await self._select(sql, params)]

    # -- browsing ----------------------------------------------------------------------------

    async def _list_threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        params: list[Any] = ["" if query.user_id is None else query.user_id]
        after = ""
        if query.before is not None:
            after = 'AND (last_event_at, thread_id COLLATE "C") < (%s::timestamptz, %s) '
            params += query.before.sort_key
        rows = await self._select(
            "SELECT thread_id, last_seq, last_event_at AT TIME ZONE 'UTC', run_count "
            f"FROM run_threads WHERE user_key = %s {after}"
            'ORDER BY last_event_at DESC, thread_id COLLATE "C" DESC LIMIT %s',
            [*params, query.limit],
        )
        return [
            ThreadInfo(thread_id, last_seq, normalise_created_at(last_event_at), run_count)
            for thread_id, last_seq, last_event_at, run_count in rows
        ]

    async def _list_run_summary_page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        where, params = ["true"], []
        for column, value in (
            ("thread_id", query.thread_id),
            ("status", query.status),
            ("user_id", query.user_id),
        ):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        if query.before is not None:
            where.append(
                '(started_at, thread_id COLLATE "C", run_id COLLATE "C") '
                "< (coalesce(%s::timestamptz, '-infinity'), %s, %s)"
            )
            params += [query.before_started_at, query.before.thread_id, query.before.run_id]
        sql = (
            f"SELECT data::text FROM run_summaries WHERE {' AND '.join(where)} "
            'ORDER BY started_at DESC, thread_id COLLATE "C" DESC, run_id COLLATE "C" DESC '
            "LIMIT %s"
        )
        return [_decode(row[0]) for row in await self._select(sql, [*params, query.limit])]


_PIPELINE = Capabilities().has_pipeline()
#: Attempts of work safe to repeat whose connection the server closed (see ``_repeatable``).
_LOST_CONNECTION_ATTEMPTS = 3


async def _open_pool(dsn: str | None) -> AsyncConnectionPool:
    # Autocommit lets a single statement cost one round trip: every read, and the writes of
    # events alone, which READ COMMITTED makes safe without a transaction around them.
    pool = AsyncConnectionPool(
        dsn or "",
        min_size=1,
        max_size=10,
        open=False,
        kwargs={"autocommit": True},
        configure=_read_committed,
    )
    try:
        await pool.open(wait=True)
    except BaseException:
        await pool.close()
        raise
    return pool


async def _read_committed(conn: AsyncConnection[Any]) -> None:
    """Run the session's transactions at READ COMMITTED whatever the server's default (see
    ``_atomic`` for why writers need it)."""
    await conn.execute("SET default_transaction_isolation = 'read committed'")


async def _write_in_one_statement(write: Write, cur: AsyncCursor[TupleRow]) -> Written | None:
    """Store ``write`` (events only) in one statement on an autocommit session; ``None`` if
    the session is not at READ COMMITTED, which then wrote nothing."""
    events, batch_id = write.events, write.batch_id
    params = _insert_params(events)
    if batch_id is not None:
        params["batch"] = batch_id
    await cur.execute(_INSERT[len(events) == 1, True, batch_id is not None], params)
    rows = await cur.fetchall()
    if not rows:  # a batch recorded already, or a session at another level
        await cur.execute(f"SELECT {_AT_READ_COMMITTED}")
        ((at_read_committed,),) = await cur.fetchall()
        return Written([], repeated=True) if at_read_committed and batch_id else None
    if batch_id is not None and rows[0][-1] % BATCH_IDS_PRUNED_EVERY == 0:
        await cur.execute(_FORGET_OLD_BATCHES, (rows[0][-1] - BATCH_IDS_KEPT,))
    return Written(_seqs(events, rows))


@contextlib.asynccontextmanager
async def _atomic(conn: AsyncConnection[Any], *, pipeline: bool = False) -> AsyncIterator[None]:
    """A transaction at READ COMMITTED, whatever the session's default; with ``pipeline`` its
    statements and COMMIT are sent without waiting.

    The advisory locks only serialise writers if each statement sees what committed before
    it: at REPEATABLE READ the snapshot is taken when the lock is requested, not granted.
    """
    piped = conn.pipeline() if pipeline and _PIPELINE else contextlib.nullcontext()
    async with piped, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        yield


async def _rows_of(cur: AsyncCursor[TupleRow], sql: str, params: Sequence[Any]) -> list[Any]:
    """Run one statement; its rows (none for a statement that returns no rows)."""
    await cur.execute(sql, params or None)  # None: a statement with no parameters is sent as is
    return await cur.fetchall() if cur.description else []


async def _lock_threads(conn: AsyncConnection[Any], thread_ids: set[str]) -> None:
    # Locks are taken in key order so that batches spanning threads cannot deadlock.
    await conn.execute(_LOCK_THREADS, (sorted(thread_ids),))


@contextlib.contextmanager
def _refusing(write: Write) -> Iterator[None]:
    """Raise ``EventRefused`` for an error that says PostgreSQL can never store ``write``.

    Class 22 (data exception) and class 54 (program limit exceeded, an index entry too big):
    retrying cannot help. Anything else, a lost connection say, is raised as it is.
    """
    try:
        yield
    except Error as exc:
        if isinstance(exc, DataError) or (exc.sqlstate or "").startswith("54"):
            reason = exc.diag.message_primary or str(exc)
            # Named only here: a write that succeeds pays nothing for its name.
            raise EventRefused(f"PostgreSQL cannot store {_write_named(write)}: {reason}") from exc
        raise


def _write_named(write: Write) -> str:
    """How an error names what a write holds."""
    events, summaries = write.events, write.summaries
    if len(events) == 1 and not summaries:
        e = events[0]
        return f"event {e.event_type!r} of run {e.run_id!r} in thread {e.thread_id!r}"
    if not events and len(summaries) == 1:
        s = summaries[0]
        return f"the summary of run {s['run_id']!r} in thread {s['thread_id']!r}"
    threads = some_names([repr(t) for t in dict.fromkeys(e.thread_id for e in events)], "thread")
    return f"a write of {len(events)} events (threads {threads}) and {len(summaries)} summaries"


def _filters(
    thread_id: str, *, run_id: str | None = None, user_id: str | None = None
) -> tuple[str, list[Any]]:
    where, params = "thread_id = %s", [thread_id]
    if run_id is not None:
        where += " AND run_id = %s"
        params.append(run_id)
    if user_id is not None:
        where += " AND user_id = %s"
        params.append(user_id)
    return where, params


def _insert_params(events: list[PendingEvent]) -> dict[str, Any]:
    """The parameters of ``_insert_sql``: one event's columns, or the arrays a batch unnests."""
    if len(events) == 1:
        return dict(zip(_INSERT_PARAMS, events[0].columns(), strict=True))
    columns = zip(*(e.columns() for e in events), strict=True)
    return {name: list(column) for name, column in zip(_INSERT_PARAMS, columns, strict=True)}


def _summary_params(summary: dict[str, Any]) -> tuple[Any, ...]:
    return summary["thread_id"], summary["run_id"], summary["user_id"], encode_json(summary)


def _seqs(events: list[PendingEvent], rows: list[TupleRow]) -> list[int]:
    """The events' seqs from the rows of ``_insert_sql``: one event's seq, or each thread's
    last seq after the insert."""
    if len(events) == 1:
        return [rows[0][0]]
    next_seq = {row[0]: row[1] for row in rows}
    for event in events:
        next_seq[event.thread_id] -= 1
    seqs = []
    for event in events:
        seq = next_seq[event.thread_id] = next_seq[event.thread_id] + 1
        seqs.append(seq)
    return seqs


def _records(rows: Iterable[TupleRow]) -> list[RunEvent]:
    """The records of rows of ``_COLUMNS``."""
    return [
        make_record(
            thread,
            run,
            seq,
            type_,
            category,
            _decode(content),
            _decode(meta),
            normalise_created_at(at),
            user,
        )
        for thread, run, seq, type_, category, content, meta, at, user in rows
    ]


def _decode(text: str) -> Any:
    try:
        return decode_json(text)
    except ValueError:
        # Rows written as jsonb (before the json columns) spell floats as long decimals, and
        # orjson reads one near the limit as infinity.
        return json.loads(text)


def _check_dsn(dsn: str) -> None:
    """Refuse a connection string libpq cannot read now, with ``ValueError``, rather than
    with a driver error when the store first connects."""
    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "percent-encoded" in why:  # libpq quotes the token, which may be a password
            why = 'invalid percent-encoded token: "%" not followed by two hex digits'
        hint = (
            " (percent-encode '=' and '&' in a value: options=-csearch_path%3Dmy_schema)"
            if "separator" in why
            else ""
        )
        raise ValueError(f"not a PostgreSQL connection string: {why}{hint}") from None


def _read_only_dsn(dsn: str) -> str:
    """``dsn`` with read-only transactions by default, keeping any ``options`` it has."""
    options = conninfo_to_dict(dsn).get("options")
    read_only = "-c default_transaction_read_only=on"
    return make_conninfo(dsn, options=f"{options} {read_only}" if options else read_only)
