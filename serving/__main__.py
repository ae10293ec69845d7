"""`python -m serving` (console script `relay-serve`): one serving worker, until SIGTERM/SIGINT.

Prints one line once both listeners accept connections:
    serving: listening on http://HOST:PORT binary tcp://HOST:PORT worker WORKER_ID
With port 0 the printed ports are the ones the OS picked.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Sequence

import uvicorn
import uvloop
from prometheus_client import disable_created_metrics
from pydantic import ValidationError

from logstore.log_tables import FEEDBACK, IMPRESSIONS, SHADOW_PAIRS, LogTable
from logstore.spool import INFERENCE_LOGS, RequestLogWriter
from logstore.writers import log_writer_for, writer_prefix
from model_store import open_store
from relay.errors import RelayError
from relay.settings import Settings, get_settings
from serving.binary import BinaryServer
from serving.feedback import FeedbackLog
from serving.http import build_app, server_config
from serving.metrics import ServingMetrics
from serving.routing import STABLE
from serving.schema import RequestRejected
from serving.worker import Worker

log = logging.getLogger("serving")


def build_log_writer(
    settings: Settings, table: LogTable = INFERENCE_LOGS
) -> RequestLogWriter | None:
    """Where a log table's rows go (`logstore.writers`); None with the request log switched off."""
    if not settings.serving_request_log:
        return None
    return log_writer_for(settings, table, writer_prefix())


def build_feedback_log(settings: Settings) -> FeedbackLog | None:
    """Impressions and feedback through the same durable path; off with the request log."""
    impressions = build_log_writer(settings, IMPRESSIONS)
    feedback = build_log_writer(settings, FEEDBACK)
    if impressions is None or feedback is None:
        return None
    # Feedback ids only need to be unique across workers and restarts, as segment ids are.
    return FeedbackLog(
        impressions, feedback, settings.serving_impression_sample_rate, writer_prefix()
    )


class Shutdown:
    """SIGTERM/SIGINT outside uvicorn's own handling: before it starts and after it returns.

    uvicorn re-raises the signal that stopped it once it has shut down; with this handler in
    place that re-raise is harmless, and the drain and log flush after it still run.
    """

    def __init__(self) -> None:
        self.requested = False
        self.server: uvicorn.Server | None = None

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True


async def serve(settings: Settings, shutdown: Shutdown) -> None:
    """Run the worker until told to exit, then drain and write every log row."""
    writer = build_log_writer(settings)
    feedback_log = build_feedback_log(settings)
    shadow_log = build_log_writer(settings, SHADOW_PAIRS)
    worker = Worker(
        settings,
        open_store(settings),
        ServingMetrics(),
        writer,
        feedback_log=feedback_log,
        shadow_log=shadow_log,
    )
    for log_writer in (writer, shadow_log):
        if log_writer is not None:
            log_writer.start()  # recovers stopped workers' write-ahead files first
    if feedback_log is not None:
        feedback_log.start()
    worker.start()
    binary = BinaryServer(worker, settings.serving_binary_idle_s)
    binary_port = await binary.start(settings.serving_host, settings.serving_binary_port)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.serving_host, settings.serving_port))
    sock.listen(2048)
    http_port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(build_app(worker)))
    shutdown.server = server
    server.should_exit = shutdown.requested
    http_task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if http_task.done():
            await http_task  # re-raises why uvicorn could not start
            return
        await asyncio.sleep(0.01)
    print(
        f"serving: listening on http://{settings.serving_host}:{http_port} "
        f"binary tcp://{settings.serving_host}:{binary_port} worker {worker.worker_id}",
        flush=True,
    )
    if settings.serving_stable_ref:
        asyncio.get_running_loop().create_task(_load_initial(worker, settings.serving_stable_ref))
    try:
        await http_task
    finally:
        await binary.close()
        await worker.close()
        log.info("worker %s stopped; request log flushed", worker.worker_id)


async def _load_initial(worker: Worker, ref: str) -> None:
    try:
        await worker.load(STABLE, ref)
    except RequestRejected as exc:
        log.error("could not load %r into stable at start: %s", ref, exc)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="relay-serve", description=__doc__.splitlines()[0])
    parser.add_argument("--host", help="interface to bind (RELAY_SERVING_HOST)")
    parser.add_argument("--port", type=int, help="HTTP port, 0 = any free (RELAY_SERVING_PORT)")
    parser.add_argument(
        "--binary-port", type=int, help="binary port, 0 = any free (RELAY_SERVING_BINARY_PORT)"
    )
    parser.add_argument("--stable", help="version or alias for stable (RELAY_SERVING_STABLE_REF)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "serving_host": args.host,
        "serving_port": args.port,
        "serving_binary_port": args.binary_port,
        "serving_stable_ref": args.stable,
    }
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = get_settings().model_copy(
            update={k: v for k, v in overrides.items() if v is not None}
        )
    except ValidationError as exc:  # a bad setting: say which, without a traceback
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        log.error("serving worker refused to start: %s", problems)
        return 2
    disable_created_metrics()  # *_created series double a scrape and nothing here reads them
    shutdown = Shutdown()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, shutdown)
    try:
        uvloop.run(serve(settings, shutdown))
    except (RelayError, OSError) as exc:
        log.error("serving worker failed: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
