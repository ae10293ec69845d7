"""Training on served traffic: shoppers click on what a real worker ranked, their feedback joins
the impressions, and a model trained on those labelled events is as good as one trained on
seeded events of the same size
(within 0.04 AUC: a bound sized from the gap's own measured spread)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.training.model import TrainConfig, auc, predict, train_model
from logstore.feedback import feedback_counts, read_labelled_window
from logstore.reading import connect_for_reading
from relay.features import LABEL, to_model_input
from serving.process import start_worker
from simulation.shop import ShopConfig, generate_events
from simulation.traffic import LiveTraffic, drive
from tests.integration.test_serving_logging import logging_worker_env

REQUESTS = 1_500
MAX_AUC_GAP = 0.04  # sized from the gap's measured spread: see the assertion
CANDIDATES = 20


@pytest.mark.slow
def test_a_model_trained_on_feedback_labelled_events_is_within_004_auc_of_seeded(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = logging_worker_env(published_version, settings, tmp_path, flush_ms="100")
    start = datetime.now(UTC) - timedelta(seconds=1)
    with start_worker(env, tmp_path / "worker.log") as worker:
        worker.wait_ready()
        report = drive(
            [worker.http_url],
            LiveTraffic(
                rate_rps=400,
                duration_s=60,
                max_requests=REQUESTS,
                candidates=CANDIDATES,
                concurrency=4,
                seed=5,
                feedback=True,
            ),
        )
    end = datetime.now(UTC) + timedelta(seconds=1)
    assert report.failed == 0 and report.feedback_failed == 0

    client = connect_for_reading(settings.resolved_clickhouse_dsn, tmp_path / "spool")
    served = read_labelled_window(client, start, end)
    served = served[served["session_id"].str.startswith("live-")]
    assert len(served) == report.requests * CANDIDATES
    counts = feedback_counts(client, start, end)
    assert counts.unmatched == 0 and counts.clicks == sum(report.clicks_by_slot.values())
    # one label per clicked (request, item): an item shown twice in a feed is labelled once
    pairs = client.query(
        "SELECT uniqExact(request_id, item_id) FROM feedback "
        "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}",
        parameters={"start": start, "end": end},
    ).result_rows[0][0]
    assert int(served[LABEL].sum()) == pairs

    config = TrainConfig(seed=3, epochs=2)
    # Seeded events of the same size and the same hours of day as the live traffic (the shop
    # draws a live feed's context from the last 0.05 days), and a holdout from the same hours.
    seeded = generate_events(ShopConfig(), len(served), end, days=0.05, chunk=1)
    holdout = generate_events(ShopConfig(), 30_000, end, days=0.05, chunk=2)
    x, y = to_model_input(holdout), holdout[LABEL].to_numpy()
    on_served = auc(y, predict(train_model(served, config).model, x))
    on_seeded = auc(y, predict(train_model(seeded, config).model, x))
    print(f"holdout AUC: trained on served traffic {on_served:.4f}, on seeded {on_seeded:.4f}")
    assert on_seeded > 0.7  # the comparison means something only if the seeded model learned
    # The gap is not zero and not deterministic: the shoppers' clicks are drawn per run and the
    # features follow the clock's hour of day. Measured with this test's own code, its clock
    # shifted 0-22 h in 16 runs (plus 2 plain runs, 0.020 and 0.023): seeded minus served AUC
    # had mean 0.0168, sd 0.0058, range 0.0043-0.0263; served was never better. The bound is
    # the mean plus 4 sd, 0.04: a real regression of served training (0.05 and worse) still fails.
    assert abs(on_served - on_seeded) <= MAX_AUC_GAP
    assert np.isfinite(on_served)
