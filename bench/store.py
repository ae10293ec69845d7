"""Model-store throughput on S3 against plain minio on the same file and server, and the memory
a put needs.

    python -m bench.store [--size-mb 256] [--rounds 5] [--out PATH]

Writes bench/results/store.json (or --out) with artifact_mb, store_put_mb_s, raw_put_mb_s, store_get_mb_s,
raw_get_mb_s and peak_rss_mb (MB here = MiB, 2**20 bytes). "store" is ModelStore.put_blob /
fetch_blob: hash, deduplication check, upload, confirmation and lease; download with the hash
checked while streaming. "raw" is minio's fput_object / fget_object with the same part size.
Each figure is the median of the rounds, store and raw alternating who goes first.

The S3 server (moto's standalone server here, MinIO in production) runs in its own process on
127.0.0.1, so its CPU and memory are not counted as this process's. The artifact is a temporary
file under /tmp, deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

from minio import Minio
from pydantic import SecretStr

from model_store import ModelStore, open_store
from model_store.store import blob_key, lease_key
from relay.settings import Settings
from relay.types import BlobRef

MIB = 1024 * 1024
RESULTS = Path(__file__).parent / "results" / "store.json"
MIN_RESULT_MB = 200  # smaller artifacts say little about throughput or flat memory
BUCKET = "relay-bench"
ACCESS_KEY = "bench-access"
SECRET_KEY = "bench-secret-key"


def _serve(ports: Queue) -> None:
    """Child process: an S3 API server on loopback until the parent terminates it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    ports.put(server.get_host_and_port()[1])
    threading.Event().wait()


@contextmanager
def s3_server() -> Iterator[str]:
    """host:port of an S3 server running in a separate process."""
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    process = spawn.Process(target=_serve, args=(ports,), daemon=True)
    process.start()
    try:
        yield f"127.0.0.1:{ports.get(timeout=60)}"
    finally:
        process.terminate()
        process.join(timeout=10)


def rss_mib() -> float:
    """This process's resident memory now."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@contextmanager
def peak_rss() -> Iterator[list[float]]:
    """Sample resident memory every 5 ms while the block runs; the list ends with the peak."""
    peak = [rss_mib()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], rss_mib())


def timed(action: Callable[[], Any]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def write_artifact(path: Path, size: int) -> None:
    with open(path, "wb") as out:
        for offset in range(0, size, 4 * MIB):
            out.write(os.urandom(min(4 * MIB, size - offset)))


def forget_blob(store: ModelStore, ref: BlobRef) -> None:
    """Remove a blob so the next put uploads again instead of deduplicating."""
    store.backend.delete(blob_key(ref.sha256))
    store.backend.delete(lease_key(ref.sha256))


def store_put_peak(store: ModelStore, path: Path) -> float:
    """Peak resident memory (MiB) during one store put of a fresh blob."""
    with peak_rss() as peak:
        ref = store.put_blob(path)
    forget_blob(store, ref)
    return peak[0]


def run(size_mb: int, rounds: int, workdir: Path) -> dict[str, float]:
    size = size_mb * MIB
    artifact = workdir / "artifact.onnx"
    write_artifact(artifact, size)
    with s3_server() as endpoint:
        settings = Settings(
            model_store_url=f"s3://{BUCKET}/relay",
            s3_endpoint=endpoint,
            s3_access_key=SecretStr(ACCESS_KEY),
            s3_secret_key=SecretStr(SECRET_KEY),
        )
        part_size = settings.s3_part_size_mb * MIB
        store = open_store(settings)
        raw = Minio(endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False)
        warm = workdir / "warm.bin"
        warm.write_bytes(b"creates the bucket and checks it is private")
        store.put_blob(warm)

        times: dict[str, list[float]] = {
            "store_put": [],
            "raw_put": [],
            "store_get": [],
            "raw_get": [],
        }
        peaks: list[float] = []
        ref: BlobRef | None = None
        baseline = rss_mib()
        for round_no in range(rounds):

            def store_put() -> None:
                nonlocal ref
                if ref is not None:
                    forget_blob(store, ref)
                with peak_rss() as peak:
                    start = time.perf_counter()
                    ref = store.put_blob(artifact)
                    times["store_put"].append(time.perf_counter() - start)
                peaks.append(peak[0])

            def raw_put() -> None:
                times["raw_put"].append(
                    timed(
                        lambda: raw.fput_object(
                            BUCKET, "raw/artifact.onnx", str(artifact), part_size=part_size
                        )
                    )
                )

            def store_get() -> None:
                assert ref is not None
                dest = workdir / "store-get.onnx"
                times["store_get"].append(timed(lambda: store.fetch_blob(ref, dest)))
                dest.unlink()

            def raw_get() -> None:
                dest = workdir / "raw-get.onnx"
                times["raw_get"].append(
                    timed(lambda: raw.fget_object(BUCKET, "raw/artifact.onnx", str(dest)))
                )
                dest.unlink()

            order = [store_put, raw_put, store_get, raw_get]
            if round_no % 2:
                order = [raw_put, store_put, raw_get, store_get]
            for step in order:
                step()

        # Memory must not grow with the artifact: a put a quarter the size, for comparison.
        small = workdir / "small.onnx"
        write_artifact(small, size // 4)
        small_peak = store_put_peak(store, small)

    def rate(key: str) -> float:
        return round(size_mb / statistics.median(times[key]), 1)

    figures = {
        "artifact_mb": size_mb,
        "store_put_mb_s": rate("store_put"),
        "raw_put_mb_s": rate("raw_put"),
        "store_get_mb_s": rate("store_get"),
        "raw_get_mb_s": rate("raw_get"),
        "peak_rss_mb": round(max(peaks), 1),
    }
    print(
        f"artifact {size_mb} MiB, {rounds} rounds, part size {part_size // MIB} MiB, server {endpoint}"
    )
    for key in ("store_put", "raw_put", "store_get", "raw_get"):
        runs = ", ".join(f"{size_mb / t:.0f}" for t in times[key])
        print(f"  {key:<10} median {rate(key):>7.1f} MiB/s   (rounds: {runs})")
    print(
        f"  store/raw  put {figures['store_put_mb_s'] / figures['raw_put_mb_s']:.2f}, "
        f"get {figures['store_get_mb_s'] / figures['raw_get_mb_s']:.2f}   (target >= 0.9 both)"
    )
    print(
        f"  peak RSS during a {size_mb} MiB put: {figures['peak_rss_mb']:.0f} MiB "
        f"(process at rest {baseline:.0f} MiB); during a {size_mb // 4} MiB put: {small_peak:.0f} MiB"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-mb", type=int, default=256, help=f"artifact size in MiB (>= {MIN_RESULT_MB})"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.size_mb < 1:
        parser.error("--size-mb must be at least 1")
    if args.size_mb < MIN_RESULT_MB and args.out.resolve() == RESULTS.resolve():
        # bench/results keeps comparable figures only; a smaller (smoke) run writes elsewhere
        parser.error(
            f"the benchmark's artifact must be at least {MIN_RESULT_MB} MiB "
            "(a smaller run must write elsewhere: --out)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-store-", dir="/tmp"))
    try:
        figures = run(args.size_mb, args.rounds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
