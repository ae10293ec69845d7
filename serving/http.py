"""The worker's HTTP face: predict on a bare ASGI path, admin/health/metrics on Starlette.

`POST /v1/predict` is served by a plain ASGI callable in front of the Starlette app: at a few
thousand requests a second per core, Starlette's request object, router and middleware stack
cost more than the model does, and the predict path needs none of them. The checks that matter
(serving.schema) run on numpy arrays; no validation framework sits on the hot path.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.feedback import decode_feedback
from serving.routing import check_removal_reason, check_slot
from serving.schema import RequestRejected, decode_json, json_object
from serving.worker import ADMIN, Exchange, Worker

JSON = "application/json"
PREDICT_PATH = "/v1/predict"
FEEDBACK_PATH = "/v1/feedback"
AdminOp = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_JSON_HEADER = (b"content-type", b"application/json")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type=JSON,
        headers=headers,
    )


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length" and int(value) > limit:
            raise RequestRejected(
                "body_too_large", f"body is {int(value)} bytes; the limit is {limit}", 413
            )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestRejected("client_closed", "the client went away mid-body", 499)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestRejected("body_too_large", f"body exceeds the limit of {limit} bytes", 413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def header(scope: Scope, name: bytes) -> str | None:
    """The request header `name` (lower-case bytes), None if absent."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def send_json(send: Send, status: int, body: bytes, traceparent: str = "") -> None:
    """A complete JSON response; with the request's `traceparent` echoed when it has one."""
    headers = [_JSON_HEADER, (b"content-length", str(len(body)).encode())]
    if traceparent:
        headers.append((b"traceparent", traceparent.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def with_predict(predict: ASGIApp, other: ASGIApp) -> ASGIApp:
    """`POST /v1/predict` to `predict`, everything else to `other`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == PREDICT_PATH and scope["method"] == "POST":
            await predict(scope, receive, send)
        else:
            await other(scope, receive, send)

    return app


def server_config(app: ASGIApp) -> uvicorn.Config:
    """uvicorn on httptools (C HTTP parser) and uvloop, access log and proxy headers off."""
    return uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        access_log=False,
        proxy_headers=False,  # nothing here reads the client address
        server_header=False,
        log_level="warning",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=10,
    )


def build_app(worker: Worker) -> ASGIApp:
    """The worker's ASGI application."""
    settings = worker.settings
    max_body = settings.serving_max_body_bytes
    max_candidates = settings.serving_max_candidates

    async def predict(scope: Scope, receive: Receive, send: Send) -> None:
        ex = worker.exchange("http")
        ex.trace_from(header(scope, b"traceparent"))
        try:
            body = await read_body(scope, receive, max_body)
            ex.input_bytes = len(body)
            decoded = decode_json(body, max_candidates)
        except RequestRejected as rejection:
            ex.request_id = worker.next_request_id()
            ex.reject(rejection)
            payload = orjson.dumps(ex.error_body())
            worker.record(ex)  # the row first: an answered request always has one
            await send_json(send, ex.status, payload, ex.traceparent)
            return
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
            payload = orjson.dumps(ex.error_body())
        else:
            payload = orjson.dumps(
                {
                    "request_id": ex.request_id,
                    "scores": ex.scores,
                    "model_version": ex.version,
                    "lineage_id": ex.lineage_id,
                    "slot": ex.slot,
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
        worker.record(ex)
        await send_json(send, ex.status, payload, ex.traceparent)

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
            ex.trace_from(request.headers.get("traceparent"))
            # The caller's trace (a release's canary step) holds this call and what it did.
            with worker.tracer.admin_span(
                f"admin {name}", ex.parent, {"relay.request_id": ex.request_id}
            ) as span:
                ex.span = span
                try:
                    _authorise(request, settings.serving_admin_token.get_secret_value())
                    body: dict[str, Any] = {}
                    if request.method == "POST":
                        raw = await read_body(request.scope, request.receive, max_body)
                        ex.input_bytes = len(raw)
                        body = json_object(raw) if raw.strip() else {}
                    ex.version = str(body.get("version", ""))[:200]
                    span.set_attribute("relay.model_version", ex.version)
                    result = await op(body)
                except RequestRejected as rejection:
                    ex.reject(rejection)
                    span.set_attribute("relay.error_code", rejection.code)
                    headers = {"WWW-Authenticate": "Bearer"} if rejection.status == 401 else {}
                    worker.record(ex)
                    return json_response(ex.error_body(), ex.status, headers | _traced(ex))
            worker.record(ex)
            return json_response(result, headers=_traced(ex))

        handler.__name__ = f"admin_{name}"
        return handler

    async def state(body: dict[str, Any]) -> dict[str, Any]:
        return worker.state()

    async def load(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.load(check_slot(body.get("slot")), body.get("version", ""))

    async def weight(body: dict[str, Any]) -> dict[str, Any]:
        if "weight" not in body:
            raise RequestRejected(
                "missing_field", "body needs 'weight' (integer 0-100) and, above 0, 'lease_s'"
            )
        return await worker.set_weight(body["weight"], body.get("lease_s"))

    async def renew(body: dict[str, Any]) -> dict[str, Any]:
        if "lease_s" not in body:
            raise RequestRejected("missing_field", "body needs 'lease_s' (seconds)")
        return await worker.renew(body["lease_s"])

    async def promote(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.promote()

    async def rollback(body: dict[str, Any]) -> dict[str, Any]:
        return await worker.rollback(check_removal_reason(body.get("reason", "operator")))

    async def latency(body: dict[str, Any]) -> dict[str, Any]:
        if "ms" not in body:
            raise RequestRejected(
                "missing_field", "body needs 'slot' and 'ms' (and optionally 'factor', 'stage')"
            )
        return await worker.set_latency(
            check_slot(body.get("slot")),
            body["ms"],
            body.get("factor", 1.0),
            body.get("stage", "compute"),
        )

    async def ranking(body: dict[str, Any]) -> dict[str, Any]:
        if "ranking" not in body:
            raise RequestRejected("missing_field", "body needs 'slot' and 'ranking'")
        return await worker.set_ranking(check_slot(body.get("slot")), body["ranking"])

    async def feedback(request: Request) -> Response:
        """Clicks and orders on one served request's items; 202 once they are written ahead."""
        log = worker.feedback_log
        try:
            if log is None:
                raise RequestRejected(
                    "feedback_disabled", "this worker keeps no request log: feedback is off", 503
                )
            raw = await read_body(request.scope, request.receive, max_body)
            batch = decode_feedback(raw, settings.serving_max_feedback_events)
        except RequestRejected as rejection:
            worker.metrics.observe_feedback(rejection.code, 1)
            return json_response(
                {"error": rejection.code, "detail": rejection.detail}, rejection.status
            )
        ids = log.write_feedback(batch)
        worker.metrics.observe_feedback("accepted", len(ids))
        return json_response({"accepted": len(ids), "feedback_ids": ids}, 202)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return json_response({"error": f"http_{status}", "detail": detail}, status)

    async def predict_elsewhere(request: Request) -> Response:
        raise HTTPException(500, "POST /v1/predict is served before Starlette")

    routes = [
        # Listed so that other methods get a 405; POST never reaches Starlette (with_predict).
        Route(PREDICT_PATH, predict_elsewhere, methods=["POST"]),
        Route(FEEDBACK_PATH, feedback, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/state", admin("state", state), methods=["GET"]),
        Route("/admin/load", admin("load", load), methods=["POST"]),
        Route("/admin/weight", admin("weight", weight), methods=["POST"]),
        Route("/admin/renew", admin("renew", renew), methods=["POST"]),
        Route("/admin/promote", admin("promote", promote), methods=["POST"]),
        Route("/admin/rollback", admin("rollback", rollback), methods=["POST"]),
        Route("/admin/latency", admin("latency", latency), methods=["POST"]),
        Route("/admin/ranking", admin("ranking", ranking), methods=["POST"]),
    ]
    return with_predict(
        predict, Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    )


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


def _traced(ex: Exchange) -> dict[str, str]:
    return {"traceparent": ex.traceparent} if ex.traceparent else {}
