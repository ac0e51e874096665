"""A real HTTP server on 127.0.0.1 serving a directory with HEAD and Range support.

`failures[path] = n` makes the next n requests for that path answer 503 (retry tests);
`short[path] = True` makes GETs return one byte less than asked (short-read tests).
"""

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class ServerControl:
    root: Path
    failures: dict[str, int] = field(default_factory=dict)
    short: dict[str, bool] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""


def _handler(control: ServerControl) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def _file(self) -> Path | None:
            path = (control.root / self.path.lstrip("/")).resolve()
            return path if path.is_file() and control.root in path.parents else None

        def _fail_if_asked(self) -> bool:
            left = control.failures.get(self.path, 0)
            if left:
                control.failures[self.path] = left - 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True
            return False

        def do_HEAD(self) -> None:
            control.requests.append(("HEAD", self.path, None))
            if self._fail_if_asked():
                return
            file = self._file()
            if file is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(file.stat().st_size))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()

        def do_GET(self) -> None:
            ranges = self.headers.get("Range")
            control.requests.append(("GET", self.path, ranges))
            if self._fail_if_asked():
                return
            file = self._file()
            if file is None:
                self.send_error(404)
                return
            data = file.read_bytes()
            match = re.fullmatch(r"bytes=(\d+)-(\d+)", ranges or "")
            if match is None:
                status, body = 200, data
            else:
                start, end = int(match.group(1)), int(match.group(2))
                status, body = 206, data[start : end + 1]
                if control.short.get(self.path):
                    body = body[:-1]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def serve_directory(root: Path) -> Iterator[ServerControl]:
    control = ServerControl(root.resolve())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(control))
    control.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield control
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
