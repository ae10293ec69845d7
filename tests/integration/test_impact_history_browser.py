"""The impact history page in Chromium: the latest release, its interval, the link to its report."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from core.impact.experiment import no_experiment
from core.impact.experiment_report import with_experiment_section
from core.impact.history import build_history, store_history_page
from core.impact.report import render_html, render_json
from core.impact.storage import store_experiment, store_report_files
from tests.integration.test_ui_browser import CHROMIUM, CHROMIUM_ARGS
from tests.unit.test_impact_history import LINEAGE, _report, experiment, store_with

T0 = datetime(2026, 4, 1, 9, tzinfo=UTC)


@pytest.fixture
def page() -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is not installed: `apt-get install -y chromium`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            opened = browser.new_page()
            opened.set_default_timeout(30_000)
            yield opened
        finally:
            browser.close()


def test_history_page_shows_the_latest_release_interval_and_links_its_report(
    page: Page, tmp_path: Path
) -> None:
    store = store_with(tmp_path, "v1", "v2", "v3")
    store_experiment(
        store, no_experiment("rel-1", "v1", str(LINEAGE), "promoted", "first release", T0)
    )
    store_experiment(store, experiment("v2", "rel-2", 0.0, T0 + timedelta(days=1)))
    latest = experiment("v3", "rel-3", 0.10, T0 + timedelta(days=2))
    store_experiment(store, latest)
    report = _report((-0.8, -1.0, -0.6))
    html_path, json_path = tmp_path / "report.html", tmp_path / "report.json"
    html_path.write_text(with_experiment_section(render_html(report), report, [latest], "v3"))
    json_path.write_text(render_json(report))
    store_report_files(store, report, html_path, json_path, attach_to="v3")
    url = store_history_page(store, build_history(store, T0 + timedelta(days=3)))

    page.goto(url)
    expect(page.get_by_role("heading", name="Impact history")).to_be_visible()
    rows = page.locator("#history tbody tr")
    expect(rows).to_have_count(3)
    first = rows.first  # newest first: the latest release
    expect(first).to_have_attribute("data-release", "rel-3")
    gmv = latest.metric("gmv_per_user")
    assert gmv is not None and gmv.relative_ci_low is not None and gmv.relative_ci_high
    interval = f"[{gmv.relative_ci_low * 100:+.1f} %, {gmv.relative_ci_high * 100:+.1f} %]"
    expect(first.locator("td[data-metric='gmv_per_user']")).to_contain_text(interval)
    expect(rows.nth(2).locator("td[data-metric='orders_per_user']")).to_have_text("no experiment")
    expect(page.get_by_role("img", name="GMV per user trend")).to_be_visible()
    # the test's releases log no impressions: that plot says so instead of drawing zeros
    expect(page.get_by_text("click-through: no measured releases")).to_be_visible()

    first.get_by_role("link", name="report").click()
    expect(page.locator("#experiment")).to_be_visible()
    expect(page.locator("#experiment .agreement")).to_contain_text(re.compile("^They disagree"))
