"""How the fleet client reaches every worker's admin API at once: pooled keep-alive connections.

Taking a canary out of 32 workers is 32 small HTTP calls that must all land within tens of
milliseconds, from a release process whose other threads are busy. Measured on 32 loopback
workers (2 cores, bench.rollback): one httpx client per worker, called from a thread pool, took
p50 72 ms warm and over 2 s cold (each `httpx.Client` builds its own SSL context, ~30 ms); httpx's
AsyncClient and httpcore's async pool spent ~3 ms of client CPU per call (p50 96-120 ms for 32);
the workers themselves answer a rollback in ~0.4 ms. So the calls go out here from one thread:
every request written first, then all answers read as they arrive (`selectors`), over
connections kept open between calls (the canary's lease renewals keep them warm), answers parsed
by httptools (the C parser the workers' uvicorn uses). A pooled connection that the worker closed
meanwhile is noticed before use or, at the latest, when it answers nothing: the call is retried
once on a fresh connection. Only `http://` workers: for `https://` the fleet client uses httpx.

`HttpxCalls` is the other implementation of the same narrow interface (`AdminCalls`): any httpx
transport (tests pass `httpx.MockTransport`), and https.
"""

from __future__ import annotations

import errno
import select
import selectors
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httptools
import httpx


@dataclass(frozen=True)
class Reply:
    """One worker's raw answer: its status and body, or why there is none."""

    status: int | None  # None: no answer (unreachable, timed out, not HTTP)
    body: bytes = b""
    error: str = ""  # why there is no answer


class AdminCalls(Protocol):
    """The one thing the fleet client needs: the same call on many workers, answers in order."""

    def call_each(
        self,
        urls: Sequence[str],
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        headers: Mapping[str, str],
    ) -> list[Reply]: ...

    def close(self) -> None: ...


class HttpxCalls:
    """`AdminCalls` over one httpx client (one pool, one SSL context), threads for the fan-out."""

    def __init__(self, token: str, transport: httpx.BaseTransport | None = None) -> None:
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
        )

    def call_each(
        self,
        urls: Sequence[str],
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        headers: Mapping[str, str],
    ) -> list[Reply]:
        from concurrent.futures import ThreadPoolExecutor

        def one(url: str) -> Reply:
            try:
                response = self._client.request(
                    method,
                    url + path,
                    content=body,
                    headers={**headers, "Content-Type": "application/json"},
                    timeout=timeout_s,
                )
            except httpx.HTTPError as exc:
                return Reply(None, error=f"{type(exc).__name__}: {exc}")
            return Reply(response.status_code, response.content)

        with ThreadPoolExecutor(max_workers=len(urls)) as pool:
            return list(pool.map(one, urls))

    def close(self) -> None:
        self._client.close()


