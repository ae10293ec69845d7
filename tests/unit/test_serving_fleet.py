"""Fleet control against in-memory workers (httpx MockTransport): the two phases and their undo."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from relay.errors import ConfigError
from relay.settings import Settings
from serving.fleet import FleetClient

TOKEN = "t0ken"


@dataclass
class FakeWorker:
    """Just enough of a worker's admin API: slots, weight, and failure switches."""

    url: str
    known: set[str] = field(default_factory=lambda: {"v1", "v2"})
    stable: str | None = "v1"
    canary: str | None = None
    baseline: str | None = None
    weight: int = 0
    lease_s: float | None = None
    renewals: list[float] = field(default_factory=list)
    refuse_loads: bool = False
    max_models: int = 3
    unreachable: bool = False
    calls: list[str] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        slot = lambda v: {"version": v} if v else None  # noqa: E731
        return {
            "ready": self.stable is not None,
            "reason": "ready",
            "slots": {
                "stable": slot(self.stable),
                "canary": slot(self.canary),
                "baseline": slot(self.baseline),
            },
            "canary_weight": self.weight,
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.unreachable:
            raise httpx.ConnectError("connection refused", request=request)
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"error": "unauthorized", "detail": ""})
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.calls.append(path)
        if path == "/admin/load":
            if self.refuse_loads:
                return httpx.Response(422, json={"error": "load_failed", "detail": "disk full"})
            if body["version"] not in self.known:
                return httpx.Response(404, json={"error": "unknown_version", "detail": "no such"})
            held = sum(v is not None for v in (self.stable, self.canary, self.baseline))
            if getattr(self, body["slot"]) is None and held >= self.max_models:
                return httpx.Response(507, json={"error": "no_room", "detail": f"holds {held}"})
            if body["slot"] == "canary":
                self.canary, self.weight = body["version"], 0
            elif body["slot"] == "baseline":
                self.baseline = body["version"]
            else:
                self.stable = body["version"]
        elif path == "/admin/weight":
            if self.canary is None and body["weight"] > 0:
                return httpx.Response(409, json={"error": "no_canary", "detail": ""})
            if body["weight"] > 0 and "lease_s" not in body:
                return httpx.Response(400, json={"error": "missing_field", "detail": "lease_s"})
            self.weight, self.lease_s = body["weight"], body.get("lease_s")
        elif path == "/admin/renew":
            if self.weight == 0:
                return httpx.Response(409, json={"error": "lease_expired", "detail": "ran out"})
            self.renewals.append(body["lease_s"])
        elif path == "/admin/promote":
            self.stable, self.canary, self.baseline, self.weight = self.canary, None, None, 0
        elif path == "/admin/rollback":
            self.canary, self.baseline, self.weight = None, None, 0
        return httpx.Response(200, json=self.state())


def fleet_of(*workers: FakeWorker, token: str = TOKEN, lease_s: float = 90.0) -> FleetClient:
    by_host = {httpx.URL(w.url).host: w for w in workers}
    transport = httpx.MockTransport(lambda r: by_host[r.url.host].handle(r))
    return FleetClient([w.url for w in workers], token, transport=transport, lease_s=lease_s)


def two() -> tuple[FakeWorker, FakeWorker]:
    return FakeWorker("http://w1:8700"), FakeWorker("http://w2:8700")


def test_deploy_canary_loads_everywhere_then_verifies_then_switches() -> None:
    a, b = two()
    result = fleet_of(a, b).deploy_canary("v2", weight=10)
    assert result.ok and result.phase == "switch" and not result.undo
    for w in (a, b):
        assert (w.canary, w.weight) == ("v2", 10)
        assert w.calls == ["/admin/load", "/admin/weight"]
    assert [r.canary_version for r in result.workers] == ["v2", "v2"]


def test_a_load_failure_on_one_worker_unloads_the_canary_everywhere_and_moves_no_weight() -> None:
    a, b = two()
    b.refuse_loads = True
    result = fleet_of(a, b).deploy_canary("v2", weight=10)
    assert not result.ok and result.phase == "load"
    assert "w2" in result.reason and "load_failed" in result.reason
    assert [r.ok for r in result.workers] == [True, False]
    assert a.canary is None and a.weight == 0 and b.weight == 0
    assert "/admin/weight" not in a.calls + b.calls
    assert len(result.undo) == 2


def test_unknown_version_fails_the_load_phase_with_each_workers_answer() -> None:
    a, b = two()
    result = fleet_of(a, b).deploy_canary("v9", weight=5)
    assert not result.ok and result.phase == "load"
    assert {r.error for r in result.workers} == {"unknown_version"}
    assert {r.status for r in result.workers} == {404}


def test_an_unreachable_worker_is_reported_not_raised() -> None:
    a, b = two()
    b.unreachable = True
    result = fleet_of(a, b).deploy_canary("v2", weight=5)
    assert not result.ok and result.workers[1].error == "unreachable"
    assert result.workers[1].status is None and a.canary is None


def test_workers_disagreeing_on_the_canary_version_fail_verification() -> None:
    a, b = two()
    a.canary, b.canary = "v2", "v1"
    result = fleet_of(a, b).set_weight(20)
    assert (
        not result.ok and result.phase == "verify" and "different canary versions" in result.reason
    )
    assert a.weight == 0 and b.weight == 0


