"""The fleet's pooled admin channel against real HTTP/1.1 servers on loopback (stdlib, threads).

What a rollback relies on: every worker's answer in fleet order, connections reused between
calls, a connection the server closed while idle retried on a fresh one, and a worker that is
down or silent answered for by name within the timeout, without holding up the others.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serving.admin_channel import PooledChannel


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: Server = self.server  # type: ignore[assignment]
        server.peers.add(self.client_address)
        if server.silent.is_set():
            server.release.wait(10)
        answer = b'{"port": %d, "got": %s, "auth": "%s"}' % (
            server.server_address[1],
            body or b"null",
            self.headers["Authorization"].encode(),
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.peers: set[tuple[str, int]] = set()
        self.silent, self.release = threading.Event(), threading.Event()

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a connection the test cut (the point of one test) is no error to print

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    running = [Server() for _ in range(3)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in running]
    for t in threads:
        t.start()
    yield running
    for s in running:
        s.release.set()
        s.shutdown()
        s.server_close()


def test_answers_come_back_in_fleet_order_over_connections_reused_between_calls(servers):
    channel = PooledChannel("secret")
    urls = [s.url for s in reversed(servers)]
    for _ in range(3):
        replies = channel.call_each(urls, "POST", "/admin/rollback", b'{"a": 1}', 5.0, {})
        assert [r.status for r in replies] == [200, 200, 200]
        assert [r.body.split(b",")[0] for r in replies] == [
            b'{"port": %d' % s.server_address[1] for s in reversed(servers)
        ]
        assert all(b'"got": {"a": 1}' in r.body and b"Bearer secret" in r.body for r in replies)
    assert [len(s.peers) for s in servers] == [1, 1, 1]  # one connection each, three calls
    channel.close()


def test_a_connection_the_worker_closed_while_idle_is_replaced_and_the_call_answered(servers):
    channel = PooledChannel("secret")
    urls = [s.url for s in servers]
    channel.call_each(urls, "POST", "/x", None, 5.0, {})
    for idle in channel._idle.values():  # the workers' keep-alive timeout closing them
        for sock in idle:
            sock.shutdown(socket.SHUT_RDWR)
    replies = channel.call_each(urls, "POST", "/x", None, 5.0, {})
    assert [r.status for r in replies] == [200, 200, 200]
    assert [len(s.peers) for s in servers] == [2, 2, 2]
    channel.close()


def test_a_worker_down_or_silent_is_answered_for_by_name_and_the_others_still_answer(servers):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"  # bound, not listening: refused
    servers[1].silent.set()
    channel = PooledChannel("secret")
    replies = channel.call_each([servers[0].url, servers[1].url, down], "POST", "/x", None, 0.5, {})
    assert replies[0].status == 200
    assert replies[1].status is None and "no answer within 0.5 s" in replies[1].error
    assert replies[2].status is None and "ECONNREFUSED" in replies[2].error
    servers[1].release.set()
    channel.close()


def test_only_plain_http_workers_are_spoken_to():
    with pytest.raises(ValueError, match="plain http only"):
        PooledChannel("t").call_each(["https://w1:8443"], "GET", "/admin/state", None, 1.0, {})
