"""The guard's quality rule runs on served impressions joined with feedback: with enough of them
it is passed or failed on measured AUC, and with too few it says how many it had."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest

import logstore
from core.guard.rules import missing_quality_evidence
from core.training.model import TrainConfig
from logstore.log_tables import FEEDBACK_COLUMNS, IMPRESSION_COLUMNS
from model_store import open_store
from relay.features import FEATURE_NAMES, LABEL
from relay.types import Release, Verdict
from relay_testing.versions import train_and_publish
from simulation.shop import ShopConfig, generate_events
from tasks.guard import GuardLimits, assess_champion_quality

pytestmark = pytest.mark.slow


def serve_labelled(client: Any, frame: pd.DataFrame, tag: str, at: datetime) -> None:
    """Write events as served impressions (20 per request) and their clicks as feedback."""
    n = len(frame)
    request = [f"{tag}-{i // 20}" for i in range(n)]
    impressions = pd.DataFrame(
        {
            "ts": pd.Timestamp(at) + pd.to_timedelta(np.arange(n) // 20, unit="ms"),
            "request_id": request,
            "rank": (np.arange(n) % 20 + 1).astype(np.uint16),
            "slot": "stable",
            "model_version": "v",
            "lineage_id": "l",
            "session_id": frame["session_id"].to_numpy(),
            "score": np.float32(0.0),
            **{name: frame[name].to_numpy() for name in FEATURE_NAMES},
        }
    )
    impressions["position"] = impressions["rank"]
    for name in FEATURE_NAMES[:9]:
        impressions[name] = impressions[name].astype(np.uint64)
    client.insert_df("impressions", impressions[list(IMPRESSION_COLUMNS)])
    clicked = frame[LABEL].to_numpy() == 1
    feedback = pd.DataFrame(
        {
            "ts": pd.Timestamp(at) + pd.Timedelta(seconds=5),
            "feedback_id": [f"{tag}-f{i}" for i in range(int(clicked.sum()))],
            "request_id": np.asarray(request)[clicked],
            "item_id": frame["item_id"].to_numpy()[clicked].astype(np.uint64),
            "event": "click",
            "order_value": 0.0,
        }
    )
    client.insert_df("feedback", feedback[list(FEEDBACK_COLUMNS)])


@pytest.fixture(scope="module")
def guarded(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A store whose champion (trained on shuffled labels) replaced a good baseline."""
    root = tmp_path_factory.mktemp("guard-quality")
    local = settings.model_copy(update={"model_store_url": f"file://{root / 'store'}"})
    store = open_store(local)
    end = datetime(2026, 11, 1, tzinfo=UTC)
    frame = generate_events(ShopConfig(), 12_000, end, chunk=31)
    config = TrainConfig(seed=3, epochs=1)
    good, _ = train_and_publish(store, frame, config, root / "good", "w")
    shuffled = frame.assign(clicked=np.random.default_rng(0).permutation(frame[LABEL].to_numpy()))
    bad, _ = train_and_publish(store, shuffled, config, root / "bad", "w")
    store.set_alias("champion", good.version, actor="test", reason="first release")
    store.set_alias("champion", bad.version, actor="test", reason="second release")
    served = generate_events(ShopConfig(), 6_000, end, chunk=32)
    now = datetime.now(UTC)
    serve_labelled(
        logstore.connect(settings.resolved_clickhouse_dsn),
        served,
        "gq",
        now - timedelta(minutes=10),
    )
    return (
        local,
        Release("guard-quality", bad.version, bad.lineage_id),
        Release("g", good.version, good.lineage_id),
        root,
    )


def test_a_champion_worse_on_labelled_impressions_fails_the_quality_rule(guarded: Any) -> None:
    settings, champion, _, root = guarded
    gate = assess_champion_quality.fn(settings, champion, 1.0, 0.9, GuardLimits(), root / "run")
    assert gate.verdict is Verdict.failed, gate.reason
    assert gate.measurements["labelled_impressions"] >= 6_000
    assert gate.measurements["auc_drop"] > GuardLimits().max_auc_drop


def test_with_too_few_labelled_impressions_the_rule_says_how_many(guarded: Any) -> None:
    settings, champion, _, root = guarded
    limits = GuardLimits(min_labelled_events=10_000_000)
    gate = assess_champion_quality.fn(settings, champion, 1.0, 0.9, limits, root / "run")
    assert gate.verdict is Verdict.inconclusive
    assert "labelled impressions" in gate.reason and "fewer than 10000000" in gate.reason


def test_missing_evidence_is_named() -> None:
    limits = GuardLimits()
    assert "no previous champion" in (missing_quality_evidence(None, 10**6, 10, 24, limits) or "")
    assert "0 clicks" in (missing_quality_evidence("v", 5_000, 0, 24, limits) or "")
    assert missing_quality_evidence("v", 5_000, 100, 24, limits) is None
