"""A real uvicorn server for an ASGI app on a free 127.0.0.1 port, in a daemon thread: what the
HTTP doubles of the engine tests run on."""

from __future__ import annotations

import socket
import threading
import time


class ThreadedServer:
    """``ThreadedServer(app)`` is serving once constructed; ``stop()`` shuts it down."""

    def __init__(self, app, start_timeout_s: float = 20.0) -> None:
        import uvicorn  # here, so a test module's importorskip of it still skips first

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port: int = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + start_timeout_s
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