def test_set_weight_and_promote_after_a_verified_canary() -> None:
    a, b = two()
    fleet = fleet_of(a, b)
    assert fleet.deploy_canary("v2", 5).ok
    assert fleet.set_weight(50).ok and (a.weight, b.weight) == (50, 50)
    promoted = fleet.promote()
    assert promoted.ok and (a.stable, b.stable) == ("v2", "v2") and a.canary is None
    assert [r.stable_version for r in promoted.workers] == ["v2", "v2"]


def test_promote_without_a_canary_everywhere_is_refused_before_any_change() -> None:
    a, b = two()
    a.canary = "v2"
    result = fleet_of(a, b).promote()
    assert not result.ok and result.phase == "verify" and "no canary model" in result.reason
    assert a.stable == "v1" and "/admin/promote" not in a.calls


def test_weight_zero_needs_no_verification() -> None:
    a, b = two()
    assert fleet_of(a, b).set_weight(0).ok


def test_rollback_is_best_effort_and_per_worker() -> None:
    a, b = two()
    a.canary, a.weight = "v2", 30
    b.unreachable = True
    result = fleet_of(a, b).rollback()
    assert not result.ok and result.workers[0].ok and not result.workers[1].ok
    assert a.canary is None and a.weight == 0


def test_a_wrong_token_is_each_workers_401() -> None:
    a, b = two()
    result = fleet_of(a, b, token="wrong").state()
    assert not result.ok and {r.status for r in result.workers} == {401}


def test_from_settings_needs_urls_and_a_token() -> None:
    with pytest.raises(ConfigError, match="FLEET_URLS"):
        FleetClient.from_settings(Settings(serving_admin_token="x"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ADMIN_TOKEN"):
        FleetClient.from_settings(Settings(serving_fleet_urls="http://a:1"))
    fleet = FleetClient.from_settings(
        Settings(serving_fleet_urls="http://a:1, http://b:2/", serving_admin_token="x")  # type: ignore[arg-type]
    )
    assert fleet.urls == ["http://a:1", "http://b:2"]


def test_deploy_canary_with_baseline_loads_both_then_switches() -> None:
    a, b = two()
    with fleet_of(a, b) as fleet:
        result = fleet.deploy_canary("v2", weight=5, baseline="v1")
    assert result.ok, result.reason
    for w in (a, b):
        assert (w.canary, w.baseline, w.stable, w.weight) == ("v2", "v1", "v1", 5)
        assert w.calls == ["/admin/load", "/admin/load", "/admin/weight"]


def test_a_worker_without_room_for_the_baseline_stops_the_deploy_and_nothing_stays_loaded() -> None:
    a, b = two()
    b.max_models = 2  # room for stable and canary, not for the baseline
    with fleet_of(a, b) as fleet:
        result = fleet.deploy_canary("v2", weight=5, baseline="v1")
    assert not result.ok and result.phase == "load"
    assert "baseline v1" in result.reason and "no_room" in result.reason and b.url in result.reason
    for w in (a, b):
        assert (w.canary, w.baseline, w.weight) == (None, None, 0)  # undone everywhere
        assert "/admin/weight" not in w.calls  # no traffic ever moved


def test_set_weight_refuses_when_workers_hold_different_baselines() -> None:
    a, b = two()
    a.canary = b.canary = "v2"
    a.baseline, b.baseline = "v1", "v2"
    with fleet_of(a, b) as fleet:
        result = fleet.set_weight(25)
    assert not result.ok and "different baseline versions" in result.reason
    assert a.weight == b.weight == 0


def test_every_weight_goes_out_with_the_clients_lease_unless_given_one() -> None:
    a, b = two()
    fleet = fleet_of(a, b, lease_s=45)
    assert fleet.deploy_canary("v2", weight=5).ok and (a.lease_s, b.lease_s) == (45, 45)
    assert fleet.set_weight(25, lease_s=12.5).ok and (a.weight, a.lease_s) == (25, 12.5)
    assert fleet.renew().ok and a.renewals == b.renewals == [45]
    assert fleet.renew(7).ok and a.renewals == [45, 7]


def test_the_default_lease_is_the_setting() -> None:
    fleet = FleetClient.from_settings(
        Settings(
            serving_fleet_urls="http://a:1",
            serving_admin_token="x",  # type: ignore[arg-type]
            serving_canary_lease_s=33,
        )
    )
    assert fleet.lease_s == 33
    assert FleetClient(["http://a:1"], "x").lease_s == Settings().serving_canary_lease_s


def test_a_lease_longer_than_the_maximum_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="CANARY_LEASE_MAX_S"):
        Settings(serving_canary_lease_s=700, serving_canary_lease_max_s=600)


def test_renewing_renews_at_the_start_periodically_and_at_the_end() -> None:
    a, b = two()
    fleet = fleet_of(a, b, lease_s=30)
    assert fleet.deploy_canary("v2", weight=5).ok
    with fleet.renewing(every_s=0.02) as results:
        assert len(a.renewals) == 1  # before the block's first statement
        deadline = time.monotonic() + 5
        while len(a.renewals) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(a.renewals) >= 4 and set(a.renewals) == {30}
    assert all(r.ok for r in results) and len(results) == len(a.renewals)


def test_a_block_that_fails_gets_no_final_renewal_and_a_lost_lease_is_reported() -> None:
    a, b = two()
    fleet = fleet_of(a, b)
    assert fleet.deploy_canary("v2", weight=5).ok
    b.weight = 0  # b's lease ran out
    with pytest.raises(RuntimeError), fleet.renewing(every_s=60) as results:
        raise RuntimeError("analysis failed")
    assert len(results) == 1 and not results[0].ok and "lease_expired" in results[0].reason
    assert len(a.renewals) == 1
