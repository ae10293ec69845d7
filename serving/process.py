"""Start and stop serving workers as child processes: for tests, benchmarks and local runs.

with start_worker({"RELAY_SERVING_PORT": "0", ...}) as w:
    httpx.get(f"{w.http_url}/readyz")
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from relay.errors import ServingError

LISTENING = re.compile(
    r"serving: listening on (?P<http>http://\S+) binary tcp://(?P<host>[^:\s]+):(?P<port>\d+) "
    r"worker (?P<worker>\S+)"
)


@dataclass
class WorkerProcess:
    """A running `python -m serving` child and where it listens."""

    process: subprocess.Popen[str]
    http_url: str
    binary_host: str
    binary_port: int
    worker_id: str
    log_path: Path

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the worker drains and writes its log rows), SIGKILL if it overstays."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return int(self.process.returncode)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until /readyz answers 200. Raises ServingError with the log if it never does."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                break
            try:
                if httpx.get(f"{self.http_url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise ServingError(
            f"worker {self.worker_id} is not ready; its log:\n{self.log_text()[-4000:]}"
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_worker(
    env: Mapping[str, str],
    log_path: Path,
    *,
    args: Sequence[str] = (),
    timeout_s: float = 60.0,
    cpu: int | None = None,
    module: str = "serving",
) -> WorkerProcess:
    """Start `python -m serving` with `env` over this environment; wait until it listens.

    `cpu` pins the worker to one CPU (benchmarks). `module` runs another server that prints
    the same listening line (the benchmark's baselines). Raises ServingError with the worker's
    log if it exits or stays silent for `timeout_s`.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "w")  # noqa: SIM115 - the child owns it; closed below
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **env},  # handed through to the child, whose Settings read it
        stdout=subprocess.PIPE,
        stderr=log_file,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None,
    )
    log_file.close()
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(deadline - time.monotonic(), 0.01)):
                continue
            line = process.stdout.readline()
            if not line:
                break  # the child closed stdout: it exited
            match = LISTENING.search(line)
            if match:
                return WorkerProcess(
                    process=process,
                    http_url=match["http"],
                    binary_host=match["host"],
                    binary_port=int(match["port"]),
                    worker_id=match["worker"],
                    log_path=log_path,
                )
    process.kill()
    process.wait()
    raise ServingError(
        f"serving worker did not start within {timeout_s:.0f} s (exit {process.returncode}); "
        f"its log:\n{log_path.read_text(errors='replace')[-4000:]}"
    )
