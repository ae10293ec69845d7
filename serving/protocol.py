"""The framed binary protocol: length-prefixed frames on long-lived TCP connections.

    frame  = prefix (12 bytes) | header (UTF-8 JSON, header_len bytes) | payload (payload_len)
    prefix = magic b"RL" | version u8 | kind u8 | header_len u32 | payload_len u32  (little-endian)

Kinds and their headers:
    PREDICT  client -> worker  {id, user, session, context, rows, cols[, request_id][, traceparent]}
             payload: rows x cols little-endian float32 item features (serving.schema.ITEM_FIELDS)
    RESULT   worker -> client  {id, request_id, slot, model_version, lineage_id, rows, traceparent}
             payload: rows little-endian float32 scores
    ERROR    worker -> client  {id, request_id, status, error, detail, traceparent}; no payload

`traceparent` is W3C trace context (serving.tracing): the caller's joins its trace; the answer's
names the worker's span for the request.
    PING     client -> worker  {id};  PONG worker -> client {id}

`id` is the client's own number: stable and canary batch separately, so answers can overtake
each other, and a client that pipelines matches them by id. A frame the worker cannot read as
a frame (bad magic, oversized) ends the connection after an ERROR; a readable frame with bad
content gets an ERROR and the connection carries on.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

import orjson

from relay.errors import ServingError

MAGIC = b"RL"
VERSION = 1
PREFIX = struct.Struct("<2sBBII")
MAX_HEADER_BYTES = 64 * 1024
_MIN_READ = 64 * 1024


class Kind(IntEnum):
    PREDICT = 1
    RESULT = 2
    ERROR = 3
    PING = 4
    PONG = 5


class FrameError(ServingError):
    """The byte stream is not a valid frame sequence; the connection cannot continue."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def encode_frame(kind: Kind, header: dict[str, Any], payload: bytes | memoryview = b"") -> bytes:
    """One frame's bytes."""
    head = orjson.dumps(header)
    return b"".join((PREFIX.pack(MAGIC, VERSION, kind, len(head), len(payload)), head, payload))


class FrameBuffer:
    """Receive buffer that the socket reads straight into and frames are cut from in place.

    `writable()` hands out the free tail for recv_into / BufferedProtocol; `frames()` yields
    (kind, header, payload) as memoryviews into the buffer, valid until the next `writable()`.
    The buffer grows only to fit a declared frame, and is never resized in place, so views that
    a consumer forgot to drop stay safe.
    """

    def __init__(self, max_payload: int, initial: int = _MIN_READ) -> None:
        self.max_payload = max_payload
        self._buf = bytearray(initial)
        self._start = 0
        self._end = 0
        self._need = 0  # bytes the frame at _start needs in total, once its prefix is known

    @property
    def pending(self) -> int:
        """Bytes received but not yet cut into frames."""
        return self._end - self._start

    def writable(self) -> memoryview:
        """Free space at the end of the buffer, at least enough for the frame being read."""
        used = self._end - self._start
        if used == 0:
            self._start = self._end = 0
        want = max(self._need - used, _MIN_READ // 4)
        if len(self._buf) - self._end < want:
            if len(self._buf) - used >= want:
                self._buf[:used] = self._buf[self._start : self._end]
            else:
                grown = bytearray(max(2 * len(self._buf), used + want))
                grown[:used] = self._buf[self._start : self._end]
                self._buf = grown
            self._start, self._end = 0, used
        return memoryview(self._buf)[self._end :]

    def advance(self, nbytes: int) -> None:
        """Record that `nbytes` were written into the last writable() view."""
        self._end += nbytes

    def frames(self) -> Iterator[tuple[int, memoryview, memoryview]]:
        """Every complete frame received so far. Raises FrameError on an unreadable stream."""
        view = memoryview(self._buf)
        while self._end - self._start >= PREFIX.size:
            magic, version, kind, header_len, payload_len = PREFIX.unpack_from(
                self._buf, self._start
            )
            if magic != MAGIC or version != VERSION:
                raise FrameError(
                    "bad_frame", f"expected magic {MAGIC!r} v{VERSION}, got {magic!r} v{version}"
                )
            if header_len > MAX_HEADER_BYTES or payload_len > self.max_payload:
                raise FrameError(
                    "body_too_large",
                    f"frame declares a {header_len}-byte header and {payload_len}-byte payload; "
                    f"limits are {MAX_HEADER_BYTES} and {self.max_payload}",
                )
            total = PREFIX.size + header_len + payload_len
            if self._end - self._start < total:
                self._need = total
                return
            head = self._start + PREFIX.size
            body = head + header_len
            self._start += total
            self._need = 0
            yield kind, view[head:body], view[body : body + payload_len]
        self._need = 0


def decode_header(header: memoryview) -> Any:
    """A frame's JSON header. Raises ValueError (orjson's) if it is not JSON."""
    return orjson.loads(header)
