"""The server child process (serve/server.py): a server that does not come
up, a request that fails, and nothing left behind when it stops. No vLLM:
a stand-in command plays the server."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from autoport_cst.serve import server as server_module
from autoport_cst.serve.server import Server, ServerError, _wait_healthy, free_port, post, stop


def _server(tmp_path, code: str) -> Server:
    log = tmp_path / "server.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Server(process, f"http://127.0.0.1:{free_port()}", log)


def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    server = _server(tmp_path, "import sys; print('ValueError: no entry for the port'); sys.exit(3)")
    with pytest.raises(ServerError, match="exited with code 3") as error:
        _wait_healthy(server, timeout=60)
    assert "no entry for the port" in str(error.value)


def test_a_server_that_never_answers_times_out_and_is_stopped(tmp_path):
    server = _server(tmp_path, "import time; time.sleep(600)")
    try:
        with pytest.raises(ServerError, match="did not come up within 2 s"):
            _wait_healthy(server, timeout=2)
    finally:
        stop(server, grace=5)
    assert server.process.poll() is not None


def test_a_failed_request_names_the_call(tmp_path):
    server = Server(
        subprocess.Popen([sys.executable, "-c", "pass"]), f"http://127.0.0.1:{free_port()}", tmp_path
    )
    server.process.wait()
    with pytest.raises(ServerError, match="POST /v1/completions failed"):
        post(server, "/v1/completions", {"prompt": "x"}, timeout=5)


def test_stopping_ends_the_servers_whole_session(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, time, pathlib; "
        f"child = subprocess.Popen(['sleep', '600']); pathlib.Path({str(pid_file)!r}).write_text(str(child.pid)); "
        "time.sleep(600)"
    )
    server = _server(tmp_path, code)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    stop(server, grace=5)
    time.sleep(0.5)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an ended child of an ended parent waits for init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_the_server_runs_vllms_openai_entry_point_on_loopback():
    command = server_module.server_command("/ckpt", 8123, ["--dtype", "float32"])
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
