"""A low-priority sibling process that turns a worker's sealed write-ahead files into segments.

Turning a rotated write-ahead file into a segment (building the Arrow table, LZ4, fsync) ran on
the writer's thread inside the serving worker, holding the worker's GIL for milliseconds at
each rotation: the requests that arrived then waited, and at 2,000 req/s they were most of the
P95 (docs/serving.md). A lower-priority *thread* does not help: it keeps the GIL while the
kernel has it waiting, and the event loop waits too. A process has no GIL to share, and the
kernel gives the serving threads the core the moment they wake.

The protocol is one request at a time over a Unix socket pair. The worker's writer thread
sends a sealed file's descriptor (SCM_RIGHTS) with its segment id, table and length, and blocks
(without the GIL) until the segmenter answers `ok <rows>` or `err <reason>`. The descriptor
shares the worker's open file, and so its `flock`: the file stays locked while either process
holds it, so no recoverer (`logstore.ingest.recover_wals`) can take the file while the segment
is half-written, even if the worker dies meanwhile. The worker keeps the file's rows in memory
until the answer: on `err`, a row count that does not match, or a segmenter that died or hung,
it writes the segment itself, as before, and starts a new segmenter later. Exactly-once
ingestion rests on the same rule as before: a segment whose write-ahead file still exists is
never ingested, and a file whose segment exists is only deleted.

The segmenter exits when the worker's end of the socket closes, however the worker died. One
segmenter serves every log writer of a worker process (its requests, impressions, feedback
and shadow pairs), one file at a time. It runs at `NICE` and inherits the worker's CPUs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from logstore.log_tables import FEEDBACK, IMPRESSIONS, SHADOW_PAIRS, USER_SESSIONS, LogTable
from logstore.segments import (
    INFERENCE_LOGS,
    SEGMENT_SUFFIX,
    decode_records,
    stored_form,
    write_segment,
)
from logstore.segments import log as spool_log

TABLES: dict[str, LogTable] = {
    t.name: t for t in (INFERENCE_LOGS, IMPRESSIONS, FEEDBACK, SHADOW_PAIRS, USER_SESSIONS)
}
# The kernel's weight for nice 10 is a tenth of nice 0's: a woken serving thread takes the core
# at once, and a saturated worker still leaves the segmenter about a tenth of it, enough for
# its rows (bench.serving's worker scenario, docs/serving.md) instead of starving it.
NICE = 10
REPLY_TIMEOUT_S = 60.0  # a file's segment takes milliseconds; this long means it hangs
RESTART_AFTER_S = 5.0  # after a segmenter is lost, the worker writes segments itself this long
_MESSAGE_BYTES = 64 << 10


class Segmenter:
    """The worker's end: starts the sibling process on first use and hands it sealed files.

    Thread-safe: each log writer's thread calls `segment` and waits its turn.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lost_at: float | None = None
        self.segmented = 0  # files it turned into segments
        self.fallbacks = 0  # files it could not, which the worker's writer wrote instead

    def segment(
        self, directory: Path, table: LogTable, segment_id: str, fd: int, used: int, rows: int
    ) -> bool:
        """Have the segmenter write `segment_id`'s segment from the file behind `fd`.

        True once the segment is written (fsynced and renamed) holding `rows` rows; False when
        the caller must write it itself: the segmenter failed, died, hung or is restarting.
        """
        with self._lock:
            sock = self._connected()
            if sock is None:
                self.fallbacks += 1
                return False
            request = orjson.dumps(
                {"dir": str(directory), "table": table.name, "id": segment_id, "used": used}
            )
            try:
                socket.send_fds(sock, [request], [fd])
                reply = sock.recv(_MESSAGE_BYTES)
            except OSError as exc:  # TimeoutError included: a hung segmenter is a lost one
                self._lose(f"{type(exc).__name__}: {exc}")
                self.fallbacks += 1
                return False
            if not reply:
                self._lose("it exited")
                self.fallbacks += 1
                return False
            status, _, detail = reply.decode(errors="replace").partition(" ")
            if status == "ok" and detail == str(rows):
                self.segmented += 1
                return True
            # The worker rewrites the segment from memory: its write-ahead file still exists,
            # so no ingester has taken the segmenter's version meanwhile.
            spool_log.error(
                "log segmenter could not segment %s (%s rows expected): %s; the worker writes it",
                segment_id,
                rows,
                reply.decode(errors="replace"),
            )
            self.fallbacks += 1
            return False

    def close(self) -> None:
        """Stop the segmenter: it sees the socket close, finishes nothing pending, and exits."""
        with self._lock:
            self._stop()

    def _connected(self) -> socket.socket | None:
        if self._sock is not None and self._process is not None and self._process.poll() is None:
            return self._sock
        if self._sock is not None:
            self._lose(f"it exited with {self._process.returncode if self._process else '?'}")
        if self._lost_at is not None and time.monotonic() - self._lost_at < RESTART_AFTER_S:
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "logstore.segmenter", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # a worker's stdout is its listening line's pipe
            )
        except OSError as exc:
            ours.close()
            self._lose(f"cannot start it: {exc}")
            return None
        finally:
            theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        self._sock, self._lost_at = ours, None
        return ours

    def _lose(self, why: str) -> None:
        spool_log.error(
            "log segmenter lost (%s): the worker writes its own segments for %.0f s, then "
            "starts a new segmenter",
            why,
            RESTART_AFTER_S,
        )
        self._stop(kill=True)
        self._lost_at = time.monotonic()

    def _stop(self, kill: bool = False) -> None:
        sock, self._sock = self._sock, None
        process, self._process = self._process, None
        if sock is not None:
            sock.close()
        if process is not None:
            if kill:
                process.kill()  # it must be gone before the worker writes its segment
            try:
                process.wait(timeout=REPLY_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


_shared: Segmenter | None = None
_shared_lock = threading.Lock()


def shared_segmenter() -> Segmenter:
    """This process's segmenter, for every log writer in it (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Segmenter()
        return _shared


def segment_file(request: dict[str, object], fd: int) -> int:
    """Write the segment of the sealed file behind `fd`; its row count."""
    table = TABLES[str(request["table"])]
    used = int(str(request["used"]))
    data = bytearray()
    while len(data) < used:
        chunk = os.pread(fd, used - len(data), len(data))
        if not chunk:
            raise ValueError(f"the file ends after {len(data)} of its {used} bytes")
        data += chunk
    rows, parts, torn = decode_records(bytes(data), table)
    if torn:  # a sealed file's records are all complete: anything else is a bug, never dropped
        raise ValueError(f"{torn} bytes of its records do not decode")
    stored = stored_form(rows, parts, table)
    write_segment(Path(str(request["dir"])), f"{request['id']}{SEGMENT_SUFFIX}", stored, table)
    return len(rows) + sum(p.num_rows for p in parts)


def serve(sock: socket.socket) -> None:
    """Segment each file the worker sends, answering each, until the worker closes the socket."""
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
        except ConnectionResetError:
            return
        if not message:
            return  # the worker closed its end, or died
        try:
            if len(fds) != 1:
                raise ValueError(f"expected one file descriptor, got {len(fds)}")
            reply = f"ok {segment_file(orjson.loads(message), fds[0])}"
        except Exception as exc:  # answered, so the worker writes this segment itself
            reply = f"err {type(exc).__name__}: {exc}"
        finally:
            for fd in fds:
                os.close(fd)  # releases the file's lock, if the worker has died meanwhile
        try:
            sock.send(reply.encode()[:_MESSAGE_BYTES])
        except (BrokenPipeError, ConnectionResetError):
            return


def main() -> None:
    # Ctrl-C reaches the whole process group: the worker stops first, closing the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(NICE)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    serve(socket.socket(fileno=int(sys.argv[1])))


if __name__ == "__main__":
    main()
