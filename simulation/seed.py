"""Write the simulated shop's events into ClickHouse."""

from __future__ import annotations

from datetime import datetime

from clickhouse_connect.driver.client import Client

from logstore.events import count_window, insert_events
from simulation.shop import ShopConfig, generate_events


def seed_events(
    client: Client,
    n_events: int,
    end: datetime,
    days: float = 7.0,
    config: ShopConfig | None = None,
    chunk_events: int = 500_000,
) -> int:
    """Generate and insert `n_events` over the `days` before `end`, in bounded-memory chunks."""
    if n_events <= 0:
        raise ValueError(f"n_events must be positive, got {n_events}")
    config = config or ShopConfig()
    written = 0
    chunk_index = 0
    while written < n_events:
        n = min(chunk_events, n_events - written)
        # same users and items in every chunk (the seed's), fresh sessions per chunk
        frame = generate_events(config, n, end, days, chunk=chunk_index)
        written += insert_events(client, frame)
        chunk_index += 1
    return written


def ensure_seeded(
    client: Client, start: datetime, end: datetime, min_events: int, n_events: int
) -> int:
    """Seed the window when it holds fewer than `min_events`; return how many were written."""
    if count_window(client, start, end) >= min_events:
        return 0
    return seed_events(client, n_events, end, days=(end - start).total_seconds() / 86_400)
