# Relay: `make demo` runs a release on the embedded stack; `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PREFECT_PORT ?= 4200
export PREFECT_API_URL ?= http://127.0.0.1:$(PREFECT_PORT)/api
export PREFECT_HOME    ?= $(CURDIR)/.relay/prefect
export RELAY_PREFECT_UI_URL ?= http://127.0.0.1:$(PREFECT_PORT)
export RELAY_LOCAL_SERVING_PORTS ?= 8711 8712
# Flow runs (the demo's, and the pool worker's children) heartbeat every 30 s, Prefect's minimum:
# deployments/automations.yaml marks a release that misses three Crashed.
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY ?= 30
comma := ,
space := $(subst ,, )
export RELAY_SERVING_FLEET_URLS ?= $(subst $(space),$(comma),$(foreach p,$(RELAY_LOCAL_SERVING_PORTS),http://127.0.0.1:$(p)))
TOKEN_FILE := .relay/serving-admin-token

.PHONY: install browser stack demo test test-fast up down bench lint clean

install: $(VENV)/.installed

# torch is pinned to the CPU build that lies on the machine's disk; install it first so nothing
# else can pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# The local Prefect server, the two-worker serving fleet and the shop (shoppers calling the fleet
# as a real shop's would, at RELAY_SHOP_RPS feeds/s): what `make demo` runs against. Releases,
# the guard and drift-watch read whatever traffic the fleet gets; no flow drives any.
stack: install
	PREFECT_PORT=$(PREFECT_PORT) deployments/local/prefect-server.sh start
	deployments/local/serving.sh start
	deployments/local/shop.sh start

# The stack, plus the work pools, every deployment in prefect.yaml (schedules and UI buttons) and
# a worker in the `cpu` pool whose flow runs reach the fleet.
up: stack
	RELAY_REPO_DIR=$(CURDIR) deployments/local/deploy.sh
	RELAY_REPO_DIR=$(CURDIR) deployments/local/prefect-worker.sh start

down:
	-deployments/local/shop.sh stop
	-deployments/local/prefect-worker.sh stop
	-deployments/local/serving.sh stop
	PREFECT_PORT=$(PREFECT_PORT) deployments/local/prefect-server.sh stop

# The demo runs its flows in this process. It does not start the pool worker: the embedded
# ClickHouse admits one process at a time, and a scheduled guard run in a worker would contend.
# Its shop runs at 60 feeds/s (unless RELAY_SHOP_RPS says otherwise), enough for its canary
# steps of 25 % and 50 % to conclude within their windows, and closes after an hour: once the demo
# ends nothing ingests the embedded spool (under `make up` the scheduled flows do). A shop already
# running keeps its settings.
demo: export RELAY_SHOP_RPS ?= 60
demo: export RELAY_SHOP_ARGS ?= --max-hours 1
demo: stack
	RELAY_SERVING_ADMIN_TOKEN="$$(cat $(TOKEN_FILE))" $(BIN)/python -m relay_cli demo

# The UI test drives Debian's chromium through Playwright (never `playwright install`: that
# downloads a browser).
browser:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

# The suite in TEST_WORKERS pytest-xdist processes, one test file at a time each (tests/conftest.py
# groups them); TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
test: install browser
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The edit loop (<= 3 min on 2 cores): the unit tier in random order, the layer and size checks
# among it; no servers, no flow runs. `make test` runs everything, slow tests included.
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests/unit

bench: install
	$(BIN)/python -m bench.release

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy relay model_store logstore simulation tasks flows serving relay_cli relay_testing

clean: down
	rm -rf .relay
