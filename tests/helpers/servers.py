"""Servers the endpoint tests talk to: `transformers serve` on the built-in English model (a real
OpenAI-compatible server), and a socket that answers what no real server would (garbage, half an answer,
silence). All listen on 127.0.0.1 only; every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

STARTUP_S = 240  # the server imports transformers and loads the model first
# Eight short prompts in the built-in English model's own register, for every served-model test.
PROMPTS = [
    "The list of objects is",
    "Return a bool indicating whether",
    "def main",
    "The default value",
    "If the file",
    "This module provides",
    "Raise an error if",
    "The number of bytes",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def transformers_serve(model_path: Path, log: Path):
    """`transformers serve MODEL --continuous-batching` on the CPU; yields (url, process), stops it whatever
    happens (the whole process group: the server may start helpers)."""
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("transformers")),
        "serve",
        str(model_path),
        "--device",
        "cpu",
        "--continuous-batching",
        # A KV cache of 4096 tokens: by default it takes most of the machine's memory (14 GB here) and seconds to fill.
        "--cb-num-blocks",
        "128",
        "--cb-block-size",
        "32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, process, log)
        yield f"{url}/v1", process
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"transformers serve exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"transformers serve did not come up in {STARTUP_S} s")


@contextlib.contextmanager
def _serving(handle):
    """A listener on 127.0.0.1 handing each connection it accepts to `handle(connection, stopped)` on its accepting
    thread until the block ends (`stopped` is then set). Yields the API root's URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)  # a burst of a ladder level's connections: none dropped to a SYN retry
    listener.settimeout(0.2)
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            handle(connection, stopped)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stopped.set()
        thread.join(timeout=10)
        listener.close()


@contextlib.contextmanager
def raw_socket_server(answer, first: bool = False):
    """A socket on 127.0.0.1 that reads a request and sends `answer` as it is, then closes (None: never answers);
    `answer` may be a function of the request's bytes. With `first`, it sends before reading (a plain-text server
    to a TLS client). Yields (url, requests received)."""
    received: list[bytes] = []
    held: list[socket.socket] = []

    def handle(connection: socket.socket, stopped: threading.Event) -> None:
        connection.settimeout(5)
        if first and isinstance(answer, bytes):
            with contextlib.suppress(OSError):
                connection.sendall(answer)
        with contextlib.suppress(OSError):
            received.append(_read_request(connection))
        sent = answer(received[-1] if received else b"") if callable(answer) else answer
        if sent is None:
            held.append(connection)  # silence: keep it open, say nothing
            return
        with contextlib.suppress(OSError):
            connection.sendall(sent)
        connection.close()

    try:
        with _serving(handle) as url:
            yield url, received
    finally:
        for connection in held:
            connection.close()


def _read_request(connection: socket.socket) -> bytes:
    """The request's head and its body (as long as Content-Length says), or what came before the peer stopped."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = connection.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < min(length, 65536):
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def http_json(body: bytes) -> bytes:
    """An HTTP 200 answer carrying `body` as JSON, saying the connection closes after it (as `raw_socket_server`
    closes it): a client may otherwise send its next request down the closed connection, and on a busy machine
    it can be sent before the close is seen, failing as "closed before answering" instead of the fault under test."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
    return head % len(body) + body


@contextlib.contextmanager
def scripted_server(script):
    """A socket on 127.0.0.1 whose every connection is handed, after its request is read, to `script(connection,
    request, stopped)`, which sends what it likes, as slowly as it likes (each script bounds its own loop), on a
    thread of its own. Yields (url, requests received)."""
    received: list[bytes] = []

    def run(connection: socket.socket, stopped: threading.Event) -> None:
        with contextlib.suppress(OSError), connection:
            connection.settimeout(5)
            received.append(_read_request(connection))
            script(connection, received[-1], stopped)

    def handle(connection: socket.socket, stopped: threading.Event) -> None:
        threading.Thread(target=run, args=(connection, stopped), daemon=True).start()

    with _serving(handle) as url:
        yield url, received


# A models list and a completion in the OpenAI API's shapes, for the fake servers of fault tests.
MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
COMPLETION = (
    b'{"id": "x", "object": "text_completion", "created": 0, "model": "m", '
    b'"choices": [{"index": 0, "text": " ok", "finish_reason": "length", "logprobs": null}]}'
)
