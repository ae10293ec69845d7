"""The on-call engineer's path, in a real browser: the Prefect UI of a deployed local stack.

Headless Chromium (Debian's package, installed by `make browser`, which `make test` runs) driven
by Playwright: open Deployments, pick `retrain-and-release`, start a custom run with changed
parameters from the form, follow it to its flow-run page and see it complete. Screenshots go to
test-artifacts/. Selectors are the words a person reads (roles, labels, button texts); the
parameter form's inputs carry no accessible name, so each is found inside the form property whose
label names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from tests.integration.deployed_stack import REPO, DeployedStack, finish, outcome_of

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedStack]:
    # No serving fleet: the run from the UI stops after the blessing (deploy=false).
    deployed = DeployedStack(tmp_path_factory.mktemp("ui-stack"))
    try:
        seeding = deployed.seed_events(20_000)  # `relay seed`, in a subprocess
        deployed.start()
        finish(seeding)
        yield deployed
    finally:
        deployed.stop()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is not installed: `make browser` installs it")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh user-data dir per test
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            opened = browser.new_page()
            opened.set_default_timeout(60_000)  # the UI on 2 busy cores
            yield opened
        finally:
            browser.close()


def parameter(page: Page, name: str) -> Locator:
    """The custom-run form's property labelled `name (Optional)`."""
    return page.locator(".schema-form-property").filter(
        has=page.get_by_text(f"{name} (Optional)", exact=True)
    )


def test_on_call_starts_a_custom_release_from_the_ui_and_sees_it_complete(stack, page):
    ARTIFACTS.mkdir(exist_ok=True)
    run_name = f"ui-custom-{uuid4().hex[:6]}"

    page.goto(f"{stack.ui_url}/deployments")
    page.get_by_role("link", name="retrain-and-release", exact=True).first.click()
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_role("button", name="Custom run", exact=True).click()

    page.locator(".p-label").filter(has=page.get_by_text("Run Name", exact=True)).get_by_role(
        "textbox"
    ).fill(run_name)
    epochs = parameter(page, "epochs").locator("input")
    expect(epochs).to_have_value("2")  # prefect.yaml's default is shown and editable
    epochs.fill("1")
    parameter(page, "batch_size").locator("input").fill("2048")
    parameter(page, "actor").get_by_role("textbox").fill("on-call (UI test)")
    deploy = parameter(page, "deploy").get_by_role("switch")
    expect(deploy).to_have_attribute("aria-checked", "true")
    deploy.click()  # bless, but do not touch the fleet
    expect(deploy).to_have_attribute("aria-checked", "false")
    page.screenshot(path=ARTIFACTS / "ui-custom-run-form.png")

    page.get_by_role("button", name="Submit", exact=True).click()
    # Back on the deployment, the new run is listed by its name. (The "View run" toast is no
    # handle: this UI version stacks it twice for one run, and it fades while being clicked.)
    page.get_by_role("link", name=run_name, exact=True).first.click()
    page.wait_for_url("**/runs/flow-run/**")
    heading = page.locator("header")
    expect(heading.get_by_text(run_name, exact=True)).to_be_visible()
    expect(heading.get_by_text("Completed", exact=True)).to_be_visible(timeout=300_000)
    page.screenshot(path=ARTIFACTS / "ui-custom-run-completed.png")

    # What the server received is what the form said, and the run stopped before any deploy.
    flow_run_id = page.url.split("/runs/flow-run/")[1].split("?")[0]
    run = stack.api("GET", f"/flow_runs/{flow_run_id}")
    assert run["state_type"] == "COMPLETED"
    named = stack.api("POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": [run_name]}}})
    assert [r["id"] for r in named] == [flow_run_id]  # one submit, one flow run
    assert {k: run["parameters"].get(k) for k in ("epochs", "batch_size", "deploy", "actor")} == {
        "epochs": 1,
        "batch_size": 2048,
        "deploy": False,
        "actor": "on-call (UI test)",
    }
    artifacts = stack.artifacts(flow_run_id)
    assert outcome_of(artifacts) in {"Release blessed", "Release not deployed"}
    assert stack.store().get_alias("champion") is None
