"""``disque-trio worker MODULE:ATTRIBUTE``: load a Worker and run it."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from .context import log
from .logs import JsonLogFormatter
from .worker import Worker

WORKER_USAGE = "disque-trio worker MODULE:ATTRIBUTE [options]"


def _load(target: str) -> Worker:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise SystemExit(f"worker: expected MODULE:ATTRIBUTE, got {target!r}")
    module = importlib.import_module(module_name)
    obj: object = module
    for part in attribute.split("."):
        obj = getattr(obj, part)
    if callable(obj) and not isinstance(obj, Worker):
        obj = obj()  # a factory
    if not isinstance(obj, Worker):
        raise SystemExit(
            f"worker: {target} is a {type(obj).__name__}, not a disque_trio.worker.Worker"
        )
    return obj


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="disque-trio worker",
        usage=WORKER_USAGE,
        description="Run the handlers of a disque_trio.worker.Worker until SIGTERM or SIGINT.",
    )
    parser.add_argument("target", help="where the Worker is: package.module:attribute")
    parser.add_argument(
        "--nodes", help="node URLs, replacing the Worker's: disque://host:port,..."
    )
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    parser.add_argument("--threads", type=int, help="thread pool size for plain functions")
    parser.add_argument("--shutdown-timeout", type=float, help="seconds handlers get at a stop")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    parser.add_argument("--metrics-host", help="address for the metrics port (127.0.0.1)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="info by default; a job done is logged at debug (docs/worker.md)",
    )
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    parser.add_argument(
        "--path",
        default=".",
        help="directory to import the module from (default: the current one)",
    )
    return parser


def _configure(worker: Worker, args: argparse.Namespace) -> None:
    """The command line's settings over the Worker's own."""
    if args.nodes:
        worker.nodes = args.nodes
    if args.threads is not None:
        worker.threads = args.threads
    if args.shutdown_timeout is not None:
        worker.shutdown_timeout = args.shutdown_timeout
    if args.metrics_port is not None:
        worker.metrics_port = args.metrics_port
    if args.metrics_host:
        worker.metrics_host = args.metrics_host


def main(argv: Sequence[str]) -> int:
    """``disque-trio worker``: load a Worker and run it until a signal."""
    args = _parser().parse_args(list(argv))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLogFormatter()
        if args.log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(args.log_level.upper())
    sys.path.insert(0, os.path.abspath(args.path))
    try:
        worker = _load(args.target)
    except (ImportError, AttributeError) as e:
        print(f"worker: cannot load {args.target}: {e}", file=sys.stderr)
        return 1
    _configure(worker, args)
    try:
        worker.run_sync(args.backend)
    except (RuntimeError, ValueError, OSError) as e:
        log.error("worker: %s", e)
        return 1
    return 0
