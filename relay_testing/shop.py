"""The shop process for tests, started and stopped the way `make up` does it (deployments/local/shop.sh).

Tests that need a canary to get traffic run the real shop against their fleet, as production
gets real users: the release flow itself drives nothing. `env` must name the fleet
(RELAY_SERVING_FLEET_URLS) and the home whose spool the test's log store ingests (RELAY_HOME).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "deployments" / "local" / "shop.sh"


@dataclass
class Shop:
    """One shop process: `start` it at a rate over a shop's world, `stop` it (it ends its round)."""

    env: Mapping[str, str]
    running: bool = False

    @property
    def home(self) -> Path:
        return Path(self.env["RELAY_HOME"]) / "shop"

    def start(self, rate_rps: float, world: Mapping[str, int], round_s: float = 4.0) -> None:
        args = (
            f"--shop-seed {world['seed']} --n-users {world['n_users']} "
            f"--n-items {world['n_items']} --round-s {round_s:g}"
        )
        self._script("start", {"RELAY_SHOP_RPS": f"{rate_rps:g}", "RELAY_SHOP_ARGS": args})
        self.running = True

    def stop(self) -> str:
        """Stop the shop (the script waits while it ends its round); its log so far."""
        pid = int((self.home / "shop.pid").read_text())
        self._script("stop")
        self.running = False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return self.log()
        raise AssertionError(f"shop process {pid} still running after shop.sh stop")

    def log(self) -> str:
        path = self.home / "shop.log"
        return path.read_text() if path.exists() else ""

    def _script(self, action: str, extra: Mapping[str, str] | None = None) -> None:
        env = {"VENV_BIN": str(Path(sys.executable).parent), **self.env, **(extra or {})}
        done = subprocess.run(
            [str(SCRIPT), action], cwd=REPO, env=env, capture_output=True, text=True, timeout=90
        )
        if done.returncode != 0:
            raise AssertionError(
                f"shop.sh {action} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
