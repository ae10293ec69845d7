"""A bounded open-loop load test of one worker slot over HTTP, for the release's capacity check.

Each request is pinned to `stable` or `canary` (`X-Relay-Pin-Slot` with the admin token, see
serving/api/predict.py), so the candidate at weight 0 can be loaded without any user being
routed to it, and its rows are logged as slot `loadtest`. The loop is open: requests are
scheduled at the offered rate whatever the answers do, latency counts from the scheduled send
(queueing in the client included, so a saturated worker cannot hide its backlog), and a
request still unanswered `drain_s` after its round ends counts as an error with latency inf.
Bounded in count (rate x seconds) and time (round + drain). Only 127.0.0.1 in tests and benches.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


@dataclass
class RoundResult:
    """Latencies (ms; inf = never answered) of the requests scheduled in one round."""

    offered_rps: float
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def achieved_rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0


def post_requests(
    docs: Sequence[dict[str, Any]], netloc: str, headers: dict[str, str] | None = None
) -> list[bytes]:
    """Each body as a complete keep-alive HTTP/1.1 `POST /v1/predict` to `netloc`."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    out = []
    for doc in docs:
        body = json.dumps(doc, separators=(",", ":")).encode()
        head = (
            f"POST /v1/predict HTTP/1.1\r\nHost: {netloc}\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        out.append(head + body)
    return out


def pinned_requests(docs: Sequence[dict[str, Any]], url: str, slot: str, token: str) -> list[bytes]:
    """Each body as a keep-alive HTTP/1.1 POST pinned to `slot`."""
    pin = {"Authorization": f"Bearer {token}", "X-Relay-Pin-Slot": slot}
    return post_requests(docs, urlsplit(url).netloc, pin)


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection with one request outstanding at a time; `on_done(conn,
    status)` is called with each answer's HTTP status once its whole body has arrived."""

    def __init__(self, on_done: Callable[[HttpConnection, int], None]) -> None:
        self.on_done = on_done
        self.buf = bytearray()
        self.need = -1
        self.status = 0
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def send(self, request: bytes, sent_at: float) -> None:
        assert self.transport is not None
        self.sent_at = sent_at
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                match = _CONTENT_LENGTH.search(buf, 0, end)
                self.status = int(buf[9:12])
                self.need = end + 4 + (int(match.group(1)) if match else 0)
            if len(buf) < self.need:
                return
            del buf[: self.need]
            self.need = -1
            self.on_done(self, self.status)


async def run_round(
    url: str,
    requests: Sequence[bytes],
    rate: float,
    seconds: float,
    connections: int,
    drain_s: float = 2.0,
) -> RoundResult:
    """Offer `rate` requests/s for `seconds` to the worker at `url` over `connections`."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    if host is None or port is None:
        raise ValueError(f"{url!r} names no host and port")
    loop = asyncio.get_running_loop()
    result = RoundResult(rate, seconds)
    idle: deque[HttpConnection] = deque()
    busy: set[HttpConnection] = set()
    backlog: deque[float] = deque()
    counter = [0]

    def send(conn: HttpConnection, at: float) -> None:
        busy.add(conn)
        conn.send(requests[counter[0] % len(requests)], at)
        counter[0] += 1

    def on_done(conn: HttpConnection, status: int) -> None:
        busy.discard(conn)
        result.latencies_ms.append((time.perf_counter() - conn.sent_at) * 1000)
        result.statuses[status] = result.statuses.get(status, 0) + 1
        if status == 200:
            result.ok += 1
        else:
            result.errors += 1
        if backlog:
            send(conn, backlog.popleft())
        else:
            idle.append(conn)

    conns = []
    for _ in range(connections):
        _, conn = await loop.create_connection(lambda: HttpConnection(on_done), host, port)
        conns.append(conn)
    idle.extend(conns)
    t0 = time.perf_counter()
    stop = t0 + seconds
    interval, due = 1.0 / rate, t0
    try:
        while (now := time.perf_counter()) < stop:
            while due <= now and due < stop:
                if idle:
                    send(idle.popleft(), due)
                else:
                    backlog.append(due)
                due += interval
            await asyncio.sleep(0.0005)
        deadline = stop + drain_s
        while (busy or backlog) and time.perf_counter() < deadline:
            if all(c.lost for c in busy) and not backlog:
                break
            await asyncio.sleep(0.005)
    finally:
        for conn in conns:
            if conn.transport is not None:
                conn.transport.close()
    never = len(backlog) + len(busy)  # scheduled in the round, never answered in time
    result.errors += never
    result.latencies_ms.extend([math.inf] * never)
    return result
