"""impact_report, run for real under Prefect's test harness over a seeded canary window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

import logstore
from core.impact.storage import list_impact_reports
from core.impact.types import ImpactFinding
from flows.impact import impact_report
from model_store import open_store
from relay.types import LineageId, VersionManifest
from simulation.sessions import CANARY, STABLE, SlotTraffic, TrafficConfig, seed_traffic

START = datetime(2034, 2, 1, tzinfo=UTC)
END = START + timedelta(hours=8)
RELEASE = "impact-flow-canary"
SMALL = {"min_sessions": 300, "min_sessions_per_slot": 50, "refutation_simulations": 2}


def _artifacts(flow_run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found}


@pytest.fixture(scope="module")
def release_window(prefect_harness, settings):
    """A published canary version and a window of its traffic with a planted effect."""
    lineage = LineageId(model="1" * 64, data="2" * 64, env="3" * 64, build="4" * 64)
    open_store(settings).publish(
        VersionManifest(
            version=RELEASE, created_at=datetime.now(UTC), lineage=lineage, lineage_id=str(lineage)
        )
    )
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    slots = (
        SlotTraffic(STABLE, "impact-flow-stable", "s", 0.75),
        SlotTraffic(CANARY, RELEASE, "c", 0.25, extra_latency_ms=30.0),
    )
    seed_traffic(
        client, TrafficConfig(n_sessions=2_500, seed=51, gmv_per_ms=-0.1, slots=slots), START, END
    )
    return impact_report(
        start=START,
        end=END,
        model_versions=["impact-flow-stable", RELEASE],
        attach_to=RELEASE,
        **SMALL,
        return_state=True,
    )


def test_flow_completes_and_files_the_report_under_the_release(release_window, settings):
    assert release_window.is_completed(), release_window.message
    stored = release_window.result()
    assert stored.attached_to == RELEASE and stored.versions == ["impact-flow-stable", RELEASE]
    assert list_impact_reports(open_store(settings), RELEASE) == [stored]
    assert stored.finding is not ImpactFinding.no_data


def test_stored_files_are_the_self_contained_report_and_its_figures(
    release_window, settings, tmp_path
):
    stored = release_window.result()
    store = open_store(settings)
    page = store.fetch_blob(stored.blobs["report.html"], tmp_path / "r.html").read_text()
    assert page.count("data:image/png;base64,") == 6 and stored.headline in page
    document = json.loads(
        store.fetch_blob(stored.blobs["report.json"], tmp_path / "r.json").read_text()
    )
    assert set(document["figures"]) >= {
        "latency_by_version",
        "effect_estimates",
        "canary_vs_stable",
    }
    assert document["report"]["slots"]["canary_version"] == RELEASE
    assert document["report"]["coverage"]["sessions"] == 2_500


def test_markdown_artifact_carries_headline_numbers_and_links(release_window):
    artifacts = _artifacts(release_window.state_details.flow_run_id)
    assert "impact-report" in artifacts
    markdown = artifacts["impact-report"].data
    stored = release_window.result()
    assert stored.headline in markdown and stored.html_url in markdown
    assert "GMV per day per +100 ms" in markdown and "Canary − stable latency" in markdown


def test_flow_over_an_empty_window_reports_no_data(prefect_harness):
    state = impact_report(
        start=START - timedelta(days=30),
        end=START - timedelta(days=29),
        **SMALL,
        return_state=True,
    )
    assert state.is_completed(), state.message
    stored = state.result()
    assert stored.finding is ImpactFinding.no_data and stored.attached_to is None
    assert "no sessions and no requests" in stored.headline


def test_flow_refuses_to_attach_to_a_missing_version(prefect_harness):
    state = impact_report(
        start=START,
        end=END,
        attach_to="no-such-version",
        **SMALL,
        return_state=True,
    )
    assert state.is_failed()
    assert "no version 'no-such-version'" in str(state.message)
