"""The production stack (deployments/production) is wired through the same settings as the demo.

No Docker engine here, so the compose file is checked as data: every Relay process is configured
only by Settings fields and PREFECT_API_URL, those values build a valid Settings, there is a
worker per work pool, GPUs are reserved where plans are built and served, and the load balancer
fronts exactly the workers the release flow drives.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from relay.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "deployments" / "production"
COMPOSE_TEXT = (STACK / "compose.yaml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict] = COMPOSE["services"]
SETTING_NAMES = {f"RELAY_{name.upper()}" for name in Settings.model_fields}
ALLOWED_ENV = SETTING_NAMES | {"PREFECT_API_URL"}
RELAY_DOCKERFILE = "deployments/production/Dockerfile"
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")

RELAY_SERVICES = {
    name: spec
    for name, spec in SERVICES.items()
    if isinstance(spec.get("build"), dict) and spec["build"].get("dockerfile") == RELAY_DOCKERFILE
}


def interpolate(value: str) -> str:
    """What compose would substitute, with a stand-in for every variable from .env."""
    return INTERPOLATION.sub(lambda m: f"dummy-{m.group(1).lower().replace('_', '-')}", value)


def env_of(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in SERVICES[service].get("environment", {}).items()}


FLEET = [urlparse(u) for u in env_of("worker-cpu")["RELAY_SERVING_FLEET_URLS"].split(",")]
SERVING = {u.hostname for u in FLEET}  # the workers the release flow drives


def gpu_devices(service: str) -> list[dict]:
    deploy = SERVICES[service].get("deploy", {})
    return deploy.get("resources", {}).get("reservations", {}).get("devices", [])


def test_the_stack_has_every_part():
    for part in ("postgres", "prefect-server", "clickhouse", "minio", "mlflow", "lb"):
        assert part in SERVICES, part
    assert SERVICES["prefect-server"]["environment"][
        "PREFECT_API_DATABASE_CONNECTION_URL"
    ].startswith("postgresql+asyncpg://")
    assert "postgresql://" in " ".join(SERVICES["mlflow"]["command"])


def test_relay_services_are_the_workers_the_serving_fleet_and_the_deploy_step():
    assert {"worker-cpu", "worker-gpu", "prefect-deploy"} <= set(RELAY_SERVICES)
    assert {name for name in RELAY_SERVICES if name.startswith("serving-")} == SERVING


@pytest.mark.parametrize("service", sorted(RELAY_SERVICES))
def test_relay_processes_read_only_settings_and_the_prefect_api_url(service):
    unknown = set(env_of(service)) - ALLOWED_ENV
    assert unknown == set(), f"{service} sets {unknown}, which relay/settings.py does not read"


def test_every_relay_variable_named_anywhere_is_a_setting():
    texts = [COMPOSE_TEXT, (STACK / "relay.env.example").read_text()]
    named = {n for text in texts for n in re.findall(r"\bRELAY_[A-Z0-9_]+\b", text)}
    named -= {"RELAY_IMAGE_TAG"}  # compose's own variable: which image tag to run
    assert named - SETTING_NAMES == set()


@pytest.mark.parametrize("service", sorted(RELAY_SERVICES))
def test_each_relay_process_gets_valid_settings(service, monkeypatch):
    for name in [n for n in os.environ if n.startswith("RELAY_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(service).items():
        monkeypatch.setenv(name, interpolate(value))
    settings = Settings()
    assert settings.resolved_model_store_url.startswith("s3://")
    assert settings.s3_endpoint and settings.s3_secret_key.get_secret_value()
    assert urlparse(settings.resolved_clickhouse_dsn).scheme in ("http", "https")
    assert settings.resolved_mlflow_uri.startswith("http://")
    assert env_of(service)["PREFECT_API_URL"].endswith("/api")


def test_secrets_come_from_the_environment_file_never_the_compose_file():
    secrets = ["RELAY_S3_ACCESS_KEY", "RELAY_S3_SECRET_KEY", "RELAY_SERVING_ADMIN_TOKEN"]
    for service in RELAY_SERVICES:
        for name in secrets:
            assert re.fullmatch(r"\$\{" + name + r":\?[^}]+\}", env_of(service)[name]), name
        dsn = env_of(service)["RELAY_CLICKHOUSE_DSN"]
        assert "${CLICKHOUSE_PASSWORD:?" in dsn
    ignored = (STACK / ".gitignore").read_text().split()
    assert ".env" in ignored


def test_a_worker_per_work_pool_of_prefect_yaml():
    pools = yaml.safe_load((ROOT / "prefect.yaml").read_text())["definitions"]["work_pools"]
    for pool in (spec["name"] for spec in pools.values()):
        workers = [
            name
            for name, spec in RELAY_SERVICES.items()
            if spec.get("command", [])[:3] == ["prefect", "worker", "start"]
            and spec["command"][spec["command"].index("--pool") + 1] == pool
        ]
        assert workers, f"no worker in pool {pool}"
        deploy_step = " ".join(SERVICES["prefect-deploy"]["command"])
        template = f"deployments/pools/{pool}.json"
        assert template in deploy_step and (ROOT / template).is_file()
    assert "prefect --no-prompt deploy --all" in " ".join(SERVICES["prefect-deploy"]["command"])


def test_plans_are_built_and_served_on_reserved_nvidia_gpus():
    for service in ["worker-gpu", *SERVING]:
        devices = gpu_devices(service)
        assert devices and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert SERVICES[service]["build"].get("args", {}).get("EXTRAS") == "gpu"
    assert gpu_devices("worker-cpu") == []
    serving_gpus = [tuple(gpu_devices(s)[0]["device_ids"]) for s in sorted(SERVING)]
    assert len(set(serving_gpus)) == len(serving_gpus), "two serving workers share a GPU"


def test_the_load_balancer_fronts_exactly_the_fleet_the_release_drives():
    nginx = (STACK / "nginx.conf").read_text()

    def upstream(name: str) -> set[str]:
        block = re.search(r"upstream " + name + r" \{(.*?)\}", nginx, re.S)
        assert block, name
        return set(re.findall(r"server (\S+?:\d+)", block.group(1)))

    http_port = env_of(next(iter(SERVING)))["RELAY_SERVING_PORT"]
    binary_port = env_of(next(iter(SERVING)))["RELAY_SERVING_BINARY_PORT"]
    assert upstream("relay_serving") == {f"{u.hostname}:{u.port}" for u in FLEET}
    assert {u.port for u in FLEET} == {int(http_port)}
    assert upstream("relay_binary") == {f"{host}:{binary_port}" for host in SERVING}
    assert "location = /v1/predict" in nginx and "/admin" not in nginx.split("http {")[1]
    for service in SERVING:
        assert env_of(service)["RELAY_SERVING_HOST"] == "0.0.0.0"
        assert env_of(service)["RELAY_SERVING_STABLE_REF"] == "champion"


def test_the_relay_image_bakes_no_connection_setting():
    dockerfile = (STACK / "Dockerfile").read_text()
    baked = set(re.findall(r"\b(RELAY_[A-Z_]+)=", dockerfile))
    assert baked == {"RELAY_HOME", "RELAY_REPO_DIR"}  # a path, and prefect.yaml's checkout
    assert 'ARG EXTRAS=""' in dockerfile and "${EXTRAS:+[$EXTRAS]}" in dockerfile
    assert "USER relay" in dockerfile
