"""The shop as its own process against a real worker: it stops by itself and at SIGTERM, its
shoppers' impressions and feedback reach ClickHouse through the fleet's log path, so does every
session the shop logged (exactly once), and a bad drift file is reported without stopping the
shop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from logstore.feedback import feedback_counts
from logstore.reading import connect_for_reading
from relay_testing.metrics import buffered_log_rows, requests_answered
from relay_testing.waiting import wait_until
from serving.process import start_worker
from tests.integration.test_serving_logging import logging_worker_env

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def shop(url: str, home: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RELAY_HOME": str(home), "RELAY_SERVING_FLEET_URLS": url}
    return subprocess.Popen(
        [sys.executable, "-m", "simulation.shop_service", "--round-s", "2", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def sessions_logged(out: str) -> int:
    """The sessions a shop says it wrote, from its last line."""
    found = re.search(r"stopped after \d+ rounds, (\d+) sessions logged", out)
    assert found, out
    return int(found.group(1))


def test_the_shop_runs_its_rounds_stops_by_itself_and_its_feedback_lands(
    published_version: Any, settings: Any, tmp_path: Path
) -> None:
    env = logging_worker_env(published_version, settings, tmp_path, flush_ms="100")
    start = datetime.now(UTC) - timedelta(seconds=1)
    with start_worker(env, tmp_path / "worker.log") as worker:
        worker.wait_ready()
        # 0.0015 h = 5.4 s: three rounds of at most 2 s, then it stops by itself
        bounded = shop(worker.http_url, tmp_path, "--rate-rps", "40", "--max-hours", "0.0015")
        out, _ = bounded.communicate(timeout=60)
        assert bounded.returncode == 0, out
        assert "round 3:" in out and "stopped after" in out and "round 5:" not in out
        logged = sessions_logged(out)

        (tmp_path / "shop").mkdir(exist_ok=True)
        (tmp_path / "shop" / "drift.json").write_text('{"kind": "device_mix", magnitude}')
        answered = requests_answered(worker.http_url)
        told = shop(worker.http_url, tmp_path, "--rate-rps", "20", "--max-hours", "1")
        # told to stop mid-round: once its first round's feeds are being answered
        wait_until(lambda: requests_answered(worker.http_url) >= answered + 10, 30, "feeds")
        told.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        out, _ = told.communicate(timeout=30)
        assert told.returncode == 0 and time.monotonic() - stopped_at < 10, out
        assert "is not readable JSON" in out and "this round runs without drift" in out
        assert "stopping after this round" in out
        logged += sessions_logged(out)
        wait_until(lambda: buffered_log_rows(worker.http_url) == 0, 30, "log rows flushed")
    end = datetime.now(UTC) + timedelta(seconds=1)

    client = connect_for_reading(settings.resolved_clickhouse_dsn, tmp_path / "spool")
    counts = feedback_counts(client, start, end)
    assert counts.impressions >= 100 * 20  # ~5 s at 40 feeds/s, 20 candidates each
    assert counts.clicks > 0 and counts.unmatched == 0

    # The shop's sessions went through the spool (the shop never opens chdb): each once.
    rows, distinct, bad = client.query(
        "SELECT count(), uniqExact(session_id), countIf(isNaN(gmv) OR gmv < 0) "
        "FROM user_sessions WHERE startsWith(session_id, 'live-') "
        "AND started_at BETWEEN {start:DateTime64(3, 'UTC')} AND {end:DateTime64(3, 'UTC')}",
        parameters={"start": start, "end": end},
    ).result_rows[0]
    assert rows == distinct == logged > 0 and bad == 0
    assert not list((tmp_path / "spool" / "sessions").glob("*.wal*"))
    # a session starts when its first feed is asked for: never after the fleet logged one of its
    # requests (the impact report joins sessions to the requests that follow their start)
    late = client.query(
        "SELECT countIf(s.started_at > r.first) FROM user_sessions AS s INNER JOIN "
        "(SELECT session_id, min(ts) AS first FROM inference_logs GROUP BY session_id) AS r "
        "ON r.session_id = s.session_id WHERE startsWith(s.session_id, 'live-') "
        "AND s.started_at BETWEEN {start:DateTime64(3, 'UTC')} AND {end:DateTime64(3, 'UTC')}",
        parameters={"start": start, "end": end},
    ).result_rows[0][0]
    assert late == 0
