"""MinIO/S3 backend through the `minio` client.

Guarantees, the same as the local directory's:
- the bucket is created if missing and must stay private: a policy that lets anyone read is
  refused before the first write;
- blobs stream up as multipart uploads (bounded parts, never the whole file in memory) and
  stream down, resuming with a Range request when a connection breaks mid-body;
- create-if-absent writes (manifests, alias moves) use `If-None-Match: *`, which S3 and MinIO
  apply atomically, so two racing writers never both win;
- every request is retried with exponential backoff; when retries run out the error says what
  failed and where, never with credentials.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import certifi
import urllib3
from minio import Minio
from minio.error import MinioException, S3Error
from urllib3.exceptions import HTTPError, MaxRetryError

from model_store.backend import Backend, ObjectInfo
from relay.errors import ConfigError, StoreError
from relay.settings import Settings

MIB = 1024 * 1024
# What "anonymous read" means for a policy check: fetching objects or listing their names.
READ_ACTIONS = ("s3:GetObject", "s3:ListBucket")
_ABSENT = {"NoSuchKey", "NoSuchBucket", "NoSuchObject", "ResourceNotFound"}
_NETWORK_ERRORS = (HTTPError, OSError)
_MAX_BACKOFF_S = 30.0


def anonymous_read_grants(policy: str) -> list[str]:
    """The statements of a bucket policy that let anyone read or list objects; empty = private."""
    try:
        document = json.loads(policy)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bucket policy is not JSON: {exc}") from exc
    statements = document.get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    grants = []
    for index, statement in enumerate(statements):
        if statement.get("Effect") != "Allow" or not _applies_to_anyone(statement):
            continue
        if "NotAction" in statement:  # allows everything except what it lists
            excluded = _as_list(statement["NotAction"])
            granted = [a for a in READ_ACTIONS if not _matches_any(a, excluded)]
        else:
            granted = [
                a for a in READ_ACTIONS if _matches_any(a, _as_list(statement.get("Action")))
            ]
        if granted:
            name = statement.get("Sid") or f"#{index}"
            grants.append(f"statement {name} allows {', '.join(granted)} to anyone")
    return grants


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _applies_to_anyone(statement: dict[str, Any]) -> bool:
    if "NotPrincipal" in statement:  # Allow + NotPrincipal = everyone except a few named
        return True
    principal = statement.get("Principal")
    if principal == "*":
        return True
    return isinstance(principal, dict) and "*" in _as_list(principal.get("AWS"))


def _matches_any(action: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(action.lower(), pattern.lower()) for pattern in patterns)


def _reason(exc: BaseException) -> str:
    """A short cause for messages: the S3 error code, or the network failure underneath."""
    if isinstance(exc, S3Error):
        return f"{exc.code}: {exc.message}"
    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        return f"{type(exc.reason).__name__}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def connect_s3(settings: Settings) -> Minio:
    """A minio client for the settings' endpoint: timeouts, and request retries with backoff."""
    if not settings.s3_endpoint:
        raise ConfigError("an s3:// model store needs RELAY_S3_ENDPOINT (host:port of MinIO/S3)")
    access = settings.s3_access_key.get_secret_value()
    secret = settings.s3_secret_key.get_secret_value()
    if bool(access) != bool(secret):
        raise ConfigError("set both RELAY_S3_ACCESS_KEY and RELAY_S3_SECRET_KEY, or neither")
    retries = urllib3.Retry(
        total=settings.s3_retries,
        backoff_factor=settings.s3_retry_backoff_s,
        backoff_max=_MAX_BACKOFF_S,
        status_forcelist=(500, 502, 503, 504),
        allowed_methods=None,  # part uploads and completes are safe to resend: bodies are bytes
        raise_on_status=False,  # let minio turn the last 5xx into an S3 error with its code
    )
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=settings.s3_timeout_s, read=settings.s3_timeout_s),
        maxsize=10,
        retries=retries,
        cert_reqs="CERT_REQUIRED",
        ca_certs=settings.s3_ca_file or certifi.where(),
    )
    return Minio(
        settings.s3_endpoint,
        access_key=access or None,
        secret_key=secret or None,
        secure=settings.s3_secure,
        region=settings.s3_region or None,
        http_client=http,
    )


