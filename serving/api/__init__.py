"""The worker's HTTP routes, one module per concern; serving.http composes them into one app.

`predict` (the bare ASGI hot path), `feedback` (POST /v1/feedback), `admin` (the authorised
control API, fault injection only where RELAY_SERVING_FAULT_INJECTION enables it) and `health`
(/healthz, /readyz, /metrics). Each builds its part from the worker alone, so a new stage of
the request path (a shadow or mirror copy of predict traffic, say) is one more module here.
"""
