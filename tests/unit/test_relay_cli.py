"""The `relay` command's read-only subcommands start fast: they import what they use, no more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Each costs seconds to import; a store look-up needs none of them.
HEAVY = ("prefect", "torch", "pandas", "onnxruntime", "mlflow", "clickhouse_connect", "chdb")

PROBE = """
import json, sys
from relay_cli.main import main
codes = [main(argv) for argv in (
    ["lineage", "show", "champion"],
    ["lineage", "diff", "champion", "candidate"],
    ["alias", "history", "champion"],
    ["store", "gc", "--dry-run"],
    ["impact", "history"],
)]
print(json.dumps({"codes": codes, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_read_only_commands_import_neither_prefect_nor_torch_nor_clickhouse(tmp_path: Path):
    env = {**os.environ, "RELAY_HOME": str(tmp_path), "RELAY_MODEL_STORE_URL": ""}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    # An empty store: no such version or alias (exit 1, one line on stderr), nothing to collect,
    # no release experiments yet.
    assert result["codes"] == [1, 1, 1, 0, 0], done.stderr
    assert "no release experiments in the store yet" in done.stdout
    assert "relay: no version 'champion'" in done.stderr
    assert [m for m in HEAVY if m in result["modules"]] == []
