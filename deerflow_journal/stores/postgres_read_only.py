"""``ReadOnlyPostgresRunEventStore``: a PostgreSQL journal opened only to read.

On a connection string its sessions run with ``default_transaction_read_only`` on, so the
server refuses writes too; a pool it is given stays the caller's, unchanged (the store still
refuses every write itself). Setup never migrates: it checks that the schema is there and
current first, and says so when it is not.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from deerflow_journal.records import DEFAULT_MAX_TRACE_CONTENT
from deerflow_journal.stores.postgres import MIGRATIONS, PostgresRunEventStore

__all__ = ["ReadOnlyPostgresRunEventStore"]

_READ_ONLY_OPTION = "-c default_transaction_read_only=on"


class ReadOnlyPostgresRunEventStore(PostgresRunEventStore):
    """A ``PostgresRunEventStore`` that only reads (``open_store(url, read_only=True)``)."""

    def __init__(
        self,
        dsn_or_pool: str | AsyncConnectionPool,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
    ) -> None:
        if isinstance(dsn_or_pool, str) and dsn_or_pool:
            dsn_or_pool = _read_only_dsn(dsn_or_pool)
        super().__init__(dsn_or_pool, max_trace_content=max_trace_content)
        self._read_only = True
        self._schema_source = dsn_or_pool

    async def _setup(self) -> None:
        await self._check_schema()
        await super()._setup()  # the schema is current, so this opens the pool and runs no DDL

    async def _check_schema(self) -> None:
        source = self._schema_source
        if isinstance(source, AsyncConnectionPool):
            async with source.connection() as conn:
                version = await _schema_version(conn)
        else:
            async with await AsyncConnection.connect(source, autocommit=True) as conn:
                version = await _schema_version(conn)
        if version < len(MIGRATIONS) - 1:
            found = "no journal schema" if version < 0 else f"journal schema version {version}"
            raise RuntimeError(
                f"the PostgreSQL database has {found} (on its search_path), not version "
                f"{len(MIGRATIONS) - 1}: open it once without read_only to create or migrate it"
            )


async def _schema_version(conn: AsyncConnection) -> int:
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute("SELECT to_regclass('run_event_migrations') IS NOT NULL")
        if not (await cur.fetchone() or (False,))[0]:
            return -1
        await cur.execute("SELECT coalesce(max(v), -1) FROM run_event_migrations")
        return (await cur.fetchone() or (-1,))[0]


def _read_only_dsn(dsn: str) -> str:
    """``dsn`` with read-only transactions by default, keeping any ``options`` it has."""
    options = conninfo_to_dict(dsn).get("options")
    return make_conninfo(
        dsn, options=f"{options} {_READ_ONLY_OPTION}" if options else _READ_ONLY_OPTION
    )
