"""What only the S3 backend has to get right: a private bucket, credentials kept out of every
message, and the server going away in the middle of an upload or a download."""

from __future__ import annotations

import hashlib
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from minio import Minio
from minio.error import S3Error

from model_store import ModelStore, open_store
from model_store.store import blob_key
from relay.errors import RelayError, StoreError
from relay.types import BlobRef
from tests.integration.store_testbed import (
    ACCESS_KEY,
    SECRET_KEY,
    Outage,
    fresh_bucket,
    publishable,
    s3_settings,
    write_random,
)

pytest_plugins = ("tests.integration.store_fixtures",)

MIB = 1024 * 1024


def raw_client(endpoint: str) -> Minio:
    return Minio(endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False)


def public_read_policy(bucket: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "PublicRead",
                    "Effect": "Allow",
                    "Principal": {"AWS": ["*"]},
                    "Action": ["s3:GetObject"],
                    "Resource": [f"arn:aws:s3:::{bucket}/*"],
                }
            ],
        }
    )


def test_missing_bucket_is_created_on_first_write_and_left_private(
    moto_endpoint: str, tmp_path: Path
):
    bucket = fresh_bucket()
    client = raw_client(moto_endpoint)
    store = open_store(s3_settings(moto_endpoint, bucket))
    assert store.list_versions() == []  # reading does not create it
    assert not client.bucket_exists(bucket)
    store.publish(publishable(store, tmp_path, "v1"))
    assert client.bucket_exists(bucket)
    with pytest.raises(S3Error) as caught:
        client.get_bucket_policy(bucket)
    assert caught.value.code == "NoSuchBucketPolicy"


def test_bucket_anyone_can_read_is_refused_before_anything_is_written(
    moto_endpoint: str, tmp_path: Path
):
    bucket = fresh_bucket()
    client = raw_client(moto_endpoint)
    client.make_bucket(bucket)
    client.set_bucket_policy(bucket, public_read_policy(bucket))
    store = open_store(s3_settings(moto_endpoint, bucket))
    model = write_random(tmp_path / "model.onnx", 1000)
    with pytest.raises(StoreError) as caught:
        store.put_blob(model)
    message = str(caught.value)
    assert f"refusing to write to bucket {bucket!r}" in message
    assert "anonymous reads" in message and "PublicRead" in message and "s3:GetObject" in message
    assert list(client.list_objects(bucket, recursive=True)) == []


def test_credentials_never_appear_in_messages_descriptions_or_manifests(
    moto_endpoint: str, tmp_path: Path
):
    settings = s3_settings(moto_endpoint, fresh_bucket())
    store = open_store(settings)
    manifest = store.publish(publishable(store, tmp_path, "v1"))
    ref = manifest.blobs["model.onnx"]
    store.backend.put_bytes(blob_key(ref.sha256), b"tampered")
    texts = [store.backend.describe(), manifest.model_dump_json(), repr(settings), str(settings)]
    failures = [
        lambda: store.get_manifest("ghost"),
        lambda: store.fetch_blob(ref, tmp_path / "x"),
        lambda: store.fetch_blob(BlobRef(sha256="ef" * 32, size=1), tmp_path / "y"),
    ]
    with socket.socket() as unused:  # a port nothing listens on: the server is gone
        unused.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{unused.getsockname()[1]}"
    gone = open_store(s3_settings(dead, fresh_bucket(), s3_retries=1, s3_retry_backoff_s=0.01))
    failures += [lambda: gone.list_versions(), lambda: gone.put_blob(tmp_path / "v1-model.onnx")]
    for fail in failures:
        with pytest.raises(RelayError) as caught:
            fail()
        texts.append(str(caught.value))
    assert any("failed after 1 retries" in text for text in texts)
    for text in texts:
        assert ACCESS_KEY not in text and SECRET_KEY not in text, text


def test_server_going_away_mid_upload_is_retried_and_the_blob_lands_whole(
    moto_endpoint: str, outage: Outage, tmp_path: Path
):
    bucket = fresh_bucket()
    store = open_store(s3_settings(outage.endpoint, bucket, s3_retries=6, s3_retry_backoff_s=0.1))
    store.backend.put_bytes("warm", b"bucket created, policy checked")
    path = write_random(tmp_path / "model.onnx", 20 * MIB)
    outage.trip("up", 7 * MIB, back_after_s=0.5)  # dies during the second part, back in 0.5 s
    ref = store.put_blob(path)
    assert outage.outages == 1
    direct = open_store(s3_settings(moto_endpoint, bucket))
    back = direct.fetch_blob(ref, tmp_path / "back.onnx")  # hash-checked on the way down
    assert back.read_bytes() == path.read_bytes()


