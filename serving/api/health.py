"""`/healthz` (the process answers), `/readyz` (it takes traffic, or why not), `/metrics`."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.api.responses import json_response
from serving.worker import Worker


def health_routes(worker: Worker) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok", "worker_id": worker.worker_id})

    async def readyz(request: Request) -> Response:
        ready, reason = worker.ready()
        return json_response({"ready": ready, "reason": reason}, 200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
