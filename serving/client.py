"""A small blocking client for the worker's binary protocol (serving.protocol).

    with BinaryClient("127.0.0.1", port) as client:
        result = client.predict(user, session, context, items)      # items: (n, 13) float32
        many = client.predict_many([BinaryRequest(...), ...])         # pipelined

One client is one persistent connection, for one thread at a time; a background heartbeat
keeps an idle connection from being reaped.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from relay.errors import ServingError
from serving.protocol import FrameBuffer, FrameError, Kind, decode_header, encode_frame
from serving.schema import ITEM_FIELDS


@dataclass(frozen=True)
class BinaryRequest:
    """One predict request in the binary form: per-request sections plus item rows."""

    user: Mapping[str, float]
    session: Mapping[str, Any]  # session_id plus the session features
    context: Mapping[str, float]
    items: np.ndarray  # (n, len(ITEM_FIELDS)) in ITEM_FIELDS order
    request_id: str | None = None
    traceparent: str | None = None  # W3C trace context: the request joins the caller's trace


@dataclass(frozen=True)
class BinaryResult:
    """A worker's answer to one request."""

    request_id: str
    scores: np.ndarray
    slot: str
    model_version: str
    lineage_id: str
    traceparent: str = ""  # the worker's span for this request


@dataclass(frozen=True)
class BinaryRejection:
    """A worker's refusal of one request, with the code it logged."""

    status: int
    error: str
    detail: str
    request_id: str = ""  # the id the worker logged the refusal under


class BinaryRequestFailed(ServingError):
    """The worker refused a request sent with `predict`."""

    def __init__(self, rejection: BinaryRejection) -> None:
        super().__init__(f"{rejection.status} {rejection.error}: {rejection.detail}")
        self.rejection = rejection