@dataclass(eq=False)
class _Exchange:
    """One request on one connection, and its answer as httptools parses it."""

    key: tuple[str, int]
    request: bytes
    sock: socket.socket | None = None
    reused: bool = False
    connecting: bool = False
    sent: int = 0
    received: bool = False  # any byte of the answer
    complete: bool = False
    status: int | None = None
    keep_alive: bool = False
    chunks: list[bytes] = field(default_factory=list)
    error: str = ""
    parser: httptools.HttpResponseParser | None = None

    def on_headers_complete(self) -> None:
        # Read here: once the message is complete the parser has already reset these.
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class PooledChannel:
    """`AdminCalls` over raw keep-alive HTTP/1.1 connections, all calls driven from one thread.

    Thread-safe: each call takes its connections out of the pool and puts back only those that
    ended a complete, keep-alive answer, so two threads (a lease renewal, a rollback) never share
    one. Idle connections stay open until `close`.
    """

    def __init__(self, token: str) -> None:
        self._auth = f"Bearer {token}"
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def call_each(
        self,
        urls: Sequence[str],
        method: str,
        path: str,
        body: bytes | None,
        timeout_s: float,
        headers: Mapping[str, str],
    ) -> list[Reply]:
        deadline = time.monotonic() + timeout_s
        exchanges = [self._exchange(url, method, path, body, headers) for url in urls]
        with selectors.DefaultSelector() as selector:
            for ex in exchanges:
                self._start(ex, selector, fresh=False)
            while selector.get_map() and (left := deadline - time.monotonic()) > 0:
                for key, events in selector.select(left):
                    self._step(key.data, events, selector)
            for ex in exchanges:
                if not ex.complete and not ex.error:
                    ex.error = f"no answer within {timeout_s:g} s"
                    self._drop(ex, selector)
        return [self._reply(ex) for ex in exchanges]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for sock in socks:
                sock.close()

    # -- one exchange ----------------------------------------------------------------------------
    def _exchange(
        self, url: str, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> _Exchange:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"the pooled admin channel speaks plain http only, got {url!r}")
        port = parts.port or 80
        payload = body or b""
        lines = [
            f"{method} {parts.path.rstrip('/')}{path} HTTP/1.1",
            f"Host: {parts.netloc}",
            f"Authorization: {self._auth}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload
        return _Exchange((parts.hostname, port), request)

    def _start(self, ex: _Exchange, selector: selectors.BaseSelector, fresh: bool) -> None:
        """Take a pooled connection (unless `fresh`) or open one; register it to send."""
        ex.parser = httptools.HttpResponseParser(ex)
        ex.sent, ex.received, ex.chunks = 0, False, []
        ex.status, ex.keep_alive, ex.complete = None, False, False
        sock = None if fresh else self._checkout(ex.key)
        ex.reused = sock is not None
        if sock is None:
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
                code = sock.connect_ex(_address(ex.key))
            except OSError as exc:
                ex.error = f"unreachable: {exc}"
                return
            if code not in (0, errno.EINPROGRESS):
                sock.close()
                ex.error = f"unreachable: {errno.errorcode.get(code, code)}"
                return
            ex.connecting = code == errno.EINPROGRESS
        ex.sock = sock
        selector.register(sock, selectors.EVENT_WRITE, ex)

    def _step(self, ex: _Exchange, events: int, selector: selectors.BaseSelector) -> None:
        assert ex.sock is not None
        try:
            if ex.connecting:
                code = ex.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, errno.errorcode.get(code, str(code)))
                ex.connecting = False
            if events & selectors.EVENT_WRITE:
                ex.sent += ex.sock.send(ex.request[ex.sent :])
                if ex.sent == len(ex.request):
                    selector.modify(ex.sock, selectors.EVENT_READ, ex)
                return
            data = ex.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._failed(ex, selector, f"{type(exc).__name__}: {exc}")
            return
        if not data:
            self._failed(ex, selector, "the worker closed the connection before answering")
            return
        ex.received = True
        assert ex.parser is not None
        try:
            ex.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._failed(ex, selector, f"not an HTTP answer: {exc}")
            return
        if ex.complete:
            selector.unregister(ex.sock)
            if ex.keep_alive:
                self._checkin(ex.key, ex.sock)
            else:
                ex.sock.close()
            ex.sock = None

    def _failed(self, ex: _Exchange, selector: selectors.BaseSelector, why: str) -> None:
        """A pooled connection that died before any answer is retried once on a fresh one."""
        retry = ex.reused and not ex.received
        self._drop(ex, selector)
        if retry:
            self._start(ex, selector, fresh=True)
        else:
            ex.error = why

    def _drop(self, ex: _Exchange, selector: selectors.BaseSelector) -> None:
        if ex.sock is not None:
            selector.unregister(ex.sock)
            ex.sock.close()
            ex.sock = None

    def _reply(self, ex: _Exchange) -> Reply:
        if ex.complete and ex.status is not None:
            return Reply(ex.status, b"".join(ex.chunks))
        return Reply(None, error=ex.error or "no answer")

    # -- the pool --------------------------------------------------------------------------------
    def _checkout(self, key: tuple[str, int]) -> socket.socket | None:
        """An idle connection the worker has not closed meanwhile, or None."""
        while True:
            with self._lock:
                socks = self._idle.get(key)
                if not socks:
                    return None
                sock = socks.pop()
            # Readable while idle means the worker closed it (or sent what nobody asked for).
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return sock
            sock.close()

    def _checkin(self, key: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(key, []).append(sock)
                return
        sock.close()


def _address(key: tuple[str, int]) -> tuple[str, int]:
    """IPv4 address of a worker (resolved each time: a worker's host may move)."""
    host, port = key
    info = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    return str(info[0][4][0]), port
