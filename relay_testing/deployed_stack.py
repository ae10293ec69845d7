"""A deployed local Relay stack for tests, started the way `make up` starts it.

A real Prefect server on a free loopback port (deployments/local/prefect-server.sh), the work
pools and every deployment of prefect.yaml (deployments/local/deploy.sh), a process worker in
the `cpu` pool (deployments/local/prefect-worker.sh) and, when asked, serving workers and the
shop (deployments/local/shop.sh; `make up` always starts it, tests only when they need it, so
that the other tests' canaries see only the traffic they drive).

Everything runs in subprocesses with a private RELAY_HOME and PREFECT_HOME. chdb admits one
engine path per process and the pytest process may already hold the session's path, so nothing
here opens ClickHouse: events are seeded by a subprocess, and results are read from the Prefect
REST API, the model store's files and the serving workers' admin API.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from model_store import ModelStore, open_store
from relay.settings import Settings
from relay_testing.shop import Shop
from serving.fleet import FleetClient, WorkerResult
from serving.process import WorkerProcess, start_worker

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPTS = REPO / "deployments" / "local"
TOKEN = "deployed-stack-admin-token"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
UUID = re.compile(r"UUID: ([0-9a-f-]{36})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DeployedStack:
    """Paths, ports and environment of one stack; `start()` brings it up, `stop()` takes it down."""

    root: Path
    port: int = field(default_factory=free_port)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. a short canary lease
    serving: list[WorkerProcess] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # what stop() must undo, in start order

    @property
    def home(self) -> Path:
        return self.root / "relay"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def fleet_urls(self) -> list[str]:
        return [w.http_url for w in self.serving]

    @property
    def env(self) -> dict[str, str]:
        """What every process of the stack sees: nothing from the developer's or pytest's own
        RELAY_*/PREFECT_* settings, everything pointing into this stack's private folders."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "PREFECT_"))}
        return {
            **base,
            "VENV_BIN": str(BIN),
            "PREFECT_HOME": str(self.root / "prefect"),
            "PREFECT_PORT": str(self.port),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # Schedules are stored and shown, but no scheduled run (release-guard every 10
            # minutes) may start mid-test and compete for the embedded ClickHouse.
            "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "RELAY_HOME": str(self.home),
            "RELAY_REPO_DIR": str(REPO),
            "RELAY_MODEL_STORE_URL": f"file://{self.home / 'models'}",
            "RELAY_CLICKHOUSE_DSN": f"chdb://{self.home / 'clickhouse'}",
            "RELAY_MLFLOW_TRACKING_URI": f"sqlite:///{self.home / 'mlflow.db'}",
            "RELAY_PREFECT_UI_URL": self.ui_url,
            "RELAY_SERVING_FLEET_URLS": ",".join(self.fleet_urls),
            **self.extra_env,
        }

    # -- bringing it up and down ---------------------------------------------------------------
    def start(self, serving_workers: int = 0) -> DeployedStack:
        """Server, serving workers, pools + deployments, then the `cpu` pool worker."""
        self.home.mkdir(parents=True, exist_ok=True)
        # the admin token where `make up` keeps it: the worker script hands it to flow runs
        token_file = self.home / "serving-admin-token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        self.started.append("server")  # before: a server that never answers is stopped too
        self._script("prefect-server.sh", "start", timeout_s=180)
        for i in range(serving_workers):
            self.start_serving_worker(i)
        self._script("deploy.sh", timeout_s=240)
        self.started.append("worker")
        self._script("prefect-worker.sh", "start", timeout_s=90)
        return self

    def start_serving_worker(self, i: int) -> WorkerProcess:
        env = {
            **{k: v for k, v in self.env.items() if k.startswith("RELAY_")},
            "RELAY_SERVING_PORT": "0",
            "RELAY_SERVING_BINARY_PORT": "0",
            "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
            "RELAY_SERVING_STABLE_REF": "champion",
            "RELAY_SERVING_LOG_FLUSH_MS": "100",
            "RELAY_SERVING_SPOOL_DIR": "",  # <home>/spool: the folder flow runs ingest
            "RELAY_SERVING_CACHE_DIR": "",
        }
        worker = start_worker(env, self.root / f"serving-{i}.log")
        self.serving.append(worker)
        return worker

    def start_shop(self, rate_rps: float, shop: Mapping[str, int], round_s: float = 4.0) -> None:
        """`deployments/local/shop.sh start`, as `make up` runs it, with this shop's world."""
        self.started.append("shop")
        Shop(self.env).start(rate_rps, shop, round_s)

    def stop_shop(self) -> str:
        """Stop the shop (the script waits while it ends its round); its log."""
        log = Shop(self.env).stop()
        if "shop" in self.started:
            self.started.remove("shop")
        return log

    def shop_log(self) -> str:
        return Shop(self.env).log()

    def stop(self) -> None:
        """Everything this stack started, side by side (each waits for its process); never raises."""
        stops: list[Callable[[], object]] = [w.stop for w in self.serving]
        if "shop" in self.started:
            stops.append(lambda: self._script("shop.sh", "stop", check=False))
        if "worker" in self.started:
            stops.append(lambda: self._script("prefect-worker.sh", "stop", check=False))
        if "server" in self.started:
            stops.append(lambda: self._script("prefect-server.sh", "stop", check=False))
        with ThreadPoolExecutor(max_workers=len(stops) or 1) as pool:
            for stopped in [pool.submit(stop) for stop in stops]:
                stopped.exception()  # waits; a failed stop must not hide the others
        self.started.clear()

    def _script(
        self, name: str, *args: str, timeout_s: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(SCRIPTS / name), *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{name} {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    # -- data ----------------------------------------------------------------------------------
    def seed_events(
        self, n_events: int, end: datetime | None = None, shop: Mapping[str, int] | None = None
    ) -> subprocess.Popen[str]:
        """Start seeding `n_events` simulated events over the 7 days before `end` in a subprocess
        (it opens the stack's chdb; this process never does). None/None: `relay seed` itself,
        ending now with the default shop. Wait for it with `finish()`."""
        if end is None and shop is None:
            args = ["-m", "relay_cli", "seed", "--events", str(n_events)]
        else:
            end = end or datetime.now(UTC)
            args = [
                "-c",
                "import datetime as d, logstore; from relay.settings import get_settings; "
                "from simulation.seed import seed_events; from simulation.shop import ShopConfig; "
                "seed_events(logstore.connect(get_settings().resolved_clickhouse_dsn), "
                f"{n_events}, d.datetime.fromisoformat({end.isoformat()!r}), "
                f"config=ShopConfig(**{dict(shop or {})!r}))",
            ]
        self.home.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def store(self) -> ModelStore:
        """The stack's model store, read through its files (no chdb involved)."""
        return open_store(Settings(model_store_url=f"file://{self.home / 'models'}"))

    def fleet_stable(self) -> set[str | None]:
        """The version each serving worker holds in its stable slot."""
        return {w.stable_version for w in self.fleet_state()}

    def fleet_state(self) -> list[WorkerResult]:
        with FleetClient(self.fleet_urls, TOKEN) as fleet:
            return fleet.state().workers

    def canary_weights(self) -> set[int]:
        return {int(w.state.get("canary_weight", -1)) for w in self.fleet_state()}

    def release_events(self, release_id: str) -> list[dict[str, Any]]:
        """The release's release_events rows, read by a subprocess (this one never opens chdb).

        chdb admits one process per path, and a flow run is reported COMPLETED by its own process
        before that process exits and lets go of the engine: so the read waits until the pool has
        no flow-run process alive (a fresh-clone run failed 'Cannot lock file .../status' reading
        right after a guard run completed)."""
        self.wait_for(
            lambda: self.flow_run_pids() == [], 120, "moment with no flow-run process in the pool"
        )
        deadline = time.monotonic() + 60
        while True:  # a run the pool starts in between holds it for that run's length: retry
            done = self._read_release_events(release_id)
            if "Cannot lock file" not in done.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout.splitlines()[-1]))

    def _read_release_events(self, release_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, sys, logstore; from relay.settings import get_settings; "
                "from logstore.release_events import events_of_release; "
                "c = logstore.connect(get_settings().resolved_clickhouse_dsn); "
                "print(json.dumps([dict(kind=e.kind, verdict=e.verdict, reason=e.reason, "
                "details=e.details) for e in events_of_release(c, sys.argv[1])]))",
                release_id,
            ],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    # -- losing a host -------------------------------------------------------------------------
    def kill_pool_worker(self) -> list[int]:
        """SIGKILL the `cpu` pool worker and every flow run it started (each in its own session,
        so its whole process group): as if its host were lost. The killed flow runs' pids."""
        pid = int((self.home / "prefect-worker" / "worker-cpu.pid").read_text())
        children = self.flow_run_pids()
        os.kill(pid, signal.SIGKILL)
        for child in children:
            try:
                os.killpg(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        # gone before anyone asks: the worker script's "already running?" check reads this pid
        for gone in (pid, *children):
            self.wait_for(partial(_exited, gone), 30, f"process {gone} to exit")
        return children

    def flow_run_pids(self) -> list[int]:
        """The flow-run processes the `cpu` pool worker has running (each leads its own session)."""
        pid = int((self.home / "prefect-worker" / "worker-cpu.pid").read_text())
        found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        return [int(p) for p in found.stdout.split()]

    def run_embedded_release(
        self, parameters: Mapping[str, Any], log: Path
    ) -> subprocess.Popen[bytes]:
        """The release flow in a process of its own against this server, as `make demo` runs it
        (heartbeats every 30 s, as the Makefile sets), in its own session."""
        code = (
            "import json, sys; from flows.release import retrain_and_release; "
            "retrain_and_release(**json.loads(sys.argv[1]))"
        )
        with log.open("wb") as sink:
            return subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(dict(parameters), default=str)],
                cwd=REPO,
                env={
                    **self.env,
                    "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
                    "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
                },
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_pool_worker(self) -> None:
        self._script("prefect-worker.sh", "start", timeout_s=90)

    # -- Prefect -------------------------------------------------------------------------------
    def prefect(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """The `prefect` CLI against this stack's server; never raises on a non-zero exit."""
        return subprocess.run(
            [str(BIN / "prefect"), *args],
            cwd=REPO,
            env={**self.env, "COLUMNS": "200"},  # the CLI wraps its messages at the terminal width
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def run_deployment(
        self, name: str, parameters: Mapping[str, Any], run_name: str | None = None
    ) -> str:
        """`prefect deployment run NAME -p k=<json> ...`; the new flow run's id."""
        args = ["deployment", "run", name]
        for key, value in parameters.items():
            args += ["--param", f"{key}={json.dumps(value, default=str)}"]
        if run_name:
            args += ["--flow-run-name", run_name]
        done = self.prefect(*args)
        found = UUID.search(done.stdout)
        assert done.returncode == 0 and found, f"deployment run failed:\n{done.stdout}{done.stderr}"
        return found.group(1)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        response = httpx.request(method, f"{self.api_url}{path}", json=body, timeout=30)
        response.raise_for_status()
        return response.json() if response.content else None

    def wait_for_run(self, flow_run_id: str, timeout_s: float = 300) -> dict[str, Any]:
        """The flow run once it is final. Fails with the worker's log if it is not in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api("GET", f"/flow_runs/{flow_run_id}")
            if run["state_type"] in FINAL:
                return run
            time.sleep(1)
        raise AssertionError(
            f"flow run {flow_run_id} not final after {timeout_s:.0f} s "
            f"(state {run['state_name']}); worker log:\n{self.worker_log()[-6000:]}"
        )

    def end_release(self, flow_run_id: str, timeout_s: float = 300) -> None:
        """A release run started with the deployment's defaults, once it is final: one that ends
        before any canary (unblessed, say) is waited for; one whose canary takes weight (a plan
        of many minutes) is cancelled as on-call would from its run page, and must end
        Cancelled. Either way no canary may outlive it (its hook, at worst its lease)."""

        def canary_or_end() -> str | None:
            if self.api("GET", f"/flow_runs/{flow_run_id}")["state_type"] in FINAL:
                return "ended"
            return "canary" if self.canary_weights() != {0} else None

        if self.wait_for(canary_or_end, timeout_s, "the release's canary or its end") == "canary":
            cancel = self.prefect("flow-run", "cancel", flow_run_id)
            assert cancel.returncode == 0, cancel.stdout + cancel.stderr
            final = self.wait_for_run(flow_run_id, timeout_s=120)
            assert final["state_type"] == "CANCELLED", final["state"]
        self.wait_for(lambda: self.canary_weights() == {0}, 120, "no canary after the release")

    def artifacts(self, flow_run_id: str) -> dict[str, dict[str, Any]]:
        """The flow run's keyed artifacts by key."""
        found = self.api(
            "POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
        )
        return {a["key"]: a for a in found if a.get("key")}

    def flow_runs_of(self, deployment: str, include_adhoc: bool = False) -> list[dict[str, Any]]:
        """The deployment's flow runs; with `include_adhoc`, every run of its flow (a run started
        in its own process has no deployment)."""
        flow_name, _, name = deployment.partition("/")
        if include_adhoc:
            return self.api("POST", "/flow_runs/filter", {"flows": {"name": {"any_": [flow_name]}}})
        found = self.api("GET", f"/deployments/name/{flow_name}/{name}")
        return self.api(
            "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [found["id"]]}}}
        )

    def active_runs(self) -> list[dict[str, Any]]:
        """Flow runs of any flow not yet final (scheduled ones included: they start soon)."""
        active = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]
        return self.api(
            "POST", "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": active}}}}
        )

    def wait_for(self, found: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """Poll `found` every second until it returns something truthy; that value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = found()
            if value:
                return value
            time.sleep(1)
        raise AssertionError(
            f"no {what} after {timeout_s:.0f} s; worker log:\n{self.worker_log()[-4000:]}"
        )

    def worker_log(self) -> str:
        path = self.home / "prefect-worker" / "worker-cpu.log"
        return path.read_text(errors="replace") if path.exists() else "(no worker log)"


def _exited(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def outcome_of(artifacts: Mapping[str, Mapping[str, Any]]) -> str:
    """The release-outcome artifact's headline, e.g. 'Release promoted'."""
    return str(artifacts["release-outcome"]["data"]).splitlines()[0].lstrip("# ").strip()


def finish(process: subprocess.Popen[str], timeout_s: float = 300) -> str:
    """Wait for a subprocess started here: its output, or an AssertionError that carries it."""
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, f"{process.args!r} exited {process.returncode}:\n{out}"
    return out
