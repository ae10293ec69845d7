"""The model-store testbed: settings for the S3 test server, sample versions, and an outage relay
that makes the server go away mid-request. Fixtures built on it are in store_fixtures.py."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from model_store import ModelStore
from relay.settings import Settings
from relay.types import LineageId, VersionManifest

# Distinctive so a test can search every message and artifact for them.
ACCESS_KEY = "AKIARELAYTESTACCESS1"
SECRET_KEY = "relay-test-secret-0f9e8d7c6b5a"


def fresh_bucket() -> str:
    return f"relay-test-{uuid.uuid4().hex[:16]}"


def s3_settings(endpoint: str, bucket: str, **overrides: Any) -> Settings:
    """Settings for an s3:// store on the test server: small parts, quick retries."""
    values: dict[str, Any] = {
        "model_store_url": f"s3://{bucket}/relay",
        "s3_endpoint": endpoint,
        "s3_access_key": ACCESS_KEY,
        "s3_secret_key": SECRET_KEY,
        "s3_part_size_mb": 5,
        "s3_retries": 3,
        "s3_retry_backoff_s": 0.05,
        "s3_timeout_s": 10,
    }
    values.update(overrides)
    return Settings(**values)


def write_random(path: Path, size: int) -> Path:
    """A file of `size` random (incompressible) bytes, written in 1 MiB pieces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        for offset in range(0, size, 1024 * 1024):
            out.write(os.urandom(min(1024 * 1024, size - offset)))
    return path


def lineage_for(seed: str, **parts: str) -> LineageId:
    """A lineage whose parts are derived from seed, with any part overridden."""
    values = {p: hashlib.sha256(f"{seed}/{p}".encode()).hexdigest() for p in LineageId.model_fields}
    values.update(parts)
    return LineageId(**values)


def publishable(
    store: ModelStore,
    workdir: Path,
    version: str | None = None,
    *,
    seed: str = "v1",
    lineage: LineageId | None = None,
    sources: dict[str, Any] | None = None,
) -> VersionManifest:
    """Upload two small blobs and return a manifest listing them (not yet published)."""
    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / f"{seed}-model.onnx"
    weights = workdir / f"{seed}-weights.pt"
    model.write_bytes(f"onnx bytes of {seed}".encode() * 64)
    weights.write_bytes(os.urandom(2048))
    lineage = lineage or lineage_for(seed)
    return VersionManifest(
        version=version or str(lineage),
        created_at=datetime.now(UTC),
        lineage=lineage,
        lineage_id=str(lineage),
        metrics={"holdout_auc": 0.71},
        blobs={"model.onnx": store.put_blob(model), "weights.pt": store.put_blob(weights)},
        lineage_sources=sources or {},
    )


class Outage:
    """A TCP relay in front of the S3 server that can drop every connection and refuse new ones,
    the way a crashed MinIO looks to its clients, then come back on the same port.

    `trip(direction, after_bytes, back_after_s)` makes it go away by itself once that many bytes
    have crossed in one direction ("up" = client to server), so a test can stop the server in the
    middle of an upload or a download without racing it.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._trip: tuple[str, int, float | None] | None = None
        self.port = 0
        self.bytes = {"up": 0, "down": 0}
        self.outages = 0
        self.come_back()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def come_back(self) -> None:
        """Listen again (on the same port after an outage)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def go_away(self) -> None:
        """Refuse new connections and cut every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
            self.outages += 1
        for sock in [s for s in (listener,) if s is not None] + list(sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
            sock.close()

    def trip(self, direction: str, after_bytes: int, back_after_s: float | None = None) -> None:
        """Go away once `after_bytes` more bytes have crossed in `direction`; maybe come back."""
        with self._lock:
            self._trip = (direction, self.bytes[direction] + after_bytes, back_after_s)

    def close(self) -> None:
        self.go_away()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                if self._listener is not listener:  # went away while we connected
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, "down"), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(256 * 1024):
                dst.sendall(data)
                if self._count(direction, len(data)):
                    return
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _count(self, direction: str, n: int) -> bool:
        with self._lock:
            self.bytes[direction] += n
            trip = self._trip
            fire = trip is not None and trip[0] == direction and self.bytes[direction] >= trip[1]
            if fire:
                self._trip = None
        if not fire:
            return False
        assert trip is not None
        self.go_away()
        if trip[2] is not None:
            threading.Timer(trip[2], self.come_back).start()
        return True
