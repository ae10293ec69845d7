"""Connections and locations: the one place Relay reads the environment.

Run knobs (SLO targets, canary steps, thresholds) are flow parameters, not settings.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every connection Relay makes, with embedded defaults that need no servers."""

    model_config = SettingsConfigDict(env_prefix="RELAY_", extra="ignore")

    home: Path = Field(default=Path(".relay"), description="Working directory for embedded state.")
    model_store_url: str = Field(
        default="",
        description="file:///path or s3://bucket[/prefix]; empty = <home>/models.",
    )
    clickhouse_dsn: str = Field(
        default="",
        description="chdb:///path (embedded) or http(s)://user:pass@host:port/db; "
        "empty = chdb://<home>/clickhouse.",
    )
    mlflow_tracking_uri: str = Field(
        default="", description="MLflow tracking URI; empty = sqlite:///<home>/mlflow.db."
    )
    mlflow_model_name: str = Field(default="relay-ctr", description="Registered model name.")
    s3_endpoint: str = Field(default="", description="host:port of MinIO/S3 for s3:// stores.")
    s3_access_key: SecretStr = Field(default=SecretStr(""), description="S3 access key.")
    s3_secret_key: SecretStr = Field(default=SecretStr(""), description="S3 secret key.")
    s3_secure: bool = Field(default=False, description="Use TLS to reach S3.")
    s3_region: str = Field(
        default="", description="S3 region; empty = ask the server (MinIO answers us-east-1)."
    )
    s3_ca_file: str = Field(
        default="", description="PEM bundle that signs MinIO's TLS certificate; empty = certifi."
    )
    s3_part_size_mb: int = Field(
        default=16, ge=5, le=5120, description="Multipart part size for blob uploads, MiB."
    )
    s3_retries: int = Field(
        default=5, ge=0, description="Retries per S3 request (and per interrupted download)."
    )
    s3_retry_backoff_s: float = Field(
        default=0.5,
        ge=0,
        description="Backoff factor: waits grow 1x, 2x, 4x ... this many seconds.",
    )
    s3_timeout_s: float = Field(
        default=60.0, gt=0, description="Connect and read timeout per S3 request, seconds."
    )
    prefect_ui_url: str = Field(
        default="http://127.0.0.1:4200", description="Where people open the Prefect UI."
    )

    # serving: the worker process (`python -m serving`) and the fleet client that drives it
    serving_host: str = Field(default="127.0.0.1", description="Interface the worker binds.")
    serving_port: int = Field(default=8700, ge=0, description="HTTP port; 0 = pick a free one.")
    serving_binary_port: int = Field(
        default=8701, ge=0, description="Framed binary TCP port; 0 = pick a free one."
    )
    serving_admin_token: SecretStr = Field(
        default=SecretStr(""),
        description="Bearer token for /admin; empty = admin API disabled (503).",
    )
    serving_stable_ref: str = Field(
        default="", description="Version or alias loaded into `stable` at start; empty = none."
    )
    serving_max_batch_rows: int = Field(
        default=1024, ge=1, description="Most candidate rows in one engine call."
    )
    serving_max_batch_delay_ms: float = Field(
        default=2.0, ge=0.0, description="Longest a request waits for others to join its batch."
    )
    serving_max_body_bytes: int = Field(
        default=1_048_576, ge=1024, description="Largest predict body (JSON or binary payload)."
    )
    serving_max_candidates: int = Field(
        default=1000, ge=1, description="Most candidates in one predict request."
    )
    serving_max_models: int = Field(
        default=3,
        ge=1,
        description="Most engines one worker holds at once; a canary needs 3 (stable, baseline, canary).",
    )
    serving_engine_threads: int = Field(
        default=1, ge=1, description="ONNX Runtime intra-op threads per loaded engine."
    )
    serving_cache_dir: str = Field(
        default="", description="Verified engine files; empty = <home>/serving/cache."
    )
    serving_spool_dir: str = Field(
        default="", description="Inference-log spool segments; empty = <home>/spool."
    )
    serving_spool_max_bytes: int = Field(
        default=1 << 30, ge=1, description="Spool size above which the worker reports not-ready."
    )
    serving_log_flush_ms: int = Field(
        default=500, ge=10, description="How often buffered log rows are written out."
    )
    serving_log_batch_rows: int = Field(
        default=20_000, ge=1, description="Most log rows per insert or spool segment."
    )
    serving_log_fsync: Literal["rotation", "request"] = Field(
        default="rotation",
        description="When a log row reaches the disk, not only the page cache. `rotation`: its "
        "segment is fsynced when the write-ahead file rotates (every RELAY_SERVING_LOG_FLUSH_MS): "
        "every answered request's row survives a SIGKILL, a host's power loss can lose the rows "
        "since the last rotation. `request`: the row's write-ahead record is msynced before the "
        "answer is sent, so nothing answered is lost to a power loss either, at a cost measured "
        "by bench.chaos (`fsync_cost`).",
    )
    serving_log_segmenter: Literal["copy", "process", "thread"] = Field(
        default="copy",
        description="Where a rotated write-ahead file becomes a spool segment. `copy`: the "
        "file's records are copied as they are into a `.records` segment by the kernel "
        "(copy_file_range), with no Arrow work on the serving host's CPU; whoever ingests "
        "decodes them. `process`: a low-priority sibling process per worker (logstore.segmenter) "
        "encodes an LZ4 Arrow segment, smaller on disk; the worker writes it itself "
        "only if the segmenter fails or falls behind. `thread`: the worker's own log-writer "
        "thread encodes it.",
    )
    serving_request_log: bool = Field(
        default=True,
        description="Write one inference_logs row per request (off only to benchmark).",
    )
    serving_impression_sample_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of answered requests whose candidates are logged as impressions "
        "(chosen by a hash of the request id); lower it in production to bound the log volume.",
    )
    serving_log_max_pending_rows: int = Field(
        default=400_000,
        ge=1,
        description="Log rows of one table written ahead but not yet out above which the worker "
        "refuses new predict requests (503 log_backpressure, counted) until its writer catches up.",
    )
    serving_fault_injection: bool = Field(
        default=False,
        description="Serve /admin/latency and /admin/ranking (fault injection for tests, "
        "benchmarks and demos); off, a worker answers 404 on both.",
    )
    serving_max_feedback_events: int = Field(
        default=100, ge=1, description="Most events in one POST /v1/feedback body."
    )
    serving_binary_idle_s: float = Field(
        default=60.0, gt=0.0, description="Binary connections silent this long are closed."
    )
    serving_fleet_urls: str = Field(
        default="", description="Comma-separated base URLs of the workers the fleet client drives."
    )
    serving_canary_lease_s: float = Field(
        default=30.0,
        gt=0.0,
        description="How long a canary weight above 0 holds on a worker unless the release renews "
        "it. The release renews every third of it while a step runs, its windows and the reads "
        "that judge them alike, and once as the step ends (seconds); a release that dies leaves "
        "no worker on the canary for longer than this after its last renewal. 30 s: renewing 32 "
        "workers costs ~14 CPU-s an hour (bench.rollback), against an orphan bound of 30 s "
        "instead of 90 (docs/serving.md).",
    )
    serving_canary_lease_max_s: float = Field(
        default=600.0, gt=0.0, description="Longest canary lease a worker grants (longer: 400)."
    )
    serving_shadow_share: float = Field(
        default=0.2,
        gt=0.0,
        le=1.0,
        description="Share of stable's answered requests mirrored to the canary slot while a "
        "shadow is on, when the /admin/shadow body gives none (chosen by a hash of the request id).",
    )
    serving_shadow_max_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Largest mirrored share a worker accepts in /admin/shadow (larger: 400).",
    )
    serving_shadow_queue: int = Field(
        default=32,
        ge=1,
        description="Mirrored requests in flight on one worker, when the /admin/shadow body gives "
        "no 'max_queue': one more is dropped and counted (relay_shadow_dropped_total), never queued.",
    )
    serving_shadow_max_queue: int = Field(
        default=256, ge=1, description="Largest 'max_queue' a worker accepts in /admin/shadow."
    )
    serving_shadow_top_k: int = Field(
        default=10,
        ge=1,
        le=100,
        description="Items of each answer (stable's and the shadow's) kept in a shadow_pairs row.",
    )

    # tracing: OpenTelemetry spans of the serving worker and the release flow
    otel_tracing: bool = Field(
        default=True,
        description="Give every request a trace id (row, answer) and spans as sampled; off "
        "only to measure what tracing costs (bench.serving).",
    )
    otel_exporter_endpoint: str = Field(
        default="",
        description="OTLP/HTTP traces URL (e.g. http://collector:4318/v1/traces); empty = no "
        "export: trace ids still go into log rows and answers, no span leaves the process.",
    )
    otel_sample_ratio: float = Field(
        default=0.01,
        description="Share of new traces (no sampled traceparent from the caller) that are "
        "recorded and exported, 0-1; a caller's sampled traceparent is always followed.",
    )
    otel_max_queue_spans: int = Field(
        default=4096,
        ge=1,
        description="Spans held for export at most; beyond it they are dropped and counted "
        "(relay_trace_spans_dropped), so an unreachable collector cannot grow memory.",
    )
    otel_export_timeout_s: float = Field(
        default=5.0, gt=0.0, description="Longest one OTLP export (with its retries) may take."
    )

    @field_validator("otel_sample_ratio")
    @classmethod
    def _a_share(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise ValueError(f"RELAY_OTEL_SAMPLE_RATIO must be between 0 and 1, got {value!r}")
        return value

    @field_validator("clickhouse_dsn")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value and not value.startswith(("chdb://", "http://", "https://", "clickhouse://")):
            raise ValueError(
                f"RELAY_CLICKHOUSE_DSN must start with chdb://, http:// or https://, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _lease_within_its_maximum(self) -> Settings:
        if self.serving_canary_lease_s > self.serving_canary_lease_max_s:
            raise ValueError(
                f"RELAY_SERVING_CANARY_LEASE_S ({self.serving_canary_lease_s:g}) is above "
                f"RELAY_SERVING_CANARY_LEASE_MAX_S ({self.serving_canary_lease_max_s:g}): "
                "workers would refuse every lease"
            )
        return self

    @property
    def resolved_model_store_url(self) -> str:
        return self.model_store_url or f"file://{(self.home / 'models').resolve()}"

    @property
    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{(self.home / 'clickhouse').resolve()}"

    @property
    def resolved_mlflow_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    # serving
    @property
    def resolved_serving_cache_dir(self) -> Path:
        return Path(self.serving_cache_dir or self.home / "serving" / "cache").resolve()

    @property
    def resolved_spool_dir(self) -> Path:
        return Path(self.serving_spool_dir or self.home / "spool").resolve()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
