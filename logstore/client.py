"""One ClickHouse client per DSN per process, made on first use (never at import).

chdb allows one engine path per process, so the client is cached rather than re-opened.
"""

from __future__ import annotations

import threading
from urllib.parse import urlparse, urlunparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from logstore.schema import MIGRATIONS
from relay.errors import LogStoreError

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def redact(dsn: str) -> str:
    """The DSN with any password removed, safe for messages and logs."""
    parsed = urlparse(dsn)
    if parsed.password is None:
        return dsn
    netloc = f"{parsed.username}:***@{parsed.hostname}" + (f":{parsed.port}" if parsed.port else "")
    return urlunparse(parsed._replace(netloc=netloc))


def connect(dsn: str) -> Client:
    """The client for a DSN, migrated to the current schema. Raises LogStoreError if unreachable."""
    with _lock:
        client = _clients.get(dsn)
        if client is not None:
            return client
        try:
            # chdb is in-process: a connect timeout only means something for a server
            if dsn.startswith("chdb://"):
                client = clickhouse_connect.get_client(dsn=dsn)
            else:
                client = clickhouse_connect.get_client(dsn=dsn, connect_timeout=5)
            migrate(client)
        except LogStoreError:
            raise
        except Exception as exc:  # the driver raises several types; all mean "cannot use it"
            raise LogStoreError(
                f"ClickHouse at {redact(dsn)} is unreachable or failed: {exc}"
            ) from exc
        _clients[dsn] = client
        return client


def close_all() -> None:
    """Close every cached client (tests switch chdb paths only after this)."""
    with _lock:
        for client in _clients.values():
            client.close()
        _clients.clear()


def migrate(client: Client) -> list[int]:
    """Apply the migrations this database has not seen; return the versions applied now."""
    client.command(
        "CREATE TABLE IF NOT EXISTS schema_migrations "
        "(version UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY version"
    )
    done = {row[0] for row in client.query("SELECT version FROM schema_migrations").result_rows}
    applied = []
    for migration in MIGRATIONS:
        if migration.version in done:
            continue
        for statement in migration.statements:
            client.command(statement)
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name]],
            column_names=["version", "name"],
        )
        applied.append(migration.version)
    return applied
