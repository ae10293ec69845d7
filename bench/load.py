"""Load generation for the serving benchmarks: request bodies, closed and open loops over HTTP and
the binary protocol, with latencies recorded from the scheduled send (bench.serving, bench.chaos).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from serving.load_test import HttpConnection, post_requests

CANDIDATES = 20

# -- request bodies ------------------------------------------------------------------------------


def request_docs(n: int, seed: int = 3) -> list[dict[str, Any]]:
    """`n` JSON predict bodies of 20 candidates each from the simulated shop, one session each."""
    from datetime import UTC, datetime

    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies

    events = generate_events(
        ShopConfig(seed=seed), n * CANDIDATES, datetime(2026, 11, 1, tzinfo=UTC)
    )
    docs = request_bodies(events, CANDIDATES)
    for i, doc in enumerate(docs):
        doc["session"]["session_id"] = f"bench-{i}"
    return docs


def http_requests(docs: Sequence[dict[str, Any]], host: str, port: int) -> list[bytes]:
    """Each body as a complete keep-alive HTTP/1.1 POST (serving.load_test's, unpinned)."""
    return post_requests(docs, f"{host}:{port}")


# -- load generation -----------------------------------------------------------------------------


@dataclass
class Recorder:
    """Latencies and outcomes inside the measured window [start, stop).

    Closed loops count answers that arrive in the window. Open loops (`by_send_time`) count the
    requests scheduled in the window, however late they are answered: a backlog built during
    warm-up cannot inflate the rate, and a slow answer cannot escape the percentiles.
    """

    start: float
    stop: float
    by_send_time: bool = False
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    answered_all: int = 0  # answered at any time, warm-up included: CPU per request over a run

    def done(self, sent_at: float, ok: bool) -> float:
        now = time.perf_counter()
        self.answered_all += ok
        if self.start <= (sent_at if self.by_send_time else now) < self.stop:
            self.latencies.append(now - sent_at)
            if ok:
                self.ok += 1
            else:
                self.errors += 1
        return now

    def figures(self) -> dict[str, float]:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.array([np.nan])
        return {
            "rps": round(self.ok / (self.stop - self.start), 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p95_ms": round(float(np.percentile(lat, 95)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3),
            "errors": self.errors,
        }


async def http_load(
    host: str,
    port: int,
    requests: list[bytes],
    connections: int,
    seconds: float,
    warmup: float,
    rate: float | None = None,
    drain_s: float = 10.0,
) -> Recorder:
    """Closed loop (rate None: each connection sends again on each answer) or open loop at `rate`
    requests/s, where latency counts from the scheduled send, queueing included, and requests
    still unanswered `drain_s` after the window count as errors."""
    loop = asyncio.get_running_loop()
    conns: list[HttpConnection] = []
    idle: deque[HttpConnection] = deque()
    busy: set[HttpConnection] = set()
    backlog: deque[float] = deque()
    rec = Recorder(start=0.0, stop=0.0, by_send_time=rate is not None)

    sent = itertools.count()

    def send(conn: HttpConnection, at: float) -> None:
        busy.add(conn)
        conn.send(requests[next(sent) % len(requests)], at)

    def on_done(conn: HttpConnection, status: int) -> None:
        busy.discard(conn)
        now = rec.done(conn.sent_at, status == 200)
        if rate is None:
            if now < rec.stop:
                send(conn, now)
        elif backlog:
            send(conn, backlog.popleft())
        else:
            idle.append(conn)

    for _ in range(connections):
        _, conn = await loop.create_connection(lambda: HttpConnection(on_done), host, port)
        conns.append(conn)
    t0 = time.perf_counter()
    rec.start, rec.stop = t0 + warmup, t0 + warmup + seconds
    if rate is None:
        for conn in conns:
            send(conn, time.perf_counter())
    else:
        idle.extend(conns)
        interval, due = 1.0 / rate, t0
        while (now := time.perf_counter()) < rec.stop:
            while due <= now:
                if idle:
                    send(idle.popleft(), due)
                else:
                    backlog.append(due)
                due += interval
            await asyncio.sleep(0.0005)
    deadline = rec.stop + drain_s
    while (busy or backlog) and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    if rec.by_send_time:  # scheduled in the window and never answered: errors
        late = [t for t in backlog] + [c.sent_at for c in busy]
        rec.errors += sum(rec.start <= t < rec.stop for t in late)
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    return rec


class BinaryConnection(asyncio.BufferedProtocol):
    """One binary-protocol connection keeping `depth` requests in flight."""

    def __init__(self, frames: list[bytes], depth: int, rec: Recorder, max_payload: int) -> None:
        from serving.protocol import FrameBuffer

        self.frames = frames
        self.depth = depth
        self.rec = rec
        self.buffer = FrameBuffer(max_payload=max_payload)
        self.sent_at = [0.0] * len(frames)
        self.seq = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport
        for _ in range(self.depth):
            self.send()

    def send(self) -> None:
        assert self.transport is not None
        k = self.seq % len(self.frames)  # frame k carries id k: unique among those in flight
        self.seq += 1
        self.sent_at[k] = time.perf_counter()
        self.transport.write(self.frames[k])

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer.writable()

    def buffer_updated(self, nbytes: int) -> None:
        import orjson

        from serving.protocol import Kind

        self.buffer.advance(nbytes)
        for kind, header, _ in self.buffer.frames():
            frame_id = orjson.loads(header)["id"]
            now = self.rec.done(self.sent_at[frame_id], kind == Kind.RESULT)
            if now < self.rec.stop:
                self.send()


async def binary_load(
    host: str,
    port: int,
    docs: Sequence[dict[str, Any]],
    connections: int,
    depth: int,
    seconds: float,
    warmup: float,
) -> Recorder:
    """Closed loop over persistent binary connections, `depth` pipelined requests each."""
    from serving.client import BinaryRequest, encode_predict, items_matrix

    frames = []
    for k in range(2 * depth):
        doc = docs[k % len(docs)]
        request = BinaryRequest(
            doc["user"], doc["session"], doc["context"], items_matrix(doc["candidates"])
        )
        frames.append(encode_predict(k, request))
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    rec = Recorder(start=t0 + warmup, stop=t0 + warmup + seconds)
    transports = []
    for _ in range(connections):
        transport, _ = await loop.create_connection(
            lambda: BinaryConnection(frames, depth, rec, 1 << 20), host, port
        )
        transports.append(transport)
    while time.perf_counter() < rec.stop:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    for transport in transports:
        transport.close()
    return rec


def run_async(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)
