"""The segmenter process writes the same segments the writer's thread would, and losing it loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from logstore import segmenter as segmenter_module
from logstore.log_tables import IMPRESSIONS
from logstore.segmenter import Segmenter
from logstore.spool import RequestLogWriter, SpoolWriter, read_segment
from serving.feedback import FeedbackLog
from serving.schema import decode_json
from tests.unit.test_serving_feedback import Scored
from tests.unit.test_serving_schema import make_doc
from tests.unit.test_serving_spool import rows


@pytest.fixture
def segmenter() -> Iterator[Segmenter]:
    s = Segmenter()
    yield s
    s.close()


def writer_in(directory: Path, segmenter: Segmenter | None, table=None) -> RequestLogWriter:
    spool = SpoolWriter(directory, 1 << 30, "w", *(() if table is None else (table,)))
    return RequestLogWriter(
        spool, connect_server=None, flush_s=3600, batch_rows=10_000, segmenter=segmenter
    )


def segments(directory: Path, table=None) -> list:
    args = () if table is None else (table,)
    return [read_segment(p, *args) for p in sorted(directory.glob("*.arrow"))]


def write_impressions(writer: RequestLogWriter, k: int) -> None:
    log = FeedbackLog(writer, writer, 1.0, "w")
    request = decode_json(orjson.dumps(make_doc(n=3, seed=k)), 100)
    scores = np.array([0.2, 0.9, 0.5], dtype=np.float32)
    log.write_impressions([Scored(f"r{k}", slot=f"slot-{k}")], [3], request.raw, scores)


def test_the_segmenter_writes_the_segments_the_writer_thread_would(
    tmp_path: Path, segmenter: Segmenter
) -> None:
    logged = rows(7, "seg")
    for name, s in (("process", segmenter), ("thread", None)):
        requests = writer_in(tmp_path / name / "requests", s)
        impressions = writer_in(tmp_path / name / "impressions", s, IMPRESSIONS)
        for row in logged:
            requests.append(row)
        for k in range(4):  # several columnar records, each with its own dictionaries
            write_impressions(impressions, k)
        requests.flush()
        impressions.flush()
        assert requests.pending == impressions.pending == 0
        requests.close()
        impressions.close()
    assert segmenter.segmented == 2 and segmenter.fallbacks == 0
    by_process = segments(tmp_path / "process" / "requests")
    by_thread = segments(tmp_path / "thread" / "requests")
    assert len(by_process) == 1 and by_process[0].equals(by_thread[0])
    assert by_process[0].num_rows == 7
    (imp_process,) = segments(tmp_path / "process" / "impressions", IMPRESSIONS)
    (imp_thread,) = segments(tmp_path / "thread" / "impressions", IMPRESSIONS)
    assert imp_process.num_rows == 12 and imp_process.equals(imp_thread)
    assert not list((tmp_path / "process").rglob("*.wal"))


def test_a_killed_segmenter_is_replaced_and_no_row_is_lost_or_written_twice(
    tmp_path: Path, segmenter: Segmenter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segmenter_module, "RESTART_AFTER_S", 0.0)
    writer = writer_in(tmp_path, segmenter)
    logged = rows(30, "kill")
    for row in logged[:10]:
        writer.append(row)
    writer.flush()
    first = segmenter._process
    assert first is not None and segmenter.segmented == 1
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    for row in logged[10:20]:
        writer.append(row)
    writer.flush()  # found dead before the hand-over: a new segmenter takes the file
    assert segmenter._process is not None and segmenter._process.pid != first.pid
    assert (segmenter.segmented, segmenter.fallbacks) == (2, 0)
    for row in logged[20:]:
        writer.append(row)
    writer.close()
    found = [r for t in segments(tmp_path) for r in t.column("request_id").to_pylist()]
    assert sorted(found) == sorted(r[1] for r in logged)


def test_a_segmenter_lost_mid_file_leaves_the_worker_to_write_it(
    tmp_path: Path, segmenter: Segmenter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segmenter_module, "RESTART_AFTER_S", 3600.0)
    writer = writer_in(tmp_path, segmenter)
    writer.append(rows(1, "warm")[0])
    writer.flush()
    assert segmenter._process is not None
    segmenter._process.send_signal(signal.SIGSTOP)  # hung: it takes the file, never answers
    monkeypatch.setattr(segmenter_module, "REPLY_TIMEOUT_S", 0.5)
    assert segmenter._sock is not None
    segmenter._sock.settimeout(0.5)
    for row in rows(5, "hung"):
        writer.append(row)
    writer.flush()
    assert segmenter.fallbacks == 1 and segmenter._process is None  # killed, not left behind
    for row in rows(3, "after"):  # within RESTART_AFTER_S: the worker writes its own
        writer.append(row)
    writer.close()
    assert segmenter.fallbacks == 2
    found = sorted(r for t in segments(tmp_path) for r in t.column("request_id").to_pylist())
    assert found == sorted(r[1] for r in rows(1, "warm") + rows(5, "hung") + rows(3, "after"))


def test_a_wrong_row_count_is_refused_and_the_segment_rewritten_by_the_worker(
    tmp_path: Path, segmenter: Segmenter, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = writer_in(tmp_path, segmenter)
    for row in rows(4, "count"):
        writer.append(row)
    real = segmenter.segment
    monkeypatch.setattr(
        segmenter, "segment", lambda d, t, i, fd, used, n: real(d, t, i, fd, used, n + 1)
    )
    writer.close()
    assert segmenter.fallbacks == 1 and segmenter.segmented == 0
    assert [t.num_rows for t in segments(tmp_path)] == [4]


def test_the_segmenter_exits_when_its_worker_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from logstore.segmenter import Segmenter
        from logstore.spool import RequestLogWriter, SpoolWriter
        from tests.unit.test_serving_spool import rows
        s = Segmenter()
        w = RequestLogWriter(SpoolWriter(Path({str(tmp_path)!r}), 1 << 30, "k"),
                             connect_server=None, flush_s=3600, batch_rows=100, segmenter=s)
        w.append(rows(1, "k")[0])
        w.flush()
        print(s._process.pid, flush=True)
        import time; time.sleep(600)
        """
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    assert worker.stdout is not None
    pid = int(worker.stdout.readline())
    worker.kill()
    worker.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # exited; its parent is gone, so init reaps it
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{pid}").exists(), "the segmenter outlived its worker"
    assert [t.num_rows for t in segments(tmp_path)] == [1]