def test_server_gone_for_good_fails_clearly_leaves_no_version_and_gc_cleans_up(
    moto_endpoint: str, outage: Outage, tmp_path: Path
):
    bucket = fresh_bucket()
    store = open_store(s3_settings(outage.endpoint, bucket, s3_retries=2))
    first = store.put_blob(write_random(tmp_path / "weights.pt", 100_000))
    big = write_random(tmp_path / "model.onnx", 16 * MIB)
    outage.trip("up", 3 * MIB)  # and it stays down

    def register() -> None:  # what build_manifest + publish do: blobs first, manifest last
        blobs = {"weights.pt": first, "model.onnx": store.put_blob(big)}
        store.publish(publishable(store, tmp_path, "v1").model_copy(update={"blobs": blobs}))

    with pytest.raises(StoreError) as caught:
        register()
    message = str(caught.value)
    assert "upload of model.onnx" in message and "failed after 2 retries" in message
    assert SECRET_KEY not in message

    outage.come_back()
    direct = open_store(s3_settings(moto_endpoint, bucket))
    assert direct.list_versions() == []
    report = direct.gc(now=datetime.now(UTC) + timedelta(hours=2))
    assert report.deleted == [first.sha256]  # the orphan of the failed registration
    big_key = blob_key(hashlib.sha256(big.read_bytes()).hexdigest())
    assert [u.split(" ")[0] for u in report.incomplete_uploads] == [big_key]
    assert direct.backend.list_keys("blobs/") == []
    assert direct.gc(now=datetime.now(UTC) + timedelta(hours=2)).incomplete_uploads == []


def test_download_resumes_where_the_connection_broke(
    moto_endpoint: str, outage: Outage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    bucket = fresh_bucket()
    path = write_random(tmp_path / "model.onnx", 12 * MIB)
    ref = open_store(s3_settings(moto_endpoint, bucket)).put_blob(path)
    store = open_store(s3_settings(outage.endpoint, bucket, s3_retries=6, s3_retry_backoff_s=0.1))
    offsets: list[int] = []
    client = store.backend._client
    real_get = client.get_object

    def recording_get(bucket_name: str, object_name: str, offset: int = 0, **kwargs):
        offsets.append(offset)
        return real_get(bucket_name, object_name, offset=offset, **kwargs)

    monkeypatch.setattr(client, "get_object", recording_get)
    outage.trip("down", 5 * MIB, back_after_s=0.3)
    back = store.fetch_blob(ref, tmp_path / "back.onnx")
    assert hashlib.sha256(back.read_bytes()).hexdigest() == ref.sha256
    assert outage.outages == 1
    assert offsets[0] == 0 and len(offsets) >= 2 and offsets[-1] > 0  # resumed, not restarted


def test_download_that_never_recovers_fails_clearly_and_leaves_no_file(
    moto_endpoint: str, outage: Outage, tmp_path: Path
):
    bucket = fresh_bucket()
    ref = open_store(s3_settings(moto_endpoint, bucket)).put_blob(
        write_random(tmp_path / "model.onnx", 8 * MIB)
    )
    store = open_store(s3_settings(outage.endpoint, bucket, s3_retries=2))
    outage.trip("down", 3 * MIB)
    with pytest.raises(StoreError, match="download of s3://") as caught:
        store.fetch_blob(ref, tmp_path / "out" / "model.onnx")
    assert "failed after 2 retries" in str(caught.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_server_that_ignores_conditional_writes_is_refused(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store: ModelStore = open_store(s3_settings(moto_endpoint, fresh_bucket()))
    client = store.backend._client
    real_put = client._put_object

    def unconditional_put(bucket_name, object_name, data, headers=None, query_params=None):
        headers = {k: v for k, v in (headers or {}).items() if k != "If-None-Match"}
        return real_put(bucket_name, object_name, data, headers, query_params)

    monkeypatch.setattr(client, "_put_object", unconditional_put)
    manifest = publishable(store, tmp_path, "v1")
    with pytest.raises(StoreError, match="does not honour If-None-Match"):
        store.publish(manifest)
    assert store.list_versions() == []
