#!/usr/bin/env bash
# Create the work pools (one per deployments/pools/<name>.json) and deploy everything in
# prefect.yaml against $PREFECT_API_URL. Idempotent: pools are overwritten, deployments updated.
set -euo pipefail
bin="${VENV_BIN:-$PWD/.venv/bin}"
repo="${RELAY_REPO_DIR:-$PWD}"
log="${RELAY_HOME:-$PWD/.relay}/prefect-deploy.log"
: "${PREFECT_API_URL:?PREFECT_API_URL must point at the Prefect server (the Makefile sets it)}"
mkdir -p "$(dirname "$log")"
: >"$log"

for template in "$repo"/deployments/pools/*.json; do
  pool="$(basename "$template" .json)"
  "$bin/prefect" work-pool create "$pool" --type process --base-job-template "$template" \
    --overwrite >>"$log" 2>&1 || { echo "creating work pool $pool failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
  echo "work pool $pool (process, template $template)"
done

# prefect.yaml's pull step resolves {{ $RELAY_REPO_DIR }} now, at deploy time: flow runs start
# in this checkout.
(cd "$repo" && RELAY_REPO_DIR="$repo" "$bin/prefect" --no-prompt deploy --all >>"$log" 2>&1) \
  || { echo "prefect deploy --all failed; see $log" >&2; tail -30 "$log" >&2; exit 1; }
grep -o "Deployment '[^']*' successfully [a-z]*" "$log" | sed "s/^/prefect: /"
