"""The experiment filed beside its version, the report's experiment section, the history page."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from core.impact.canary_window import CanaryWindow, canary_window, recorded_sample_ratio
from core.impact.experiment import estimate_experiment, no_experiment
from core.impact.experiment_report import compare_with_latency, with_experiment_section
from core.impact.experiment_types import ExperimentFinding, ExperimentOptions, ReleaseExperiment
from core.impact.history import build_history, latest_history_url, store_history_page
from core.impact.storage import list_experiments, store_experiment
from core.impact.types import (
    BusinessTranslation,
    ImpactFinding,
    ImpactReport,
    ImpactWindow,
    SlotComparison,
)
from logstore.experiment import CohortMoments, ExperimentData
from logstore.release_events import ReleaseEvent
from model_store import ModelStore
from model_store.attachments import AttachmentExists
from model_store.local import LocalBackend
from relay.types import LineageId, VersionManifest

T0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
LINEAGE = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)


def store_with(tmp_path: Path, *versions: str) -> ModelStore:
    store = ModelStore(LocalBackend(tmp_path / "store"))
    for version in versions:
        store.publish(
            VersionManifest(
                version=version, created_at=T0, lineage=LINEAGE, lineage_id=str(LINEAGE)
            )
        )
    return store


def experiment(version: str, release: str, gmv_lift: float, start: datetime) -> ReleaseExperiment:
    rng = np.random.default_rng(zlib.crc32(release.encode()))
    cohorts = {}
    for name, lift in (("canary", gmv_lift), ("baseline", 0.0)):
        orders = rng.poisson(2.0, 3_000).astype(float)
        cohorts[name] = CohortMoments.from_users(
            name,
            {"orders": orders, "pre_orders": orders + rng.poisson(1.0, 3_000), "gmv": 40 * orders * (1 + lift),
             "pre_gmv": 40 * orders + rng.normal(0, 5, 3_000)},
        )  # fmt: skip
    data = ExperimentData(start, start + timedelta(minutes=20), start - timedelta(days=1), start,
                          version, "v-base", cohorts, 0)  # fmt: skip
    return estimate_experiment(
        data, (release, version, str(LINEAGE), "promoted"), ExperimentOptions(), T0
    )


def event(kind: str, verdict: str, at: float, **details: object) -> ReleaseEvent:
    return ReleaseEvent(
        "r1", "v2", "lin", kind, verdict, "", dict(details), T0 + timedelta(minutes=at)
    )


def test_the_last_weight_step_is_the_window_and_covariates_predate_the_deploy() -> None:
    events = [
        event("deploy", "passed", 0),
        event("weight", "passed", 1, weight=5),
        event("weight", "passed", 5, weight=25),
        event("promote", "passed", 12),
        event("outcome", "promoted", 13),
    ]
    window = canary_window(events, T0 + timedelta(hours=1), timedelta(hours=24))
    assert isinstance(window, CanaryWindow)
    assert (window.start, window.end) == (T0 + timedelta(minutes=5), T0 + timedelta(minutes=12))
    assert (window.pre_start, window.pre_end) == (T0 - timedelta(hours=24), T0)
    assert window.weight == 25 and "1 earlier step(s) are left out" in window.describe()


def test_a_canary_that_never_took_traffic_has_no_window_and_says_why() -> None:
    assert "never deployed" in str(canary_window([], T0, timedelta(hours=1)))
    events = [event("deploy", "passed", 0), event("rollback", "passed", 1)]
    assert "never took traffic" in str(canary_window(events, T0, timedelta(hours=1)))


def test_a_sample_ratio_verdict_recorded_by_the_gate_is_used() -> None:
    events = [event("sample_ratio", "invalid", 2, canary_users=900, baseline_users=1_100)]
    srm = recorded_sample_ratio(events)
    assert srm is not None and not srm.passed and srm.source == "release events"
    assert recorded_sample_ratio([event("weight", "passed", 1, weight=5)]) is None


def test_an_experiment_is_filed_once_beside_its_version(tmp_path: Path) -> None:
    store = store_with(tmp_path, "v1")
    first = experiment("v1", "rel-1", 0.0, T0)
    store_experiment(store, first)
    store_experiment(store, first)  # the same record again: a no-op
    assert list_experiments(store, "v1") == [first]
    changed = first.model_copy(update={"headline": "rewritten"})
    with pytest.raises(AttachmentExists):
        store_experiment(store, changed)


def _report(implied: tuple[float, float, float] | None) -> ImpactReport:
    slots = SlotComparison(available=True, reason="")
    if implied:
        slots = SlotComparison(
            available=True, reason="", implied_gmv_per_session=implied[0],
            implied_gmv_per_session_ci=(implied[1], implied[2]),
        )  # fmt: skip
    return ImpactReport(
        window=ImpactWindow(start=T0, end=T0 + timedelta(hours=1)), versions=["v1"],
        generated_at=T0, finding=ImpactFinding.effect_detected, headline="latency costs GMV",
        translation=BusinessTranslation(sessions_per_day=1_000, gmv_per_day=80_000,
                                        gmv_per_day_per_ms=-50, ci_low=-60, ci_high=-40),
        slots=slots,
    )  # fmt: skip


def test_report_says_when_the_experiment_disagrees_with_the_latency_analysis() -> None:
    measured = experiment("v1", "rel-1", 0.08, T0)  # +8 % GMV by ranking, not latency
    assert measured.finding is ExperimentFinding.effect_detected
    # latency implies -0.8 GMV per session on a mean of 80: -1 %
    sentence = compare_with_latency(_report((-0.8, -1.0, -0.6)), measured)
    assert sentence.startswith("They disagree") and "-1.00 %" in sentence
    near = compare_with_latency(_report((6.4, 5.0, 8.0)), measured)
    assert near.startswith("They agree")
    page = with_experiment_section("<html><body>x</body></html>", _report(None), [measured], "v1")
    assert page.index("id='experiment'") < page.index("</body>")
    assert "GMV per user" in page and "gives no implied GMV change" in page


def test_report_of_a_version_without_experiment_says_no_experiment() -> None:
    page = with_experiment_section("<body></body>", _report(None), [], "v9")
    assert "No experiment: none is recorded for version v9" in page
    none = no_experiment("r", "v9", "lin", "promoted", "first release: no stable version", T0)
    page = with_experiment_section("<body></body>", _report(None), [none], "v9")
    assert "No experiment: first release: no stable version." in page


def test_history_lists_every_release_newest_first_with_effects_and_links(tmp_path: Path) -> None:
    store = store_with(tmp_path, "v1", "v2", "v3")
    store_experiment(
        store, no_experiment("rel-1", "v1", str(LINEAGE), "promoted", "first release", T0)
    )
    store_experiment(store, experiment("v2", "rel-2", 0.0, T0 + timedelta(days=1)))
    latest = experiment("v3", "rel-3", 0.10, T0 + timedelta(days=2))
    store_experiment(store, latest)
    page = build_history(store, T0 + timedelta(days=3))
    gmv = latest.metric("gmv_per_user")
    assert gmv is not None and gmv.detected and gmv.covers_relative(0.10)
    assert [r.experiment.version for r in page.rows] == ["v3", "v2", "v1"]
    assert f"{gmv.relative * 100:+.1f} % [" in page.html and "no experiment" in page.html
    assert page.html.count("<svg") == 4
    assert "| " + "v3" not in page.markdown  # versions are code-formatted
    assert "`v3`" in page.markdown and "20.0 min" in page.markdown
    url = store_history_page(store, page)
    assert latest_history_url(store) == url and url.startswith("file://")
    assert Path(url.removeprefix("file://")).read_text() == page.html


def test_history_of_an_empty_store_is_empty_not_an_error(tmp_path: Path) -> None:
    page = build_history(store_with(tmp_path), T0)
    assert page.rows == [] and "0 releases" in page.html
