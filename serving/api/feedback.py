"""`POST /v1/feedback`: clicks and orders on one served request's items (serving.feedback)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.api.predict import read_body
from serving.api.responses import json_response
from serving.feedback import decode_feedback
from serving.schema import RequestRejected
from serving.worker import Worker

FEEDBACK_PATH = "/v1/feedback"


def feedback_routes(worker: Worker) -> list[Route]:
    settings = worker.settings

    async def feedback(request: Request) -> Response:
        """202 once the events are written ahead; 503 on a worker that keeps no log."""
        log = worker.feedback_log
        try:
            if log is None:
                raise RequestRejected(
                    "feedback_disabled", "this worker keeps no request log: feedback is off", 503
                )
            raw = await read_body(request.scope, request.receive, settings.serving_max_body_bytes)
            batch = decode_feedback(raw, settings.serving_max_feedback_events)
        except RequestRejected as rejection:
            worker.metrics.observe_feedback(rejection.code, 1)
            return json_response(
                {"error": rejection.code, "detail": rejection.detail}, rejection.status
            )
        ids = log.write_feedback(batch)
        worker.metrics.observe_feedback("accepted", len(ids))
        return json_response({"accepted": len(ids), "feedback_ids": ids}, 202)

    return [Route(FEEDBACK_PATH, feedback, methods=["POST"])]
