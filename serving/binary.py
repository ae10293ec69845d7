"""The binary-protocol server (serving.protocol) on the worker's event loop.

Each connection is a BufferedProtocol: the kernel copies received bytes straight into the
connection's FrameBuffer, frames are cut from it as memoryviews, and the float32 payload is
read through np.frombuffer into the request's feature block, so no bytes are copied on the
way in. Results are encoded in the batch's completion callback (no task per request), and a
connection's answers from one batch leave in one write.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, cast

import orjson

from serving.protocol import FrameBuffer, FrameError, Kind, decode_header, encode_frame
from serving.schema import RequestRejected, decode_binary
from serving.worker import Exchange, Worker

log = logging.getLogger("serving.binary")


class BinaryServer:
    """Accepts binary-protocol connections and closes the ones idle past `idle_s`."""

    def __init__(self, worker: Worker, idle_s: float) -> None:
        self.worker = worker
        self.idle_s = idle_s
        self.connections: set[BinaryConnection] = set()
        self._server: asyncio.Server | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; return the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BinaryConnection(self), host, port, reuse_address=True, backlog=1024
        )
        self._reaper = loop.create_task(self._reap())
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting; let answers already owed go out, then close every connection."""
        if self._server is not None:
            self._server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        for conn in list(self.connections):
            conn.close_when_answered()
        deadline = time.monotonic() + 10
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(self.idle_s / 4, 5.0))
            cutoff = time.monotonic() - self.idle_s
            for conn in list(self.connections):
                if conn.last_heard < cutoff and not conn.owed:
                    log.info(
                        "closing binary connection %s: idle for %.0f s", conn.peer, self.idle_s
                    )
                    conn.close_when_answered()


class BinaryConnection(asyncio.BufferedProtocol):
    """One client connection: frames in, results out, matched by the client's ids."""

    def __init__(self, server: BinaryServer) -> None:
        self.server = server
        self.worker = server.worker
        settings = server.worker.settings
        self.max_candidates = settings.serving_max_candidates
        self.frames = FrameBuffer(max_payload=settings.serving_max_body_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.last_heard = time.monotonic()
        self.owed = 0  # predictions received and not yet answered
        self._closing = False
        self._outgoing: list[bytes] = []

    # -- asyncio.BufferedProtocol ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio subclass
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = str(transport.get_extra_info("peername"))
        self.server.connections.add(self)
        self.worker.binary_connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.worker.binary_connections -= 1
        self.transport = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.frames.writable()

    def buffer_updated(self, nbytes: int) -> None:
        self.frames.advance(nbytes)
        self.last_heard = time.monotonic()
        try:
            for kind, header, payload in self.frames.frames():
                self._frame(kind, header, payload)
        except FrameError as exc:
            # The stream cannot be resynchronised: say why, log it, and hang up.
            ex = self.worker.exchange("binary")
            ex.request_id = self.worker.next_request_id()
            ex.reject(
                RequestRejected(exc.code, exc.detail, 413 if exc.code == "body_too_large" else 400)
            )
            self._send_error(None, ex)
            log.warning("binary connection %s sent an unreadable frame: %s", self.peer, exc)
            self.close_when_answered()

    def eof_received(self) -> bool:
        self.close_when_answered()
        return True  # keep the write side open until owed answers are sent

    def pause_writing(self) -> None:
        # A client that does not read its answers stops being read from.
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    # -- frames ------------------------------------------------------------------------------
    def _frame(self, kind: int, header: memoryview, payload: memoryview) -> None:
        if kind == Kind.PING:
            frame_id = _frame_id(_safe_header(header))
            self._write(encode_frame(Kind.PONG, {"id": frame_id}))
            return
        ex = self.worker.exchange("binary")
        ex.input_bytes = payload.nbytes
        frame_id = None
        try:
            try:
                head = decode_header(header)
            except orjson.JSONDecodeError as exc:
                raise RequestRejected("bad_json", f"frame header is not JSON: {exc}") from None
            frame_id = _frame_id(head)
            if isinstance(head, dict):
                ex.trace_from(head.get("traceparent"))
            if kind != Kind.PREDICT:
                raise RequestRejected("bad_frame", f"unexpected frame kind {kind} from a client")
            decoded = decode_binary(head, payload, self.max_candidates)
        except RequestRejected as rejection:
            ex.request_id = self.worker.next_request_id()
            ex.reject(rejection)
            self._send_error(frame_id, ex)
            return
        self.owed += 1
        self.worker.submit(ex, decoded, lambda e: self._answer(frame_id, e))

    def _answer(self, frame_id: Any, ex: Exchange) -> None:
        self.owed -= 1
        if ex.status != 200:
            self._send_error(frame_id, ex)
        else:
            scores = ex.scores
            assert scores is not None
            self.worker.record(ex)  # the row first: an answered request always has one
            head = {
                "id": frame_id,
                "request_id": ex.request_id,
                "slot": ex.slot,
                "model_version": ex.version,
                "lineage_id": ex.lineage_id,
                "rows": int(scores.shape[0]),
                "traceparent": ex.traceparent,
            }
            self._write(encode_frame(Kind.RESULT, head, scores.astype("<f4", copy=False).tobytes()))
        if self._closing and not self.owed:
            self._close_now()

    def _send_error(self, frame_id: Any, ex: Exchange) -> None:
        self.worker.record(ex)
        self._write(
            encode_frame(
                Kind.ERROR,
                {
                    "id": frame_id,
                    "request_id": ex.request_id,
                    "status": ex.status,
                    "error": ex.error_code,
                    "detail": ex.detail,
                    "traceparent": ex.traceparent,
                },
            )
        )

    def _write(self, data: bytes) -> None:
        # A batch answers many of this connection's requests in one loop iteration: gather
        # their frames and send them with one write (one syscall) once the iteration ends.
        if not self._outgoing:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outgoing.append(data)

    def _flush(self) -> None:
        frames, self._outgoing = self._outgoing, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def close_when_answered(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.pause_reading()
        if not self.owed:
            self._close_now()

    def _close_now(self) -> None:
        self._flush()  # close() still sends what was written before it
        if self.transport is not None:
            self.transport.close()


def _safe_header(header: memoryview) -> Any:
    try:
        return decode_header(header)
    except orjson.JSONDecodeError:
        return None


def _frame_id(head: Any) -> Any:
    return head.get("id") if isinstance(head, dict) else None
