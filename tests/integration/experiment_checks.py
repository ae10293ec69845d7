"""What a real release's experiment must show: filed beside it, in its report, on the history page."""

from __future__ import annotations

from pathlib import Path

from core.impact.experiment_types import ExperimentFinding
from core.impact.history import build_history, latest_history_url
from core.impact.storage import list_experiments


def assert_experiment_in_report_and_history(store, summary, release_id: str, report) -> None:
    """The release's experiment: filed beside it, in its report, and on the history page."""
    (experiment,) = list_experiments(store, summary.version)
    assert experiment.release_id == release_id
    assert experiment.baseline_version is not None and experiment.outcome == "promoted"
    # measured over the last step (50 %): both cohorts had users, randomized by the fleet's hash
    assert experiment.finding is not ExperimentFinding.no_experiment, experiment.headline
    assert experiment.canary_users > 0 and experiment.baseline_users > 0
    assert experiment.sample_ratio is not None and experiment.sample_ratio.source == "estimator"
    clicks = experiment.metric("click_through")
    assert clicks is not None and clicks.measured and clicks.relative_ci_low is not None
    assert any("last step (50 %" in s for s in experiment.statements)
    page = Path(report.page_url.removeprefix("file://")).read_text()
    assert "id='experiment'" in page and experiment.headline.split(" (")[0][:40] in page
    history = build_history(store, experiment.generated_at)
    row = next(r for r in history.rows if r.experiment.release_id == experiment.release_id)
    assert row.report_url == report.page_url
    assert latest_history_url(store) is not None  # the flow published the page after the release
