"""Connections and locations: the one place Relay reads the environment.

Run knobs (SLO targets, canary steps, thresholds) are flow parameters, not settings.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
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
        default=0.5, ge=0, description="Backoff factor: waits grow 1x, 2x, 4x ... this many seconds."
    )
    s3_timeout_s: float = Field(
        default=60.0, gt=0, description="Connect and read timeout per S3 request, seconds."
    )
    prefect_ui_url: str = Field(
        default="http://127.0.0.1:4200", description="Where people open the Prefect UI."
    )

    @field_validator("clickhouse_dsn")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if value and not value.startswith(("chdb://", "http://", "https://", "clickhouse://")):
            raise ValueError(
                f"RELAY_CLICKHOUSE_DSN must start with chdb://, http:// or https://, got {value!r}"
            )
        return value

    @property
    def resolved_model_store_url(self) -> str:
        return self.model_store_url or f"file://{(self.home / 'models').resolve()}"

    @property
    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{(self.home / 'clickhouse').resolve()}"

    @property
    def resolved_mlflow_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{(self.home / 'mlflow.db').resolve()}"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
