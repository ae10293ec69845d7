#!/usr/bin/env bash
# Create the work pools (one per deployments/pools/<name>.json), deploy everything in
# prefect.yaml and create the automations of deployments/automations.yaml against
# $PREFECT_API_URL. Idempotent: pools are overwritten, deployments updated, automations replaced
# by name.
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

# Automations have no "update by name": each one of the file is deleted (if there) and created.
automations="$repo/deployments/automations.yaml"
"$bin/python" -c 'import sys, yaml; print("\n".join(a["name"] for a in yaml.safe_load(open(sys.argv[1]))["automations"]))' \
  "$automations" | while read -r name; do
  "$bin/prefect" --no-prompt automation delete "$name" >>"$log" 2>&1 || true  # absent the first time
done
"$bin/prefect" --no-prompt automation create --from-file "$automations" >>"$log" 2>&1 \
  || { echo "creating the automations of $automations failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
grep -o "Created automation '[^']*'\|  - '[^']*' with id" "$log" | sed "s/^/prefect: /"
