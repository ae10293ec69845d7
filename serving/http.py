"""The worker's HTTP face (Starlette on uvicorn): predict, admin, health and metrics.

Handlers take the raw Starlette Request and answer with orjson-encoded bytes: no validation
framework sits on the hot path, because the checks that matter (serving.schema) run on numpy
arrays, not per field in Python objects.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.routing import check_slot
from serving.schema import RequestRejected, decode_json
from serving.worker import ADMIN, Exchange, Worker

JSON = "application/json"
AdminOp = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type=JSON,
        headers=headers,
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 once it exceeds `limit` bytes."""
    length = request.headers.get("content-length")
    if length is not None:
        if int(length) > limit:
            raise RequestRejected(
                "body_too_large", f"body is {length} bytes; the limit is {limit}", 413
            )
        return await request.body()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestRejected("body_too_large", f"body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def server_config(app: Starlette) -> uvicorn.Config:
    """uvicorn on httptools (C HTTP parser) with access logs off: the worker's HTTP stack."""
    return uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=10,
    )


def build_app(worker: Worker) -> Starlette:
    """The Starlette application over one Worker."""
    settings = worker.settings
    max_body = settings.serving_max_body_bytes
    max_candidates = settings.serving_max_candidates

    def error(ex: Exchange) -> Response:
        worker.record(ex)
        return json_response(ex.error_body(), ex.status)

    async def predict(request: Request) -> Response:
        ex = worker.exchange("http")
        try:
            body = await read_body(request, max_body)
            ex.input_bytes = len(body)
            decoded = decode_json(body, max_candidates)
        except RequestRejected as rejection:
            ex.request_id = worker.next_request_id()
            ex.reject(rejection)
            return error(ex)
        answered: asyncio.Future[Exchange] = asyncio.get_running_loop().create_future()

        def done(e: Exchange) -> None:
            if not answered.done():
                answered.set_result(e)

        worker.submit(ex, decoded, done)
        try:
            await answered
        except asyncio.CancelledError:
            ex.reject(RequestRejected("cancelled", "the request was cancelled", 499))
            worker.record(ex)
            raise
        if ex.status != 200:
            return error(ex)
        response = Response(
            orjson.dumps(
                {
                    "request_id": ex.request_id,
                    "scores": ex.scores,
                    "model_version": ex.version,
                    "lineage_id": ex.lineage_id,
                    "slot": ex.slot,
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            ),
            media_type=JSON,
        )
        worker.record(ex)
        return response

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok", "worker_id": worker.worker_id})

    async def readyz(request: Request) -> Response:
        ready, reason = worker.ready()
        return json_response({"ready": ready, "reason": reason}, 200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def admin(name: str, op: AdminOp) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            ex = worker.exchange(ADMIN)
            ex.request_id, ex.slot = worker.next_request_id(), ADMIN
            try:
                _authorise(request, settings.serving_admin_token.get_secret_value())
                body: dict[str, Any] = {}
                if request.method == "POST":
                    raw = await read_body(request, max_body)
                    ex.input_bytes = len(raw)
                    body = _json_object(raw) if raw.strip() else {}
                ex.version = str(body.get("version", ""))[:200]
                result = await op(body)
            except RequestRejected as rejection:
                ex.reject(rejection)
                headers = {"WWW-Authenticate": "Bearer"} if rejection.status == 401 else None
                worker.record(ex)
                return json_response(ex.error_body(), ex.status, headers)
            worker.record(ex)
            return json_response(result)

        handler.__name__ = f"admin_{name}"
        return handler

    async def state(body: dict[str, Any]) -> dict[str, Any]:
        return worker.state()

    async def load(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.load(check_slot(body.get("slot")), body.get("version", ""))

    async def weight(body: dict[str, Any]) -> dict[str, Any]:
        if "weight" not in body:
            raise RequestRejected("missing_field", "body needs 'weight' (integer 0-100)")
        return await worker.set_weight(body["weight"])

    async def promote(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.promote()

    async def rollback(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.rollback()

    async def latency(body: dict[str, Any]) -> dict[str, Any]:
        if "ms" not in body:
            raise RequestRejected("missing_field", "body needs 'slot' and 'ms'")
        return await worker.set_latency(check_slot(body.get("slot")), body["ms"])

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return json_response({"error": f"http_{status}", "detail": detail}, status)

    routes = [
        Route("/v1/predict", predict, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/state", admin("state", state), methods=["GET"]),
        Route("/admin/load", admin("load", load), methods=["POST"]),
        Route("/admin/weight", admin("weight", weight), methods=["POST"]),
        Route("/admin/promote", admin("promote", promote), methods=["POST"]),
        Route("/admin/rollback", admin("rollback", rollback), methods=["POST"]),
        Route("/admin/latency", admin("latency", latency), methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


def _authorise(request: Request, token: str) -> None:
    if not token:
        raise RequestRejected(
            "admin_disabled", "the admin API is off: set RELAY_SERVING_ADMIN_TOKEN", 503
        )
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken does not reveal how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise RequestRejected(
            "unauthorized", "a valid 'Authorization: Bearer <token>' is required", 401
        )


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestRejected("bad_json", f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestRejected("not_an_object", "body must be a JSON object")
    return body
