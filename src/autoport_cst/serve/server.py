"""The vLLM OpenAI API server as a child process on 127.0.0.1, and the few
HTTP calls the smoke battery makes to it (standard library only).

The server runs in a session of its own, so that stopping it ends the
engine processes it started too (SIGTERM to the session's process group,
SIGKILL after a grace period): nothing is left behind, whether the battery
passed, failed or was interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


class ServerError(RuntimeError):
    """The server did not come up, or a request to it failed."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path
    startup_seconds: float = 0.0

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def server_command(checkpoint: str, port: int, options: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        checkpoint,
        "--host",
        HOST,
        "--port",
        str(port),
        *options,
    ]


def _wait_healthy(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(
                f"the server exited with code {server.process.returncode} before it came up; "
                f"its log ({server.log}) ends:\n{server.tail()}"
            )
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(1.0)
    raise ServerError(
        f"the server did not come up within {timeout:.0f} s; its log ({server.log}) ends:\n{server.tail()}"
    )


def stop(server: Server, grace: float = 30.0) -> None:
    """End the server and every process of its session."""
    if server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(10)


@contextlib.contextmanager
def running_server(
    checkpoint: str, options: list[str], log: Path, env: dict[str, str], timeout: float
) -> Iterator[Server]:
    """A server up and healthy for the block, stopped after it."""
    port = free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(
            server_command(checkpoint, port, options),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    server = Server(process, f"http://{HOST}:{port}", log)
    try:
        _wait_healthy(server, timeout)
        server.startup_seconds = time.perf_counter() - start
        yield server
    finally:
        stop(server)


def post(server: Server, path: str, body: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise ServerError(f"POST {path} failed: HTTP {error.code}: {detail}") from error
    except (OSError, urllib.error.URLError) as error:
        raise ServerError(f"POST {path} failed: {error}") from error


def post_stream(
    server: Server, path: str, body: dict[str, Any], timeout: float = 300.0
) -> list[dict[str, Any]]:
    """The server-sent events of a streamed request, with the arrival time of
    each (``_t``, seconds since the request was sent)."""
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    events, start = [], time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data:") :])
                event["_t"] = time.perf_counter() - start
                events.append(event)
    except urllib.error.HTTPError as error:
        raise ServerError(f"POST {path} (stream) failed: HTTP {error.code}") from error
    except (OSError, urllib.error.URLError) as error:
        raise ServerError(f"POST {path} (stream) failed: {error}") from error
    return events


def metrics(server: Server) -> dict[str, float]:
    """The server's Prometheus counters and gauges, summed over labels."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        with contextlib.suppress(ValueError):
            values[name] = values.get(name, 0.0) + float(value)
    return values
