"""`relay lineage show|diff`, `relay alias history` and `relay store gc`, run as an engineer
would: configured through the environment, against a real S3 server or a real published version."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from core.lineage.queries import ATTRIBUTION
from model_store import ModelStore, open_store
from model_store.local import LocalBackend
from relay.settings import Settings, get_settings
from relay.types import LINEAGE_PARTS
from relay_cli.main import main
from tests.integration.store_testbed import fresh_bucket, lineage_for, publishable, s3_settings

pytest_plugins = ("tests.integration.store_fixtures",)


@pytest.fixture
def configure(relay_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Point the process settings (what the CLI reads) at a store, through RELAY_* variables."""

    def use(settings: Settings) -> None:
        monkeypatch.setenv("RELAY_MODEL_STORE_URL", settings.model_store_url)
        if settings.s3_endpoint:
            monkeypatch.setenv("RELAY_S3_ENDPOINT", settings.s3_endpoint)
            monkeypatch.setenv("RELAY_S3_ACCESS_KEY", settings.s3_access_key.get_secret_value())
            monkeypatch.setenv("RELAY_S3_SECRET_KEY", settings.s3_secret_key.get_secret_value())
        get_settings.cache_clear()

    yield use
    get_settings.cache_clear()  # the next reader sees the environment as monkeypatch restores it


@pytest.fixture
def s3_store(moto_endpoint: str, configure: Callable[..., None]) -> ModelStore:
    settings = s3_settings(moto_endpoint, fresh_bucket())
    configure(settings)
    return open_store(settings)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow  # trains and publishes the session's real version if nothing else did
def test_lineage_show_prints_the_four_parts_of_a_real_version_and_where_each_came_from(
    published_version, configure, tmp_path: Path, capsys
):
    # A copy: the session's published store is shared with other tests.
    root = tmp_path / "models"
    shutil.copytree(published_version.store.backend.root, root)
    configure(Settings(model_store_url=f"file://{root}"))
    manifest = published_version.manifest
    ModelStore(LocalBackend(root)).set_alias(
        "champion", manifest.version, actor="test", reason="show aliases"
    )

    code, out, _ = run(capsys, "lineage", "show", "champion")
    assert code == 0
    assert f"version     {manifest.version}" in out
    assert "aliases     champion" in out
    for part in LINEAGE_PARTS:
        assert f"{part:<6} {getattr(manifest.lineage, part)}" in out
    assert "  window: fixture-window" in out
    assert "  rows: 30000" in out
    assert "  python: 3.11" in out
    assert "  engines.ort-fp32: " in out and "  engines.ort-int8: " in out

    code, out, _ = run(capsys, "lineage", "show", manifest.version, "--json")
    view = json.loads(out)
    assert code == 0 and [p["name"] for p in view["parts"]] == list(LINEAGE_PARTS)
    assert view["parts"][1]["sources"]["window"] == "fixture-window"


@pytest.mark.parametrize("part", LINEAGE_PARTS)
def test_lineage_diff_names_the_changed_dimension_with_its_attribution(
    part: str, s3_store: ModelStore, tmp_path: Path, capsys
):
    base = lineage_for("base")
    other = base.model_copy(update={part: "f" * 64})
    s3_store.publish(publishable(s3_store, tmp_path, "v1", lineage=base))
    s3_store.publish(publishable(s3_store, tmp_path, "v2", lineage=other, seed="v2"))

    code, out, _ = run(capsys, "lineage", "diff", "v1", "v2")
    assert code == 0
    assert f"only {part} changed: {ATTRIBUTION[part]}" in out
    assert f"  {part} changed -> {ATTRIBUTION[part]}" in out


def test_lineage_diff_shows_which_inputs_moved_and_works_on_aliases(
    s3_store: ModelStore, tmp_path: Path, capsys
):
    base = lineage_for("base")
    sources = {"data": {"window": "2026-11-01..2026-11-08", "rows": 200_000}}
    moved = {"data": {"window": "2026-11-08..2026-11-15", "rows": 200_000}}
    s3_store.publish(publishable(s3_store, tmp_path, "v1", lineage=base, sources=sources))
    s3_store.publish(
        publishable(
            s3_store,
            tmp_path,
            "v2",
            seed="v2",
            lineage=base.model_copy(update={"data": "0" * 64}),
            sources=moved,
        )
    )
    s3_store.set_alias("champion", "v1", actor="a", reason="r")
    s3_store.set_alias("candidate", "v2", actor="a", reason="r")

    code, out, _ = run(capsys, "lineage", "diff", "champion", "candidate")
    assert code == 0
    assert "base   v1" in out and "other  v2" in out
    assert "data: window: '2026-11-01..2026-11-08' -> '2026-11-08..2026-11-15'" in out
    assert "rows" not in out

    code, out, _ = run(capsys, "lineage", "diff", "champion", "candidate", "--json")
    comparison = json.loads(out)
    assert comparison["changed"] == ["data"]
    assert comparison["source_changes"][0]["field"] == "window"


def test_alias_history_lists_every_move_and_says_who_held_it_at_a_time(
    s3_store: ModelStore, tmp_path: Path, capsys
):
    for version, seed in (("v1", "a"), ("v2", "b")):
        s3_store.publish(publishable(s3_store, tmp_path, version, seed=seed))
    s3_store.set_alias("champion", "v1", actor="alice", reason="first blessed")
    s3_store.set_alias("champion", "v2", actor="release-flow", reason="canary passed")
    between = s3_store.alias_history("champion")[1].at - timedelta(microseconds=1)

    code, out, _ = run(capsys, "alias", "history", "champion", "--at", between.isoformat())
    lines = out.splitlines()
    assert code == 0
    assert lines[0].startswith("#0") and "- -> v1  by alice: first blessed" in lines[0]
    assert lines[1].startswith("#1") and "v1 -> v2  by release-flow: canary passed" in lines[1]
    assert out.rstrip().endswith("champion pointed at v1")

    code, out, _ = run(capsys, "alias", "history", "champion", "--json")
    assert [e["actor"] for e in json.loads(out)] == ["alice", "release-flow"]

    code, out, _ = run(capsys, "alias", "history", "challenger")
    assert code == 1 and "never been set" in out


def test_store_gc_previews_then_deletes_only_orphans(s3_store: ModelStore, tmp_path: Path, capsys):
    kept = s3_store.publish(publishable(s3_store, tmp_path, "v1"))
    orphan = tmp_path / "orphan.bin"
    orphan.write_bytes(b"left behind by a failed run")
    orphan_ref = s3_store.put_blob(orphan)

    code, out, _ = run(capsys, "store", "gc", "--min-age-hours", "0", "--dry-run")
    assert code == 0 and "would delete 1 orphaned blobs" in out and orphan_ref.sha256 in out
    assert s3_store.backend.exists(f"blobs/sha256/{orphan_ref.sha256[:2]}/{orphan_ref.sha256}")

    code, out, _ = run(capsys, "store", "gc", "--min-age-hours", "0")
    assert code == 0 and "deleted 1 orphaned blobs" in out and "2 referenced kept" in out
    assert s3_store.gc(now=datetime.now(UTC) + timedelta(hours=2)).deleted == []
    for ref in kept.blobs.values():
        s3_store.fetch_blob(ref, tmp_path / "check" / ref.sha256)


def test_unknown_version_is_a_one_line_error_with_exit_code_1(s3_store: ModelStore, capsys):
    code, out, err = run(capsys, "lineage", "show", "no-such-version")
    assert code == 1 and out == ""
    assert err.startswith("relay: no version 'no-such-version' in s3://")
