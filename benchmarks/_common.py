"""What the benchmark scripts share: writing a results file, and the slow local HTTP server.

The scripts run as ``python benchmarks/<script>.py``, so this folder is on ``sys.path`` and
``from _common import ...`` finds this module (the peers' scripts have their own
``peers/common.py``, standard library only, for their own virtual environments).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path


def write_json(out: str | os.PathLike, result, *, indent: int = 2, echo: bool = True) -> Path:
    """Writes ``result`` as JSON (a trailing newline; values JSON does not know, such as a
    ``Path``, as ``str``) to ``out``, creating its folder: written whole or not at all (a
    temporary file renamed into place, :func:`shardkit.dataset.manifest.atomic_write_bytes`),
    so a killed run never leaves a truncated results file that looks complete. Prints
    ``wrote <out>`` when ``echo``. Returns ``out`` as a Path."""
    from shardkit.dataset.manifest import atomic_write_bytes

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(result, indent=indent, default=str) + "\n").encode())
    if echo:
        print(f"wrote {path}")
    return path


def slow_http_server(folder: str | os.PathLike, latency_ms: float, *,
                     head: bool = True):
    """A threading HTTP server of ``folder`` on a free port of 127.0.0.1 that answers every GET
    (and HEAD, with ``head``) after sleeping ``latency_ms`` milliseconds (a remote store's
    round trip, without an outside network). The caller runs ``serve_forever()`` and reads the port from
    ``server_address[1]``."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            time.sleep(latency_ms / 1e3)
            super().do_GET()

        def do_HEAD(self):
            if head:
                time.sleep(latency_ms / 1e3)
            super().do_HEAD()

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # the default 5 drops connections beyond it (1 s SYN retry)
        daemon_threads = True

    return Server(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
