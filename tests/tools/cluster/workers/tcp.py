"""A plain TCP transfer between two hosts, timed by the receiver.

Usage: python tcp.py serve PORT            accept one connection, read to the end, print JSON
       python tcp.py send HOST PORT BYTES  connect (retrying for 20 s while the server starts), send
The receiver prints {"bytes": N, "seconds": S, "peer": ADDRESS}, timing from the first byte to the
last; "ready" on stderr once it listens.
"""

import json
import socket
import sys
import time


def serve(port: int) -> None:
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(1)
        print("ready", file=sys.stderr, flush=True)
        conn, peer = server.accept()
        with conn:
            received, first = 0, None
            while chunk := conn.recv(1 << 20):
                first = first or time.monotonic()
                received += len(chunk)
            last = time.monotonic()
    print(json.dumps({"bytes": received, "seconds": last - (first or last), "peer": peer[0]}))


def send(host: str, port: int, size: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=20)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        block = b"\0" * (1 << 20)
        sent = 0
        while sent < size:
            sent += conn.send(block[: min(len(block), size - sent)])


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
