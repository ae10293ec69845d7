"""drift-watch as a real flow run: a planted device-mix shift in the served impressions fails the
window, names device_type, records the verdict and alerts once; the cool-down holds the next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

import logstore
from core.data.validation import window_ending
from core.training.model import TrainConfig
from logstore.events import insert_events
from model_store import open_store
from relay.settings import get_settings
from relay.types import Verdict
from relay_testing.versions import train_and_publish
from simulation.drift import Drift, apply_drift
from simulation.shop import ShopConfig, generate_events
from tests.integration.test_guard_quality import serve_labelled

pytestmark = pytest.mark.slow
WINDOW_END = datetime(2025, 3, 8, tzinfo=UTC)  # no other test reads this week of events


@pytest.fixture(scope="module")
def watched(prefect_harness: Any, settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A champion trained on a week of events, and drifted impressions served a minute ago."""
    root = tmp_path_factory.mktemp("drift-flow")
    window = window_ending(WINDOW_END, 7)
    frame = generate_events(ShopConfig(), 30_000, WINDOW_END, days=7, chunk=41)
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    insert_events(client, frame)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELAY_MODEL_STORE_URL", f"file://{root / 'store'}")
        get_settings.cache_clear()
        store = open_store(get_settings())
        manifest, _ = train_and_publish(
            store, frame, TrainConfig(seed=4, epochs=1), root / "run", str(window)
        )
        store.set_alias("champion", manifest.version, actor="test", reason="released")
        live = generate_events(ShopConfig(), 6_000, datetime.now(UTC), days=0.01, chunk=42)
        drifted = apply_drift(live, Drift("device_mix", 0.5), np.random.default_rng(1))
        serve_labelled(client, drifted, "drift-flow", datetime.now(UTC) - timedelta(minutes=1))
        yield manifest
    get_settings.cache_clear()


def test_planted_drift_fails_the_window_and_alerts_once(watched: Any, settings: Any) -> None:
    from flows.drift import drift_watch

    first = drift_watch(window_minutes=3.0, return_state=True)
    assert first.is_completed(), first.message
    gate = first.result()
    assert gate.verdict is Verdict.failed and "device_type" in gate.reason
    second = drift_watch(window_minutes=3.0, return_state=True).result()
    assert second.verdict is Verdict.failed

    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rows = client.query(
        "SELECT kind, verdict, reason FROM release_events "
        "WHERE model_version = {v:String} AND kind IN ('drift', 'drift_alert') ORDER BY ts",
        parameters={"v": watched.version},
    ).result_rows
    assert [(k, v) for k, v, _ in rows] == [
        ("drift", "failed"),
        ("drift_alert", "emitted"),
        ("drift", "failed"),
        ("drift_alert", "suppressed"),
    ]
    assert "cool-down" in rows[-1][2]