class S3Backend(Backend):
    """Objects in one bucket under an optional key prefix."""

    def __init__(
        self,
        client: Minio,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str,
        part_size: int = 16 * MIB,
        retries: int = 5,
        backoff_s: float = 0.5,
    ) -> None:
        self._client = client
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self._endpoint = endpoint
        self._part_size = part_size
        self._retries = retries
        self._backoff_s = backoff_s
        self._bucket_ready = False
        self._checked_private = False
        self._checked_conditional = False

    @classmethod
    def from_settings(cls, settings: Settings, bucket: str, prefix: str = "") -> S3Backend:
        """The backend for s3://bucket/prefix with the settings' endpoint and credentials."""
        scheme = "https" if settings.s3_secure else "http"
        return cls(
            connect_s3(settings),
            bucket,
            prefix,
            endpoint=f"{scheme}://{settings.s3_endpoint}",
            part_size=settings.s3_part_size_mb * MIB,
            retries=settings.s3_retries,
            backoff_s=settings.s3_retry_backoff_s,
        )

    # -- addressing and errors -----------------------------------------------------------------
    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} on {self._endpoint}"

    def locate(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key} on {self._endpoint}"

    def _name(self, key: str) -> str:
        return self.prefix + key

    def _failure(self, action: str, exc: BaseException) -> StoreError:
        if isinstance(exc, S3Error):
            return StoreError(f"S3 refused {action}: {_reason(exc)}")
        return StoreError(
            f"S3 {action} failed after {self._retries} retries with backoff: {_reason(exc)}"
        )

    def _wait(self, failures: int) -> None:
        time.sleep(min(_MAX_BACKOFF_S, self._backoff_s * 2 ** (failures - 1)))

    # -- the bucket: exists, private, honours conditional writes ------------------------------
    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        try:
            if not self._client.bucket_exists(self.bucket):
                try:
                    self._client.make_bucket(self.bucket)
                except S3Error as exc:
                    if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise  # a racing creator is fine; anything else is not
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"creating bucket {self.bucket!r}", exc) from exc
        self._bucket_ready = True

    def _ensure_private(self) -> None:
        """Refuse to write into a bucket anyone can read: model artifacts are not public."""
        if self._checked_private:
            return
        self._ensure_bucket()
        try:
            policy = self._client.get_bucket_policy(self.bucket)
        except S3Error as exc:
            if exc.code != "NoSuchBucketPolicy":
                raise StoreError(
                    f"cannot verify that bucket {self.bucket!r} is private ({_reason(exc)}); "
                    "the store's credentials need s3:GetBucketPolicy"
                ) from exc
            policy = ""
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"reading the policy of bucket {self.bucket!r}", exc) from exc
        try:
            grants = anonymous_read_grants(policy) if policy else []
        except ValueError as exc:
            raise StoreError(
                f"cannot verify that bucket {self.bucket!r} is private: {exc}"
            ) from exc
        if grants:
            raise StoreError(
                f"refusing to write to bucket {self.bucket!r} at {self._endpoint}: its policy "
                f"allows anonymous reads ({'; '.join(grants)}). Model artifacts must stay "
                "private: remove those statements (e.g. `mc anonymous set none`) or use another "
                "bucket."
            )
        self._checked_private = True

    def _ensure_conditional_writes(self) -> None:
        """Check once that the server refuses a second create of the same key.

        A server that ignored If-None-Match would let two racing publishers both win, silently.
        """
        if self._checked_conditional:
            return
        probe = f"probes/{uuid.uuid4().hex}"
        first = self._conditional_put(probe, b"probe")
        second = self._conditional_put(probe, b"another writer")
        self.delete(probe)
        if not (first and not second):
            raise StoreError(
                f"{self._endpoint} does not honour If-None-Match on PutObject, so it cannot keep "
                "versions write-once; use a MinIO/S3 release with conditional writes"
            )
        self._checked_conditional = True

    def _conditional_put(self, key: str, data: bytes) -> bool:
        """PutObject with If-None-Match: *; False when the key already holds other bytes."""
        name = self._name(key)
        for failures in range(1, self._retries + 2):
            try:
                # The public put_object files unknown headers under x-amz-meta-, so the
                # condition goes through the client's own PutObject call (minio pinned).
                self._client._put_object(
                    self.bucket,
                    name,
                    data,
                    headers={"If-None-Match": "*", "Content-Type": "application/octet-stream"},
                )
                return True
            except S3Error as exc:
                if exc.code == "PreconditionFailed":
                    try:
                        return self.get_bytes(key) == data  # our own earlier, retried write?
                    except KeyError:
                        continue  # gone again (a probe deleted): try once more
                if exc.code != "ConditionalRequestConflict" or failures > self._retries:
                    raise self._failure(
                        f"create-if-absent write of {self.locate(key)}", exc
                    ) from exc
                self._wait(failures)  # another conditional write to this key is in flight
            except (MinioException, *_NETWORK_ERRORS) as exc:
                raise self._failure(f"create-if-absent write of {self.locate(key)}", exc) from exc
        raise StoreError(f"create-if-absent write of {self.locate(key)} kept conflicting")

    # -- writes --------------------------------------------------------------------------------
    def put_file(self, key: str, path: Path) -> None:
        self._ensure_private()
        try:
            self._client.fput_object(
                self.bucket,
                self._name(key),
                str(path),
                content_type="application/octet-stream",
                part_size=self._part_size,
            )
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"upload of {path.name} to {self.locate(key)}", exc) from exc

    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> bool:
        self._ensure_private()
        if exclusive:
            self._ensure_conditional_writes()
            return self._conditional_put(key, data)
        try:
            self._client.put_object(
                self.bucket,
                self._name(key),
                io.BytesIO(data),
                len(data),
                content_type="application/octet-stream",
            )
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"write of {self.locate(key)}", exc) from exc
        return True

    def delete(self, key: str) -> None:
        try:
            self._client.remove_object(self.bucket, self._name(key))
        except S3Error as exc:
            if exc.code not in _ABSENT:
                raise self._failure(f"delete of {self.locate(key)}", exc) from exc
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"delete of {self.locate(key)}", exc) from exc

    # -- reads ---------------------------------------------------------------------------------
    def iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        offset = 0
        failures = 0
        while True:
            try:
                response = self._client.get_object(self.bucket, self._name(key), offset=offset)
            except S3Error as exc:
                if exc.code in _ABSENT:
                    raise KeyError(key) from exc
                raise self._failure(f"download of {self.locate(key)}", exc) from exc
            except (MinioException, *_NETWORK_ERRORS) as exc:
                raise self._failure(f"download of {self.locate(key)}", exc) from exc
            try:
                for chunk in response.stream(chunk_size):
                    offset += len(chunk)
                    failures = 0
                    yield chunk
                return
            except _NETWORK_ERRORS as exc:
                # The connection broke mid-body: urllib3 does not retry that, so resume here
                # from the last byte received (blobs are immutable, the rest is unchanged).
                failures += 1
                if failures > self._retries:
                    raise self._failure(
                        f"download of {self.locate(key)} (interrupted at byte {offset})", exc
                    ) from exc
                self._wait(failures)
            finally:
                response.close()
                response.release_conn()

    def get_bytes(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key, MIB))

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            found = self._client.stat_object(self.bucket, self._name(key))
        except S3Error as exc:
            if exc.code in _ABSENT:
                return None
            raise self._failure(f"stat of {self.locate(key)}", exc) from exc
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"stat of {self.locate(key)}", exc) from exc
        if found.size is None or found.last_modified is None:
            raise StoreError(f"S3 gave no size or date for {self.locate(key)}")
        return ObjectInfo(key=key, size=found.size, modified=found.last_modified)

    def list_objects(self, prefix: str) -> list[ObjectInfo]:
        found = []
        try:
            for item in self._client.list_objects(
                self.bucket, prefix=self._name(prefix), recursive=True
            ):
                if item.is_dir or item.object_name is None:
                    continue
                found.append(
                    ObjectInfo(
                        key=item.object_name[len(self.prefix) :],
                        size=item.size or 0,
                        modified=item.last_modified or datetime.fromtimestamp(0, UTC),
                    )
                )
        except S3Error as exc:
            if exc.code == "NoSuchBucket":
                return []  # a store nobody has written to yet is empty, not broken
            raise self._failure(f"listing {self.describe()}{prefix}", exc) from exc
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"listing {self.describe()}{prefix}", exc) from exc
        return sorted(found, key=lambda info: info.key)

    # -- housekeeping --------------------------------------------------------------------------
    def clean_incomplete_uploads(self, older_than: datetime, *, dry_run: bool = False) -> list[str]:
        # Multipart uploads that never completed (a writer died, or gave up after its retries)
        # hold their parts' storage until aborted. minio exposes listing and aborting them only
        # as client methods with a leading underscore; the package is pinned.
        removed = []
        marker: str | None = None
        try:
            while True:
                page = self._client._list_multipart_uploads(
                    self.bucket, prefix=self.prefix, key_marker=marker
                )
                for upload in page.uploads:
                    if (
                        upload.upload_id is None
                        or upload.initiated_time is None
                        or upload.initiated_time >= older_than
                    ):
                        continue
                    key = upload.object_name[len(self.prefix) :]
                    removed.append(f"{key} (multipart upload {upload.upload_id})")
                    if not dry_run:
                        self._client._abort_multipart_upload(
                            self.bucket, upload.object_name, upload.upload_id
                        )
                if not page.is_truncated or not page.next_key_marker:
                    return removed
                marker = page.next_key_marker
        except S3Error as exc:
            if exc.code == "NoSuchBucket":
                return removed
            raise self._failure(f"cleaning incomplete uploads in {self.describe()}", exc) from exc
        except (MinioException, *_NETWORK_ERRORS) as exc:
            raise self._failure(f"cleaning incomplete uploads in {self.describe()}", exc) from exc
