"""Model-store throughput on S3 against plain minio on the same file and server, and the memory
a put needs.

    python -m bench.store [--size-mb 256] [--rounds 5] [--out PATH]

Writes bench/results/store.json (or --out) with artifact_mb, store_put_mb_s, raw_put_mb_s, store_get_mb_s,
raw_get_mb_s and peak_rss_mb (MB here = MiB, 2**20 bytes). "store" is ModelStore.put_blob /
fetch_blob: hash, deduplication check, upload, confirmation and lease; download with the hash
checked while streaming. "raw" is minio's fput_object / fget_object with the same part size.
Each figure is the median of the rounds, store and raw alternating who goes first.

Where a get's time goes, per get (medians): get_cpu_s {store, raw, server} is CPU seconds of
this process (all its threads) and of the S3 server's process; sha256_mb_s is this host's
hashlib sha256 throughput on one core, measured here; raw_verified_get_mb_s is raw fget_object
followed by a sha256 of the file, the same guarantee as the store's get done the plain way.
get_peak_rss_mb is the peak resident memory during a store get (put's is peak_rss_mb).

The S3 server (moto's standalone server here, MinIO in production) runs in its own process on
127.0.0.1, so its CPU and memory are not counted as this process's. The artifact is a temporary
file under /tmp, deleted at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import multiprocessing
import os
import resource
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

from bench.saved import save
from model_store import ModelStore, open_store
from model_store.hashing import sha256_file
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
def s3_server() -> Iterator[tuple[str, int]]:
    """(host:port, pid) of an S3 server running in a separate process."""
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    process = spawn.Process(target=_serve, args=(ports,), daemon=True)
    process.start()
    try:
        port = ports.get(timeout=60)
        assert process.pid is not None
        yield f"127.0.0.1:{port}", process.pid
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


def own_cpu_s() -> float:
    """CPU seconds this process (every thread) has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu_s(pid: int) -> float:
    """CPU seconds another process has used (utime + stime from /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sha256_rate(size: int = 64 * MIB) -> float:
    """MiB/s of hashlib's sha256 on one core here, over 4 MiB updates (CPU time, not wall)."""
    data = memoryview(os.urandom(size))
    digest = hashlib.sha256()
    start = time.process_time()
    for offset in range(0, size, 4 * MIB):
        digest.update(data[offset : offset + 4 * MIB])
    return size / MIB / (time.process_time() - start)


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


class Rounds:
    """One S3 server, the store and a plain minio client on it, and what each step measured."""

    def __init__(self, endpoint: str, server_pid: int, workdir: Path, artifact: Path) -> None:
        settings = Settings(
            model_store_url=f"s3://{BUCKET}/relay",
            s3_endpoint=endpoint,
            s3_access_key=SecretStr(ACCESS_KEY),
            s3_secret_key=SecretStr(SECRET_KEY),
        )
        self.part_size = settings.s3_part_size_mb * MIB
        self.store = open_store(settings)
        self.raw = Minio(endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False)
        self.server_pid = server_pid
        self.workdir = workdir
        self.artifact = artifact
        self.ref: BlobRef | None = None
        self.times: dict[str, list[float]] = {key: [] for key in STEPS}
        self.cpu: dict[str, list[tuple[float, float]]] = {key: [] for key in STEPS}
        self.put_peaks: list[float] = []
        self.get_peaks: list[float] = []
        warm = workdir / "warm.bin"
        warm.write_bytes(b"creates the bucket and checks it is private")
        self.store.put_blob(warm)

    def measure(self, key: str, action: Callable[[], Any]) -> None:
        """Wall time and CPU (ours, the server's) of one step."""
        own, server = own_cpu_s(), pid_cpu_s(self.server_pid)
        self.times[key].append(timed(action))
        self.cpu[key].append((own_cpu_s() - own, pid_cpu_s(self.server_pid) - server))

    def store_put(self) -> None:
        if self.ref is not None:
            forget_blob(self.store, self.ref)

        def put() -> None:
            self.ref = self.store.put_blob(self.artifact)

        with peak_rss() as peak:
            self.measure("store_put", put)
        self.put_peaks.append(peak[0])

    def raw_put(self) -> None:
        self.measure(
            "raw_put",
            lambda: self.raw.fput_object(
                BUCKET, "raw/artifact.onnx", str(self.artifact), part_size=self.part_size
            ),
        )

    def store_get(self) -> None:
        ref, dest = self.ref, self.workdir / "store-get.onnx"
        assert ref is not None
        self.measure("store_get", lambda: self.store.fetch_blob(ref, dest))
        dest.unlink()

    def store_get_peak(self) -> None:
        """Peak RSS of one more store get, untimed (the sampler thread costs CPU and the GIL)."""
        ref, dest = self.ref, self.workdir / "store-get.onnx"
        assert ref is not None
        with peak_rss() as peak:
            self.store.fetch_blob(ref, dest)
        self.get_peaks.append(peak[0])
        dest.unlink()

    def raw_get(self) -> None:
        dest = self.workdir / "raw-get.onnx"
        self.measure(
            "raw_get", lambda: self.raw.fget_object(BUCKET, "raw/artifact.onnx", str(dest))
        )
        dest.unlink()

    def raw_verified_get(self) -> None:
        """fget_object then a sha256 of the file: the store's guarantee, done the plain way."""
        dest = self.workdir / "raw-verified.onnx"

        def get_and_hash() -> None:
            self.raw.fget_object(BUCKET, "raw/artifact.onnx", str(dest))
            sha256_file(dest)

        self.measure("raw_verified_get", get_and_hash)
        dest.unlink()

    def round(self, round_no: int) -> None:
        order = [self.store_put, self.raw_put, self.store_get, self.raw_get, self.raw_verified_get]
        if round_no % 2:
            order = [
                self.raw_put,
                self.store_put,
                self.raw_verified_get,
                self.raw_get,
                self.store_get,
            ]
        for step in order:
            step()


