"""JSON responses for the Starlette routes."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

JSON = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type=JSON,
        headers=headers,
    )