class BinaryClient:
    """A persistent binary-protocol connection to one worker."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 10.0,
        heartbeat_s: float | None = 15.0,
        max_frame_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._frames = FrameBuffer(max_payload=max_frame_bytes)
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._last_send = time.monotonic()
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None
        if heartbeat_s:
            self._heartbeat = threading.Thread(
                target=self._beat, args=(heartbeat_s,), name="binary-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def __enter__(self) -> BinaryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._sock.close()

    def predict(
        self,
        user: Mapping[str, float],
        session: Mapping[str, Any],
        context: Mapping[str, float],
        items: np.ndarray,
        request_id: str | None = None,
    ) -> BinaryResult:
        """Scores for one request. Raises BinaryRequestFailed if the worker refuses it."""
        (answer,) = self.predict_many([BinaryRequest(user, session, context, items, request_id)])
        if isinstance(answer, BinaryRejection):
            raise BinaryRequestFailed(answer)
        return answer

    def predict_many(
        self, requests: Iterable[BinaryRequest], window: int = 64
    ) -> list[BinaryResult | BinaryRejection]:
        """Answers in request order, sent pipelined with up to `window` requests in flight."""
        pending = list(requests)
        answers: dict[int, BinaryResult | BinaryRejection] = {}
        ids: list[int] = []
        in_flight: set[int] = set()
        sent = 0
        while sent < len(pending) or in_flight:
            burst = []
            while sent < len(pending) and len(in_flight) < window:
                frame_id = next(self._ids)
                ids.append(frame_id)
                in_flight.add(frame_id)
                burst.append(encode_predict(frame_id, pending[sent]))
                sent += 1
            if burst:
                self._send(b"".join(burst))
            for kind, head, payload in self._receive():
                answered = head.get("id") if isinstance(head, dict) else None
                if kind == Kind.PONG or answered not in in_flight:
                    continue
                in_flight.discard(answered)
                answers[answered] = _answer(kind, head, payload)
        return [answers[i] for i in ids]

    def predict_paced(
        self, requests: Sequence[BinaryRequest], send_at_s: Sequence[float]
    ) -> list[BinaryResult | BinaryRejection]:
        """Answers in request order, sent open-loop: request k leaves `send_at_s[k]` s after start.

        Users arrive whatever the latency, so unlike `predict_many` a slower worker does not
        slow the offered load: what is in flight grows instead, as in production.
        """
        if len(send_at_s) != len(requests) or any(b < a for a, b in itertools.pairwise(send_at_s)):
            raise ValueError("send_at_s needs one non-decreasing offset per request")
        frames = []
        for request in requests:
            frame_id = next(self._ids)
            frames.append((frame_id, encode_predict(frame_id, request)))
        failure: list[BaseException] = []

        def send() -> None:
            start = time.perf_counter()
            sent = 0
            try:
                while sent < len(frames):
                    now = time.perf_counter() - start
                    due = sent
                    while due < len(frames) and send_at_s[due] <= now:
                        due += 1
                    if due > sent:
                        self._send(b"".join(f for _, f in frames[sent:due]))
                        sent = due
                    if sent < len(frames):
                        time.sleep(max(0.0, start + send_at_s[sent] - time.perf_counter()))
            except OSError as exc:
                failure.append(exc)

        sender = threading.Thread(target=send, name="binary-paced-sender", daemon=True)
        sender.start()
        waiting = {frame_id for frame_id, _ in frames}
        answers: dict[int, BinaryResult | BinaryRejection] = {}
        try:
            while waiting and not failure:
                for kind, head, payload in self._receive():
                    answered = head.get("id") if isinstance(head, dict) else None
                    if kind == Kind.PONG or answered not in waiting:
                        continue
                    waiting.discard(answered)
                    answers[answered] = _answer(kind, head, payload)
        finally:
            sender.join()
        if failure:
            raise ServingError(f"sending paced requests failed: {failure[0]}")
        return [answers[frame_id] for frame_id, _ in frames]

    def ping(self) -> float:
        """Round trip of a heartbeat, in seconds."""
        frame_id = next(self._ids)
        started = time.perf_counter()
        self._send(encode_frame(Kind.PING, {"id": frame_id}))
        while True:
            for kind, head, _ in self._receive():
                if kind == Kind.PONG and isinstance(head, dict) and head.get("id") == frame_id:
                    return time.perf_counter() - started

    def send_raw(self, data: bytes) -> list[tuple[int, Any, bytes]]:
        """Send arbitrary bytes and return the next frames received (for protocol tests)."""
        self._send(data)
        return [(k, h, bytes(p)) for k, h, p in self._receive()]

    # -- internals ---------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(data)
            self._last_send = time.monotonic()

    def _receive(self) -> list[tuple[int, Any, memoryview]]:
        """Block until at least one frame arrives; return every complete frame."""
        while True:
            view = self._frames.writable()
            n = self._sock.recv_into(view)
            if n == 0:
                raise ServingError("the worker closed the binary connection")
            self._frames.advance(n)
            try:
                got = [(k, decode_header(h), p) for k, h, p in self._frames.frames()]
            except FrameError as exc:
                raise ServingError(f"unreadable frame from the worker: {exc}") from exc
            if got:
                return got

    def _beat(self, every_s: float) -> None:
        while not self._closed.wait(every_s / 3):
            if time.monotonic() - self._last_send >= every_s:
                try:
                    self._send(encode_frame(Kind.PING, {"id": 0}))
                except OSError:
                    return


def encode_predict(frame_id: int, request: BinaryRequest) -> bytes:
    """The PREDICT frame for a request."""
    items = np.ascontiguousarray(request.items, dtype="<f4")
    if items.ndim != 2:
        raise ValueError(f"items must be 2-D (n, {len(ITEM_FIELDS)}), got shape {items.shape}")
    header: dict[str, Any] = {
        "id": frame_id,
        "user": dict(request.user),
        "session": dict(request.session),
        "context": dict(request.context),
        "rows": int(items.shape[0]),
        "cols": int(items.shape[1]),
    }
    if request.request_id is not None:
        header["request_id"] = request.request_id
    if request.traceparent is not None:
        header["traceparent"] = request.traceparent
    return encode_frame(Kind.PREDICT, header, items.tobytes())


def items_matrix(candidates: Sequence[Mapping[str, float]]) -> np.ndarray:
    """Candidate dicts (as in the JSON API) as the (n, 13) float32 matrix the binary form sends."""
    return np.array([[c[f] for f in ITEM_FIELDS] for c in candidates], dtype="<f4").reshape(
        len(candidates), len(ITEM_FIELDS)
    )


def _answer(kind: int, head: dict[str, Any], payload: memoryview) -> BinaryResult | BinaryRejection:
    if kind == Kind.RESULT:
        return BinaryResult(
            request_id=head["request_id"],
            scores=np.frombuffer(payload, dtype="<f4").copy(),  # the buffer is reused
            slot=head["slot"],
            model_version=head["model_version"],
            lineage_id=head["lineage_id"],
            traceparent=str(head.get("traceparent") or ""),
        )
    return BinaryRejection(
        status=int(head.get("status", 0)),
        error=str(head.get("error", "")),
        detail=str(head.get("detail", "")),
        request_id=str(head.get("request_id") or ""),
    )
