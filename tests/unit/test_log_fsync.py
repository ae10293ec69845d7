"""RELAY_SERVING_LOG_FSYNC: with `request`, each log row's write-ahead record is written through
to the disk (msync) before `append` returns, i.e. before the answer; with `rotation` it is not.

What a power loss would take cannot be shown without cutting the power; what can be: the sync
happens once per record, over the record's own pages (msync refuses a range that does not start
on a page), and the record is in the file as a recoverer reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from logstore import wal
from logstore.spool import INFERENCE_LOGS, RequestLogWriter, SpoolWriter, decode_rows
from logstore.wal import WalFile
from logstore.writers import log_writer_for
from relay.settings import Settings
from tests.unit.test_serving_spool import rows


def writer_in(tmp_path: Path, sync: bool) -> RequestLogWriter:
    return RequestLogWriter(
        SpoolWriter(tmp_path, 1 << 30, "w1"),
        connect_server=None,
        flush_s=3600,
        batch_rows=10_000,
        sync_each_record=sync,
    )


@pytest.mark.parametrize(("sync", "expected"), [(True, 1), (False, 0)])
def test_request_policy_syncs_every_record_before_append_returns_rotation_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool, expected: int
) -> None:
    synced: list[int] = []
    real = WalFile.sync_tail

    def spy(self: WalFile, length: int) -> None:
        real(self, length)  # the real msync: a misaligned range would raise EINVAL here
        synced.append(length)

    monkeypatch.setattr(WalFile, "sync_tail", spy)
    writer = writer_in(tmp_path, sync)
    logged = rows(300, "sync")  # records straddle page boundaries
    for row in logged:
        writer.append(row)
    assert len(synced) == expected * len(logged)
    assert all(n > wal.HEADER.size for n in synced)
    (path,) = [p for p in tmp_path.iterdir() if p.name.endswith(".wal")]
    assert decode_rows(path.read_bytes()) == (logged, 0)
    writer.close()


def test_the_setting_picks_the_policy_and_refuses_any_other_by_name(tmp_path: Path) -> None:
    for policy, sync in (("request", True), ("rotation", False)):
        settings = Settings(serving_log_fsync=policy, serving_spool_dir=str(tmp_path / policy))
        writer = log_writer_for(settings, INFERENCE_LOGS, "w")
        assert writer._sync_each_record is sync
    assert Settings().serving_log_fsync == "rotation"
    with pytest.raises(ValidationError, match="serving_log_fsync"):
        Settings(serving_log_fsync="sometimes")
