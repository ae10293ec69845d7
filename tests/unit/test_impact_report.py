"""The report's renderings (HTML, figure JSON, markdown) and how it is filed in the model store."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from core.impact.analysis import analyse_impact
from core.impact.report import build_figures, render_html, render_json, render_markdown
from core.impact.storage import list_impact_reports, store_report_files
from core.impact.types import ImpactFinding, ImpactOptions, ImpactReport
from logstore.impact import JoinCoverage, empty_session_outcomes
from model_store import ModelStore
from model_store.local import LocalBackend
from relay.errors import VersionNotFound
from relay.types import LineageId, VersionManifest
from simulation.sessions import TrafficConfig
from tests.unit.test_impact_analysis import data_for, session_frame

NOW = datetime(2033, 6, 1, tzinfo=UTC)  # the clock the analyses are stamped with

SMALL = ImpactOptions(min_sessions=100, refutation_simulations=2, min_sessions_per_slot=30)


@pytest.fixture(scope="module")
def report() -> ImpactReport:
    frame = session_frame(TrafficConfig(n_sessions=1_500, seed=12, gmv_per_ms=-0.1))
    data = data_for(frame)
    profile = (
        frame.groupby(["model_version", "slot"])["latency_mean_ms"]
        .agg(
            requests="size",
            mean_ms="mean",
            p50_ms="median",
            p95_ms=lambda s: s.quantile(0.95),
            p99_ms=lambda s: s.quantile(0.99),
        )
        .reset_index()
    )
    histogram = pd.DataFrame(
        {
            "model_version": ["v-stable"] * 3 + ["v-canary"] * 3,
            "bin_start_ms": [0.0, 50.0, 100.0] * 2,
            "requests": [10, 30, 5, 2, 8, 4],
        }
    )
    data = replace(
        data, latency_profile=profile, latency_histogram=histogram, histogram_bin_ms=50.0
    )
    return analyse_impact(data, SMALL, now=NOW)


@pytest.fixture(scope="module")
def empty_report() -> ImpactReport:
    return analyse_impact(
        data_for(empty_session_outcomes(), JoinCoverage(0, 0, 0, 0, 0, 0)), SMALL, now=NOW
    )


def test_html_is_self_contained_with_one_png_per_figure(report, rendered):
    page = rendered[0].read_text()
    figures = build_figures(report)
    assert set(figures) == {
        "latency_by_version",
        "gmv_by_latency",
        "session_length_by_latency",
        "effect_estimates",
        "refutations",
        "canary_vs_stable",
    }
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == len(figures)
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert not re.search(r"(src|href)=['\"]?https?://", page)  # nothing fetched from outside
    for needed in (
        "Assumptions",
        "Refutations",
        "Business translation",
        "canary vs stable",
        "GMV per day per +100 ms",
        report.headline.split("(")[0].strip(),
    ):
        assert needed in page


def test_json_is_strict_and_carries_every_plotted_number(report, rendered):
    document = json.loads(rendered[1].read_text(), parse_constant=lambda c: pytest.fail(c))
    figures = document["figures"]
    assert figures == json.loads(json.dumps(build_figures(report)))
    plotted = {e["key"]: e["value"] for e in figures["effect_estimates"]["estimates"]}
    assert plotted == {e.key: pytest.approx(e.value) for e in report.estimates}
    assert len(figures["gmv_by_latency"]["bins"]) == len(report.gmv_by_latency)
    assert document["report"]["finding"] == report.finding.value
    assert {r["key"] for r in figures["refutations"]["refutations"]} == {
        "placebo",
        "random_common_cause",
        "data_subset",
    }


def test_every_number_in_the_estimates_table_has_an_interval(report):
    assert [e.key for e in report.estimates] == [
        "naive",
        "ols",
        "dowhy_backdoor",
        "dowhy_frontdoor",
    ]
    for e in report.estimates:
        assert e.ci_low <= e.value <= e.ci_high and e.std_error > 0
    assert report.translation is not None
    t = report.translation
    assert t.ci_low <= t.gmv_per_day_per_ms <= t.ci_high


def test_empty_report_renders_its_reason_without_figures(empty_report):
    assert empty_report.finding is ImpactFinding.no_data
    assert build_figures(empty_report) == {}
    page = render_html(empty_report)
    assert "No data" in page and "base64" not in page
    json.loads(render_json(empty_report))


def _store(tmp_path: Path) -> ModelStore:
    return ModelStore(LocalBackend(tmp_path / "store"))


def _publish(store: ModelStore, version: str) -> None:
    lineage = LineageId(model="a" * 64, data="b" * 64, env="c" * 64, build="d" * 64)
    store.publish(
        VersionManifest(
            version=version, created_at=datetime.now(UTC), lineage=lineage, lineage_id=str(lineage)
        )
    )


@pytest.fixture(scope="module")
def rendered(report, tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("rendered")
    html_path, json_path = folder / "r.html", folder / "r.json"
    html_path.write_text(render_html(report))
    json_path.write_text(render_json(report))
    return html_path, json_path


def test_report_is_filed_under_its_version_with_verifiable_blobs(report, rendered, tmp_path):
    store = _store(tmp_path)
    _publish(store, "rel-1")
    stored = store_report_files(store, report, *rendered, attach_to="rel-1")
    assert stored.record_key.startswith("versions/rel-1/attachments/impact-report/")
    assert list_impact_reports(store, "rel-1") == [stored]
    assert list_impact_reports(store) == []
    fetched = store.fetch_blob(stored.blobs["report.html"], tmp_path / "back.html")
    assert hashlib.sha256(fetched.read_bytes()).hexdigest() == stored.blobs["report.html"].sha256
    assert stored.html_url.startswith("file://") and stored.html_url.endswith(
        stored.blobs["report.html"].sha256
    )
    assert "rel-1" in store.list_versions()  # the record does not disturb the version listing


def test_unattached_report_goes_under_reports_and_markdown_links_it(report, rendered, tmp_path):
    store = _store(tmp_path)
    stored = store_report_files(store, report, *rendered, attach_to=None)
    assert list_impact_reports(store) == [stored]
    markdown = render_markdown(report, stored)
    assert report.headline in markdown
    assert stored.html_url in markdown and stored.json_url in markdown
    assert "95 % CI" in markdown and "GMV per day per +100 ms" in markdown


def test_report_never_attaches_to_a_missing_version(report, rendered, tmp_path):
    store = _store(tmp_path)
    with pytest.raises(VersionNotFound):
        store_report_files(store, report, *rendered, attach_to="no-such")
    assert store.backend.list_keys("blobs/") == []  # nothing half-stored
