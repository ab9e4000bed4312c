"""TEST SERVER: a server whose helper escapes and re-forks itself on SIGTERM.

``python forking_helper.py PIDS_FILE``: answers ``GET /health`` on ``--port`` (0: any; the port
is printed), and on start spawns a helper in its own session (``setsid``). The helper appends
its pid to PIDS_FILE and, on SIGTERM, forks a fresh copy of itself (which appends its pid and
does the same) before the old copy exits: a teardown that stops looking at SIGTERM leaves one
alive. Only SIGKILL ends it.
"""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import time


def helper(pids_file: str) -> None:
    def note() -> None:
        with open(pids_file, "a", encoding="ascii") as handle:
            handle.write(f"{os.getpid()}\n")

    def on_term(_signum: int, _frame: object) -> None:
        if os.fork() == 0:  # the copy: same handler, same file
            note()
            return
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    note()
    while True:
        time.sleep(0.1)


def main() -> None:
    pids_file = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--helper":
        helper(pids_file)
        return
    subprocess.Popen(
        [sys.executable, __file__, pids_file, "--helper"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    print(f"serving on port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
