"""The worker's HTTP face: predict on a bare ASGI path, everything else on Starlette.

The routes live in `serving.api`, one module per concern (predict, feedback, admin, health and
metrics); this module composes them into one ASGI app and holds uvicorn's configuration.
"""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.api.admin import admin_routes
from serving.api.feedback import FEEDBACK_PATH, feedback_routes
from serving.api.health import health_routes
from serving.api.predict import (
    PREDICT_PATH,
    ASGIApp,
    PredictEndpoint,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_json,
)
from serving.api.responses import JSON, json_response
from serving.worker import Worker

__all__ = [  # bench.serving's echo server and others build on these
    "FEEDBACK_PATH",
    "JSON",
    "PREDICT_PATH",
    "ASGIApp",
    "Receive",
    "Scope",
    "Send",
    "build_app",
    "header",
    "json_response",
    "read_body",
    "send_json",
    "server_config",
    "with_predict",
]


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


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return json_response({"error": f"http_{status}", "detail": detail}, status)


async def _predict_elsewhere(request: Request) -> Response:
    raise HTTPException(500, "POST /v1/predict is served before Starlette")


def build_app(worker: Worker) -> ASGIApp:
    """The worker's ASGI application."""
    routes = [
        # Listed so that other methods get a 405; POST never reaches Starlette (with_predict).
        Route(PREDICT_PATH, _predict_elsewhere, methods=["POST"]),
        *feedback_routes(worker),
        *health_routes(worker),
        *admin_routes(worker),
    ]
    other = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    return with_predict(PredictEndpoint(worker), other)
