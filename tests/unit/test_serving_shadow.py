"""The shadow's pure parts: what an /admin/shadow body may ask for, which requests are mirrored,
the top-k an answer logs, and what a fleet that cannot run the shadow means for the release."""

from __future__ import annotations

import numpy as np
import pytest

from core.gate.shadow import shadow_unavailable
from relay.settings import Settings
from relay.types import Verdict
from serving.routing import RoutingTable
from serving.schema import RequestRejected
from serving.shadow import mirrored, shadow_setting, top_k


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"share": 0.9, "lease_s": 30}, "RELAY_SERVING_SHADOW_MAX_SHARE"),
        ({"share": -0.1, "lease_s": 30}, "'share'"),
        ({"share": "a lot", "lease_s": 30}, "'share'"),
        ({"share": 0.2, "max_queue": 10_000, "lease_s": 30}, "RELAY_SERVING_SHADOW_MAX_QUEUE"),
        ({"share": 0.2, "max_queue": 1.5, "lease_s": 30}, "max_queue"),
        ({"share": 0.2}, "lease_s"),
        ({"share": 0.2, "lease_s": 10_000}, "RELAY_SERVING_CANARY_LEASE_MAX_S"),
    ],
)
def test_a_bad_shadow_body_is_refused_naming_the_field(body: dict, names: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        shadow_setting(body, Settings(), now=100.0)
    assert refused.value.status == 400 and names in refused.value.detail


def test_a_shadow_body_takes_the_settings_defaults_and_share_zero_stops_it() -> None:
    setting = shadow_setting({"lease_s": 30}, Settings(), now=100.0)
    assert setting is not None
    assert (setting.share, setting.max_queue, setting.until) == (0.2, 32, 130.0)
    assert shadow_setting({"share": 0}, Settings(), now=100.0) is None


def test_the_mirrored_share_is_the_asked_one_and_stable_per_request() -> None:
    ids = [f"w-{i:x}" for i in range(20_000)]
    chosen = [mirrored(i, 0.2) for i in ids]
    assert sum(chosen) / len(ids) == pytest.approx(0.2, abs=0.01)
    assert chosen == [mirrored(i, 0.2) for i in ids]


def test_an_answers_top_k_is_its_best_scored_item_ids_best_first() -> None:
    raw = np.zeros((4, 27))
    raw[:, 0] = [11, 12, 13, 14]  # item ids lead the raw rows
    assert top_k(raw, np.array([0.1, 0.9, 0.5, 0.7]), 3) == [12, 14, 13]


def test_an_injection_share_holds_that_share_of_requests() -> None:
    table = RoutingTable().with_latency("canary", 30.0, share=0.1)
    held = [table.injection("canary").applies(f"r-{i}") for i in range(10_000)]
    assert sum(held) / len(held) == pytest.approx(0.1, abs=0.01)
    with pytest.raises(RequestRejected, match="mode hold or cpu only"):
        RoutingTable().with_latency("canary", 30.0, mode="engine", stage="compute", share=0.5)


def test_workers_too_old_for_the_shadow_are_inconclusive_and_a_missing_candidate_an_error() -> None:
    ok = ("http://a", 200, "", "")
    old = ("http://b", 404, "http_404", "Not Found")
    missing = ("http://b", 409, "no_canary", "no canary is loaded")
    assert shadow_unavailable([ok, ok]) is None
    too_old = shadow_unavailable([ok, old])
    assert too_old is not None and too_old.verdict is Verdict.inconclusive
    assert "too old for the shadow (404" in too_old.reason and "http://b" in too_old.reason
    not_loaded = shadow_unavailable([ok, missing])
    assert not_loaded is not None and not_loaded.verdict is Verdict.error
    assert "not loaded into the canary slot" in not_loaded.reason
