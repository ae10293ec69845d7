"""`POST /v1/predict` on a bare ASGI path, in front of Starlette.

At a few thousand requests a second per core, Starlette's request object, router and middleware
stack cost more than the model does, and the predict path needs none of them. The checks that
matter (serving.schema) run on numpy arrays; no validation framework sits on the hot path.
A request goes through three steps, each a method to extend: `decode` (body to a checked
request), `answer` (routing, batching, the engine: `Worker.submit`), and `reply` (log row,
then the response).

A load test (the release's capacity check, tasks/capacity.py) pins a request to a slot with
`X-Relay-Pin-Slot: stable|canary` and the admin bearer token: the candidate at weight 0 answers
it, no user is routed differently, and its row is logged as slot `loadtest` (no impression).
Without the header nothing here changes; with it, a missing or wrong token is a 401 and a bad
slot a 400, each logged like any refused request.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from serving.routing import LOAD_TEST, check_pinned_slot
from serving.schema import PredictRequest, RequestRejected, decode_json
from serving.worker import Exchange, Worker

PREDICT_PATH = "/v1/predict"
PIN_HEADER = "x-relay-pin-slot"  # a load test's slot; needs the admin token
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_JSON_HEADER = (b"content-type", b"application/json")


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


def check_admin_token(authorization: str | None, token: str) -> None:
    """Refuse (503 admin off, 401 otherwise) unless `authorization` is `Bearer <token>`."""
    if not token:
        raise RequestRejected(
            "admin_disabled", "the admin API is off: set RELAY_SERVING_ADMIN_TOKEN", 503
        )
    scheme, _, given = (authorization or "").partition(" ")
    # compare_digest: the time taken does not reveal how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        raise RequestRejected(
            "unauthorized", "a valid 'Authorization: Bearer <token>' is required", 401
        )


async def send_json(send: Send, status: int, body: bytes, traceparent: str = "") -> None:
    """A complete JSON response; with the request's `traceparent` echoed when it has one."""
    headers = [_JSON_HEADER, (b"content-length", str(len(body)).encode())]
    if traceparent:
        headers.append((b"traceparent", traceparent.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class PredictEndpoint:
    """The ASGI callable for `POST /v1/predict`."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.max_body = worker.settings.serving_max_body_bytes
        self.max_candidates = worker.settings.serving_max_candidates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ex = self.worker.exchange("http")
        ex.trace_from(header(scope, b"traceparent"))
        try:
            pinned = self.pinned_slot(scope)
            if pinned is not None:
                ex.slot = LOAD_TEST
            request = await self.decode(ex, scope, receive)
        except RequestRejected as rejection:
            ex.request_id = self.worker.next_request_id()
            ex.reject(rejection)
            await self.reply(ex, send)
            return
        await self.answer(ex, request, pinned)
        await self.reply(ex, send)

    def pinned_slot(self, scope: Scope) -> str | None:
        """The slot a load test pins (checked, admin token required), None for user traffic."""
        pin = header(scope, PIN_HEADER.encode())
        if pin is None:
            return None
        token = self.worker.settings.serving_admin_token.get_secret_value()
        check_admin_token(header(scope, b"authorization"), token)
        return check_pinned_slot(pin.strip())

    async def decode(self, ex: Exchange, scope: Scope, receive: Receive) -> PredictRequest:
        """The body as a checked request; RequestRejected says what is wrong with it."""
        body = await read_body(scope, receive, self.max_body)
        ex.input_bytes = len(body)
        return decode_json(body, self.max_candidates)

    async def answer(
        self, ex: Exchange, request: PredictRequest, pinned: str | None = None
    ) -> None:
        """Route (or pin), batch and score the request; `ex` holds the outcome."""
        answered: asyncio.Future[Exchange] = asyncio.get_running_loop().create_future()

        def done(e: Exchange) -> None:
            if not answered.done():
                answered.set_result(e)

        self.worker.submit(ex, request, done, pinned)
        try:
            await answered
        except asyncio.CancelledError:
            ex.reject(RequestRejected("cancelled", "the request was cancelled", 499))
            self.worker.record(ex)
            raise

    async def reply(self, ex: Exchange, send: Send) -> None:
        """The request's log row first (an answered request always has one), then the answer."""
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
        self.worker.record(ex)
        await send_json(send, ex.status, payload, ex.traceparent)
