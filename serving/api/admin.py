"""The admin API: slots, weights, leases, the shadow, promotion and rollback, behind a token.

`/admin/shadow` `{"share": 0.2, "max_queue": 32, "lease_s": 30}` mirrors that share of stable's
answered requests to the canary slot (serving.shadow) until the lease runs out; the same call
renews it, `{"share": 0}` stops it. A worker from before the shadow answers 404 here.

Every call is logged as an `inference_logs` row (slot `admin`) and traced as a span in the
caller's trace. Fault injection — `/admin/latency` (added latency or slowdown in one stage of
one slot) and `/admin/ranking` (a slot's answers reversed or shuffled) — exists only for tests,
benchmarks and demonstrations of the release guards: a worker answers 404 on both unless
RELAY_SERVING_FAULT_INJECTION is true, so no production token can slow or scramble its answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.api.predict import check_admin_token, read_body
from serving.api.responses import json_response
from serving.routing import check_removal_reason, check_slot
from serving.schema import RequestRejected, json_object
from serving.worker import ADMIN, Exchange, Worker

AdminOp = Callable[[Worker, dict[str, Any]], Awaitable[dict[str, Any]]]


async def _state(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    return worker.state()


async def _load(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    return await worker.load(check_slot(body.get("slot")), body.get("version", ""))


async def _weight(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    if "weight" not in body:
        raise RequestRejected(
            "missing_field", "body needs 'weight' (integer 0-100) and, above 0, 'lease_s'"
        )
    return await worker.set_weight(body["weight"], body.get("lease_s"))


async def _renew(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    if "lease_s" not in body:
        raise RequestRejected("missing_field", "body needs 'lease_s' (seconds)")
    return await worker.renew(body["lease_s"])


async def _shadow(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    return await worker.set_shadow(body)


async def _promote(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    return await worker.promote()


async def _rollback(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    return await worker.rollback(check_removal_reason(body.get("reason", "operator")))


_LATENCY_KNOBS = ("factor", "stage", "mode", "share")  # RoutingTable.with_latency's keywords


async def _latency(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    if "ms" not in body:
        raise RequestRejected(
            "missing_field",
            "body needs 'slot' and 'ms' (and optionally 'factor', 'stage', 'mode', 'share')",
        )
    unknown = sorted(set(body) - {"slot", "ms", *_LATENCY_KNOBS})
    if unknown:
        raise RequestRejected(
            "unknown_field",
            f"unknown field(s) {', '.join(map(repr, unknown))}: an injection takes 'slot', 'ms' "
            f"and optionally {', '.join(map(repr, _LATENCY_KNOBS))}",
        )
    knobs = {k: body[k] for k in _LATENCY_KNOBS if k in body}
    return await worker.set_latency(check_slot(body.get("slot")), body["ms"], **knobs)


async def _ranking(worker: Worker, body: dict[str, Any]) -> dict[str, Any]:
    if "ranking" not in body:
        raise RequestRejected("missing_field", "body needs 'slot' and 'ranking'")
    return await worker.set_ranking(check_slot(body.get("slot")), body["ranking"])


# name -> (HTTP method, operation)
CONTROL: dict[str, tuple[str, AdminOp]] = {
    "state": ("GET", _state),
    "load": ("POST", _load),
    "weight": ("POST", _weight),
    "renew": ("POST", _renew),
    "shadow": ("POST", _shadow),
    "promote": ("POST", _promote),
    "rollback": ("POST", _rollback),
}
FAULT_INJECTION: dict[str, tuple[str, AdminOp]] = {
    "latency": ("POST", _latency),
    "ranking": ("POST", _ranking),
}


def admin_routes(worker: Worker) -> list[Route]:
    """The control routes, and the fault-injection ones where the settings enable them."""
    ops = dict(CONTROL)
    if worker.settings.serving_fault_injection:
        ops.update(FAULT_INJECTION)
    return [
        Route(f"/admin/{name}", _handler(worker, name, op), methods=[method])
        for name, (method, op) in ops.items()
    ]


def _handler(worker: Worker, name: str, op: AdminOp) -> Callable[[Request], Awaitable[Response]]:
    settings = worker.settings

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
                check_admin_token(
                    request.headers.get("authorization"),
                    settings.serving_admin_token.get_secret_value(),
                )
                body: dict[str, Any] = {}
                if request.method == "POST":
                    raw = await read_body(
                        request.scope, request.receive, settings.serving_max_body_bytes
                    )
                    ex.input_bytes = len(raw)
                    body = json_object(raw) if raw.strip() else {}
                ex.version = str(body.get("version", ""))[:200]
                span.set_attribute("relay.model_version", ex.version)
                result = await op(worker, body)
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


def _traced(ex: Exchange) -> dict[str, str]:
    return {"traceparent": ex.traceparent} if ex.traceparent else {}
