"""CPU an engine batch's impressions cost the serving worker, on the answers' path and in the writer.

    python -m bench.log_record [--batches 8000] [--repeats 3] [--out PATH]

An engine batch's impressions are written ahead on the engine thread before any of its answers
is delivered (`FeedbackLog.write_impressions`), so what that costs is latency for every request
of the batch and CPU of the worker's one core. Two forms are measured side by side, in one run,
with `time.thread_time` (CPU of this thread only, so a neighbour's load moves it less than wall
time), at 1, 4 and 16 requests of 20 candidates a batch:

  record   what the worker writes ahead: the scores and raw rows wrapped as they are, the
           per-request values as JSON in the record's schema metadata (`impression_batch`);
  journal  the former path, kept here as it was (`journal_batch`, serving.feedback's
           `impression_batch` at commit 4147a9d): the dictionary journal, ranks included,
           built for every engine batch on the engine thread and written ahead.

`answer_path_us_per_batch` is the engine thread's CPU per batch; `writer_us_per_batch` the
writer thread's CPU per batch to turn the rotation's records into one segment (called here on
this thread: `RequestLogWriter.flush`). Each figure is the best of `--repeats` runs of
`--batches` batches, whole fresh writers each time. Request rows are real requests decoded by
the worker's own decoder (`serving.schema.decode_json`) from the simulated shop's bodies.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from bench.load import request_docs
from bench.saved import save
from bench.scratch import scratch_dir
from logstore.log_tables import FEEDBACK, IMPRESSIONS, impression_journal
from logstore.spool import RequestLogWriter, SpoolWriter
from serving.feedback import FeedbackLog
from serving.schema import RAW_ORDER, decode_json

RESULTS = Path(__file__).resolve().parent / "results"
CANDIDATES = 20
REQUESTS_PER_BATCH = (1, 4, 16)
FORMS = ("record", "journal")


@dataclass(frozen=True)
class Scored:
    """A scored request as the worker's exchange holds it."""

    ts: float
    request_id: str
    slot: str = "stable"
    version: str = "faab9a71c078_5420f2639ed3_85b89b857083_b1e3e3d56f3c"
    lineage_id: str = "faab9a71c078-5420f2639ed3-85b89b857083-b1e3e3d56f3c"
    session_id: str = "s-0001"


JOURNAL = impression_journal(RAW_ORDER)


def journal_batch(
    requests: Sequence[Any], sizes: Sequence[int], raw: np.ndarray, scores: np.ndarray
) -> pa.RecordBatch:
    """The former engine-thread path, unchanged: one batch's impressions as a journal batch."""
    counts = np.asarray(sizes, dtype=np.int64)
    n = int(counts.sum())
    owner = np.repeat(np.arange(len(requests), dtype=np.int32), counts)
    order = np.lexsort((-np.asarray(scores, dtype=np.float64), owner))  # stable, by request
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    rank = np.empty(n, dtype=np.uint16)
    rank[order] = np.arange(1, n + 1) - starts
    owners = pa.array(owner, pa.int32())

    def per_request(values: list[str]) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(owners, pa.array(values, pa.string()), safe=False)

    ts_ms = np.round(np.array([r.ts for r in requests]) * 1000).astype(np.int64)
    features = np.ascontiguousarray(raw, dtype=np.float64).reshape(-1)
    arrays = [
        pa.array(np.repeat(ts_ms, counts)).view(JOURNAL.field("ts").type),
        per_request([r.request_id for r in requests]),
        pa.array(rank),
        per_request([r.slot for r in requests]),
        per_request([r.version for r in requests]),
        per_request([r.lineage_id for r in requests]),
        per_request([r.session_id for r in requests]),
        pa.array(np.asarray(scores, dtype=np.float32)),
        pa.FixedSizeListArray.from_arrays(pa.array(features), len(RAW_ORDER)),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=JOURNAL)


class JournalPerBatch(FeedbackLog):
    """The former path: each engine batch's dictionary journal built on the engine thread."""

    def write_impressions(
        self, requests: Sequence[Any], sizes: Sequence[int], raw: np.ndarray, scores: np.ndarray
    ) -> int:
        batch = journal_batch(requests, sizes, raw, scores)
        self.impressions.append_columns(batch)
        return batch.num_rows


def _writer(directory: Path, table: Any) -> RequestLogWriter:
    spool = SpoolWriter(directory, 1 << 30, prefix="bench", table=table)
    return RequestLogWriter(spool, connect_server=None, flush_s=3600, batch_rows=10**9)


def one_run(home: Path, form: str, k: int, batches: int, raw: np.ndarray) -> tuple[float, float]:
    """(engine-thread µs, writer µs) per batch of `k` requests, over `batches` batches."""
    kind = FeedbackLog if form == "record" else JournalPerBatch
    log = kind(_writer(home / "i", IMPRESSIONS), _writer(home / "f", FEEDBACK), 1.0, "bench")
    log.start()
    scores = np.random.default_rng(k).random(CANDIDATES * k).astype(np.float32)
    sizes = [CANDIDATES] * k
    try:
        started = time.thread_time()
        for i in range(batches):
            requests = [Scored(1.7e9 + i, f"bench-{i:x}-{j}") for j in range(k)]
            log.write_impressions(requests, sizes, raw, scores)
        answer = time.thread_time() - started
        started = time.thread_time()
        log.impressions.flush()
        writer = time.thread_time() - started
    finally:
        log.close()
    return answer / batches * 1e6, writer / batches * 1e6


def run(args: argparse.Namespace) -> dict[str, Any]:
    decoded = [
        decode_json(orjson.dumps(doc), 100).raw for doc in request_docs(max(REQUESTS_PER_BATCH))
    ]
    cases = []
    with scratch_dir(prefix="relay-bench-log-record-") as home:
        for k in REQUESTS_PER_BATCH:
            raw = np.concatenate(decoded[:k])
            best: dict[str, list[tuple[float, float]]] = {f: [] for f in FORMS}
            for r in range(args.repeats):  # interleaved, so drift hits both forms alike
                for form in FORMS:
                    best[form].append(one_run(home / f"{k}-{form}-{r}", form, k, args.batches, raw))
            answer = {f: round(min(a for a, _ in runs), 1) for f, runs in best.items()}
            writer = {f: round(min(w for _, w in runs), 1) for f, runs in best.items()}
            case = {
                "requests_per_batch": k,
                "candidates_per_request": CANDIDATES,
                "answer_path_us_per_batch": answer,
                "answer_path_us_per_request": {f: round(v / k, 1) for f, v in answer.items()},
                "writer_us_per_batch": writer,
                "record_over_journal_answer_path": round(answer["record"] / answer["journal"], 3),
                "record_over_journal_total": round(
                    (answer["record"] + writer["record"]) / (answer["journal"] + writer["journal"]),
                    3,
                ),
            }
            cases.append(case)
            print(
                f"{k:2d} requests a batch: answer path {answer['record']:.0f} us (journal "
                f"{answer['journal']:.0f}), writer {writer['record']:.0f} us (journal "
                f"{writer['journal']:.0f}) per batch",
                flush=True,
            )
    return {
        "cases": cases,
        "config": {
            "batches": args.batches,
            "repeats": args.repeats,
            "statistic": "best of repeats",
        },
        "method": "time.thread_time of the engine-thread call and of the writer's flush, per batch",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.log_record", description=__doc__)
    parser.add_argument("--batches", type=int, default=8000, help="engine batches per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "log_record.json")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.repeats < 1:
        parser.error("--batches and --repeats must be at least 1")
    out = run(args)
    save(args.out, out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
