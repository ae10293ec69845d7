"""The serving benchmark's baselines and model: the worker's HTTP stack answering a constant
(echo), the seed's naive FastAPI + PyTorch server (each prints the worker's listening line),
ONNX Runtime alone (the compute ceiling), and the version they all serve.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import CANDIDATES

# -- the baselines' servers ----------------------------------------------------------------------


def _serve_app(app: Any, port: int, name: str) -> None:
    """Serve `app` on the worker's uvicorn settings and print the worker's listening line."""
    import uvicorn
    import uvloop

    from serving.http import server_config

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)

    async def main() -> None:
        server = uvicorn.Server(server_config(app))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print(
            f"serving: listening on http://127.0.0.1:{sock.getsockname()[1]} "
            f"binary tcp://127.0.0.1:0 worker {name}",
            flush=True,
        )
        await task

    uvloop.run(main())


def echo_server(port: int) -> None:
    """The worker's HTTP stack and request parsing, answering a constant."""
    import orjson
    from starlette.applications import Starlette

    from serving.http import Receive, Scope, Send, read_body, send_json, with_predict
    from serving.schema import RequestRejected, decode_json

    constant = orjson.dumps(
        {
            "request_id": "echo",
            "scores": [0.05] * CANDIDATES,
            "model_version": "echo",
            "lineage_id": "echo",
            "slot": "stable",
        }
    )

    async def predict(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            decode_json(await read_body(scope, receive, 1 << 20), 1000)
        except RequestRejected as exc:
            await send_json(send, exc.status, orjson.dumps({"error": exc.code}))
            return
        await send_json(send, 200, constant)

    _serve_app(with_predict(predict, Starlette()), port, "echo")


def naive_server(port: int, weights: Path, params: dict[str, Any]) -> None:
    """The seed's way: a validated body, a DataFrame, the PyTorch model once per request."""
    import pandas as pd
    import torch
    from fastapi import FastAPI
    from pydantic import create_model

    from relay.features import N_CATEGORICAL, N_FEATURES, to_model_input
    from serving.schema import CONTEXT_FIELDS, ITEM_FIELDS, SESSION_FIELDS, USER_FIELDS
    from tasks.training import CtrModel

    torch.set_num_threads(1)
    n_dense = N_FEATURES - N_CATEGORICAL
    model = CtrModel(
        np.zeros(n_dense), np.ones(n_dense), params["embedding_dim"], tuple(params["hidden"])
    )
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()

    def fields(names: Sequence[str]) -> dict[str, Any]:
        return {n: (float, ...) for n in names}

    user_model: Any = create_model("User", **fields(USER_FIELDS))
    session_model: Any = create_model("Session", session_id=(str, ...), **fields(SESSION_FIELDS))
    context_model: Any = create_model("Context", **fields(CONTEXT_FIELDS))
    item_model: Any = create_model("Item", **fields(ITEM_FIELDS))

    body_model: Any = create_model(
        "Body",
        user=(user_model, ...),
        session=(session_model, ...),
        context=(context_model, ...),
        candidates=(list[item_model], ...),
    )

    def predict(body: Any) -> dict[str, Any]:
        shared = {
            **body.user.model_dump(),
            **body.context.model_dump(),
            **body.session.model_dump(),
        }
        frame = pd.DataFrame([{**shared, **c.model_dump()} for c in body.candidates])
        with torch.no_grad():
            scores = model(torch.from_numpy(to_model_input(frame))).numpy()
        return {"scores": scores.tolist(), "model_version": "naive", "slot": "stable"}

    # The body model is built at run time, so FastAPI is handed the class, not a name to resolve.
    predict.__annotations__ = {"body": body_model, "return": dict}
    app = FastAPI()
    app.post("/v1/predict")(predict)

    _serve_app(app, port, "naive")


def resolve_version(ref: str | None, home: Path, train_events: int) -> tuple[Any, Any]:
    """(store, manifest): `ref` from the configured store, else a small model built for the bench."""
    from model_store import open_store
    from relay.errors import VersionNotFound
    from relay.settings import get_settings

    store = open_store(get_settings())
    versions = store.list_versions()
    try:
        if ref:
            return store, store.resolve(ref)
        if versions:
            return store, store.get_manifest(versions[-1])
    except VersionNotFound:
        if ref:
            raise
    print("no model version in the store: training a small one for the benchmark", flush=True)
    return build_small_version(home, train_events)


def build_small_version(root: Path, events: int) -> tuple[Any, Any]:
    """(store, manifest): a CTR model on `events` simulated events (30k: about 30 s), published."""
    from datetime import UTC, datetime

    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from simulation.shop import ShopConfig, generate_events
    from tasks.training import TrainConfig

    frame = generate_events(ShopConfig(seed=5), events, datetime(2026, 11, 1, tzinfo=UTC))
    store = ModelStore(LocalBackend(root / "store"))
    manifest, _ = train_and_publish(
        store, frame, TrainConfig(seed=5, epochs=1), root / "bench-model", "bench"
    )
    return store, manifest


def worker_batch_rows(metrics_text: str) -> tuple[float, float]:
    """(mean rows, mean requests) per engine call from a worker's /metrics text."""

    def total(name: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics_text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    calls = total("relay_batch_rows_count")
    if not calls:
        return 0.0, 0.0
    return total("relay_batch_rows_sum") / calls, total("relay_batch_requests_sum") / calls


def raw_figures(engine_path: Path, rows: int, seconds: float) -> dict[str, float]:
    """session.run alone on `rows`-row batches: requests of 20 rows per second, and per call."""
    from serving.engine import OrtEngine, synthetic_rows
    from serving.schema import model_input

    engine = OrtEngine("ort-fp32", engine_path, 1, ["CPUExecutionProvider"])
    x = model_input(synthetic_rows(rows))
    for _ in range(50):
        engine.run(x)
    calls = []
    t_end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < t_end:
        engine.run(x)
        calls.append(time.perf_counter() - now)
    lat = np.array(calls) * 1000
    started = time.perf_counter()
    for _ in range(200):
        model_input(synthetic_rows(rows))
    pipeline_ms = (time.perf_counter() - started) / 200 * 1000
    return {
        "raw_rps": round(len(calls) * rows / CANDIDATES / sum(calls), 1),
        "raw_p50_ms": round(float(np.percentile(lat, 50)), 4),
        "raw_p95_ms": round(float(np.percentile(lat, 95)), 4),
        "raw_p99_ms": round(float(np.percentile(lat, 99)), 4),
        "raw_batch_rows": rows,
        "raw_feature_pipeline_ms_per_batch": round(pipeline_ms, 4),
    }
