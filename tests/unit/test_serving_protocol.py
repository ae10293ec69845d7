"""The binary frame codec: framing across arbitrary chunking, growth, and unreadable streams."""

from __future__ import annotations

import numpy as np
import pytest

from serving.protocol import (
    MAX_HEADER_BYTES,
    PREFIX,
    FrameBuffer,
    FrameError,
    Kind,
    decode_header,
    encode_frame,
)


def feed(buffer: FrameBuffer, data: bytes, chunk: int) -> list[tuple[int, dict, bytes]]:
    """Push `data` through the buffer `chunk` bytes at a time, as a socket might deliver it."""
    out = []
    start = 0
    while start < len(data):
        view = buffer.writable()  # like recv_into: no more than the view holds
        piece = data[start : start + min(chunk, len(view))]
        view[: len(piece)] = piece
        buffer.advance(len(piece))
        start += len(piece)
        out += [(k, decode_header(h), bytes(p)) for k, h, p in buffer.frames()]
    return out


def frames_of(n: int) -> tuple[bytes, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    payloads = [rng.random((i % 7 + 1, 13)).astype("<f4") for i in range(n)]
    data = b"".join(
        encode_frame(Kind.PREDICT, {"id": i, "rows": len(p)}, p.tobytes())
        for i, p in enumerate(payloads)
    )
    return data, payloads


@pytest.mark.parametrize("chunk", [1, 5, 12, 100, 4096, 1 << 20])
def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive(chunk: int) -> None:
    data, payloads = frames_of(40)
    got = feed(FrameBuffer(max_payload=1 << 20, initial=64), data, chunk)
    assert [h["id"] for _, h, _ in got] == list(range(40))
    for (kind, _, payload), expected in zip(got, payloads, strict=True):
        assert kind == Kind.PREDICT
        np.testing.assert_array_equal(np.frombuffer(payload, "<f4").reshape(-1, 13), expected)


def test_buffer_grows_for_a_frame_larger_than_itself() -> None:
    big = np.arange(200_000, dtype="<f4")
    data = encode_frame(Kind.RESULT, {"id": 1}, big.tobytes())
    buffer = FrameBuffer(max_payload=1 << 21, initial=1024)
    (got,) = feed(buffer, data, 65_536)
    np.testing.assert_array_equal(np.frombuffer(got[2], "<f4"), big)
    assert buffer.pending == 0


def test_views_handed_out_stay_valid_while_the_buffer_compacts() -> None:
    data, _ = frames_of(3)
    buffer = FrameBuffer(max_payload=1 << 20, initial=64)
    kept = []
    for start in range(0, len(data), 7):
        view = buffer.writable()
        piece = data[start : start + 7]
        view[: len(piece)] = piece
        buffer.advance(len(piece))
        kept += list(buffer.frames())  # memoryviews held on purpose
    assert len(kept) == 3  # no BufferError from growing or compacting under exported views


def test_bad_magic_is_a_frame_error() -> None:
    buffer = FrameBuffer(max_payload=1024)
    data = b"GET / HTTP/1.1\r\n\r\n"
    with pytest.raises(FrameError) as info:
        feed(buffer, data, len(data))
    assert info.value.code == "bad_frame"


def test_oversized_declarations_are_refused_before_reading_the_body() -> None:
    buffer = FrameBuffer(max_payload=1024)
    prefix = PREFIX.pack(b"RL", 1, Kind.PREDICT, 10, 2048)
    with pytest.raises(FrameError) as info:
        feed(buffer, prefix, len(prefix))
    assert info.value.code == "body_too_large"
    prefix = PREFIX.pack(b"RL", 1, Kind.PREDICT, MAX_HEADER_BYTES + 1, 0)
    with pytest.raises(FrameError):
        feed(FrameBuffer(max_payload=1024), prefix, len(prefix))


def test_an_incomplete_frame_waits_for_the_rest() -> None:
    data = encode_frame(Kind.PING, {"id": 9})
    buffer = FrameBuffer(max_payload=1024)
    assert feed(buffer, data[:-1], 100) == []
    assert buffer.pending == len(data) - 1
    assert feed(buffer, data[-1:], 1) == [(Kind.PING, {"id": 9}, b"")]