class SlowSegmenter(Segmenter):
    """A segmenter that, while it works on the first file, sees three more rotated behind it:
    the request path sealing files faster than a starved segmenter turns them into segments."""

    def __init__(self, behind: Callable[[], None]) -> None:
        super().__init__()
        self.behind = behind

    def segment(self, *args: Any) -> bool:
        if self.behind is not None:
            fill, self.behind = self.behind, None
            fill()
        return super().segment(*args)


def test_a_segmenter_that_falls_behind_is_bypassed_until_it_catches_up(tmp_path: Path) -> None:
    logged = rows(40, "behind")
    spool = SpoolWriter(tmp_path, 1 << 30, "w")
    writer: RequestLogWriter

    def seal_three_more() -> None:
        for row in logged[10:]:
            writer.append(row)  # batch_rows=10: each tenth row seals a file

    slow = SlowSegmenter(seal_three_more)
    writer = RequestLogWriter(
        spool, connect_server=None, flush_s=3600, batch_rows=10, segmenter=slow
    )
    try:
        for row in logged[:10]:
            writer.append(row)
        writer.flush()  # the first file to the segmenter; three sealed behind it meanwhile
        assert writer.pending == 30
        writer.flush()  # as the writer's thread does at once: it was woken by those seals
        assert writer.pending == 0
        # the first file and the last two by the segmenter; the one that found two more waiting
        # behind it (over SEGMENTER_MAX_BEHIND) by the writer's own thread
        assert (writer.stats.segments_by_segmenter, writer.stats.segments_by_writer) == (3, 1)
        assert slow.segmented == 3 and slow.fallbacks == 0
        found = sorted(r for t in segments(tmp_path) for r in t.column("request_id").to_pylist())
        assert found == sorted(r[1] for r in logged)  # every row once
    finally:
        writer.close()
        slow.close()
    assert not list(tmp_path.glob("*.wal"))