STEPS = ("store_put", "raw_put", "store_get", "raw_get", "raw_verified_get")


def run(size_mb: int, rounds: int, workdir: Path) -> dict[str, Any]:
    size = size_mb * MIB
    artifact = workdir / "artifact.onnx"
    write_artifact(artifact, size)
    with s3_server() as (endpoint, server_pid):
        bench = Rounds(endpoint, server_pid, workdir, artifact)
        baseline = rss_mib()
        for round_no in range(rounds):
            bench.round(round_no)
        bench.store_get_peak()
        # Memory must not grow with the artifact: a put a quarter the size, for comparison.
        small = workdir / "small.onnx"
        write_artifact(small, size // 4)
        small_peak = store_put_peak(bench.store, small)
    figures = summarise(bench, size_mb)
    report(bench, figures, baseline, small_peak, endpoint)
    return figures


def summarise(bench: Rounds, size_mb: int) -> dict[str, Any]:
    """The JSON figures: medians over the rounds."""

    def rate(key: str) -> float:
        return round(size_mb / statistics.median(bench.times[key]), 1)

    def cpu(key: str, which: int) -> float:
        return round(statistics.median(c[which] for c in bench.cpu[key]), 3)

    return {
        "artifact_mb": size_mb,
        "rounds": len(bench.times["store_get"]),
        "store_put_mb_s": rate("store_put"),
        "raw_put_mb_s": rate("raw_put"),
        "store_get_mb_s": rate("store_get"),
        "raw_get_mb_s": rate("raw_get"),
        "raw_verified_get_mb_s": rate("raw_verified_get"),
        "peak_rss_mb": round(max(bench.put_peaks), 1),
        "get_peak_rss_mb": round(max(bench.get_peaks), 1),
        "get_cpu_s": {
            "store": cpu("store_get", 0),
            "raw": cpu("raw_get", 0),
            "raw_verified": cpu("raw_verified_get", 0),
            "server_store": cpu("store_get", 1),
            "server_raw": cpu("raw_get", 1),
        },
        "sha256_mb_s": round(sha256_rate(), 1),
        "cpu_cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def report(
    bench: Rounds, figures: dict[str, Any], baseline: float, small_peak: float, endpoint: str
) -> None:
    size_mb = figures["artifact_mb"]
    print(
        f"artifact {size_mb} MiB, {figures['rounds']} rounds, part size "
        f"{bench.part_size // MIB} MiB, server {endpoint}"
    )
    for key in STEPS:
        runs = ", ".join(f"{size_mb / t:.0f}" for t in bench.times[key])
        cpu = statistics.median(c[0] for c in bench.cpu[key])
        server = statistics.median(c[1] for c in bench.cpu[key])
        print(
            f"  {key:<17} median {size_mb / statistics.median(bench.times[key]):>7.1f} MiB/s  "
            f"cpu ours {cpu:.2f} s, server {server:.2f} s   (rounds: {runs})"
        )
    print(
        f"  store/raw  put {figures['store_put_mb_s'] / figures['raw_put_mb_s']:.2f}, "
        f"get {figures['store_get_mb_s'] / figures['raw_get_mb_s']:.2f}   (target >= 0.9 both); "
        f"get vs raw+sha256 {figures['store_get_mb_s'] / figures['raw_verified_get_mb_s']:.2f}"
    )
    print(
        f"  sha256 here: {figures['sha256_mb_s']:.0f} MiB/s per core "
        f"({size_mb / figures['sha256_mb_s']:.2f} CPU s per {size_mb} MiB); "
        f"{figures['cpu_cores']} cores, load {figures['load_avg_1m']}"
    )
    print(
        f"  peak RSS during a {size_mb} MiB put: {figures['peak_rss_mb']:.0f} MiB, during a get: "
        f"{figures['get_peak_rss_mb']:.0f} MiB (process at rest {baseline:.0f} MiB); "
        f"during a {size_mb // 4} MiB put: {small_peak:.0f} MiB"
    )


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
    save(args.out, figures)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
