"""ClickHouse: the schema, its migrations, the log writer and the queries. One DSN picks the engine."""

from logstore.client import close_all, connect, migrate, redact

__all__ = ["close_all", "connect", "migrate", "redact"]
