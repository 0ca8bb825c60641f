import gc
import inspect
import os
import tempfile
from pathlib import Path

import pytest

# Mixed lengths (1 to 69 tokens) so that padding shows; on CPU in bf16 some of them diverge.
MIXED_TEXTS = [
    "a",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "日本語のテキスト",
    "xxxxxxx",
    "Batched and single runs of the same text should give the same logits.",
]


def pytest_configure(config):
    # Textual's pilot waits after each key press until the process has been idle for one sleep of this length
    # (20 ms by default), twice; the wait that orders the test after the app is its wait for every queued message
    # to be handled, which this leaves as it is. Shorter idle checks: a key press costs ~20 ms instead of ~60.
    import textual._wait

    textual._wait.SLEEP_GRANULARITY = 0.005
    # A test process holds torch, transformers and the caches of every app it ran (Textual keeps rendered lines of
    # up to a thousand widgets in module-level caches): a full collection walks ~600k objects (~0.25 s), and at
    # Python's default it ran every few seconds. A tenth as often, as in the app's own process.
    from batchtui.tui.launcher import fewer_full_collections

    fewer_full_collections()
    # One fresh model cache per test session (subprocesses inherit it); never the network.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="batchtui-test-cache-")
    os.environ["HF_HUB_OFFLINE"] = "1"
    # The mode's compiled kernels built into that cache now, once a process (and found there by the commands the
    # tests start), not inside the first test that needs them, whose output would hold the build's notice.
    import torch

    from batchtui.core.invariant.compiled_kernels import compiled_linear

    compiled_linear(torch.zeros(1))
    if not torch.cuda.is_available():  # the mode's Triton kernels in Triton's interpreter (read at triton's import)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _launch_vllm(config)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # Parallel workers share the cores: one kernel thread each (and in the commands they start), or torch's
        # spinning threads would fight over them.
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


# Fixtures that start a real server: a test taking one is `served` (the tiers are derived, never listed by hand).
SERVER_FIXTURES = {"server", "served", "vllm"}
VLLM_TESTS_MARKS = ({"served"}, {"served", "app"})  # the marks tests/endpoint/test_vllm.py's tests carry


def pytest_collection_modifyitems(config, items):
    """The tiers: `served` from a test's fixtures, `app` from its being a coroutine (the app's pilot) or taking a
    snapshot; `slow` and `cpu_kernels` are marked where the tests are written."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SERVER_FIXTURES:
            item.add_marker(pytest.mark.served)
        if inspect.iscoroutinefunction(getattr(item, "function", None)) or "snap_compare" in fixtures:
            item.add_marker(pytest.mark.app)


def _runs_vllm_tests(config) -> bool:
    """Whether the run's paths include the tests that need vLLM (the whole suite, or test_vllm.py), and its marker
    expression does not leave the served tests out."""
    if config.option.collectonly:
        return False
    if config.option.markexpr:  # does the expression select one of vLLM's tests (`served`, one also `app`)?
        from _pytest.mark.expression import Expression

        selects = Expression.compile(config.option.markexpr).evaluate
        if not any(selects(lambda name, marks=marks, **_: name in marks) for marks in VLLM_TESTS_MARKS):
            return False
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path.is_dir() and next(path.rglob("test_vllm.py"), None) is not None:
            return True
        if path.name == "test_vllm.py":
            return True
    return False


def _launch_vllm(config) -> None:
    """In the run's first process only (not in xdist's workers): vLLM's minutes of setting up overlap the tests."""
    if hasattr(config, "workerinput") or not _runs_vllm_tests(config):
        return
    from helpers.vllm_server import launch

    from batchtui.core.models.builtin import builtin_path

    config._vllm_state = tempfile.mkdtemp(prefix="batchtui-vllm-")
    launch(Path(config._vllm_state), builtin_path("qwen2-english-4m"))


def pytest_unconfigure(config):
    state = getattr(config, "_vllm_state", None)
    if state is not None:
        from helpers.vllm_server import shut_down

        shut_down(Path(state))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores this process may use. A worker spends part of its time waiting on
    the commands, apps and servers its tests start (their CPU is on another core): with a worker per core, a core
    sat idle then (on 2 cores the whole run took 123.7 and 128.3 s, with 3 workers 116.6 and 117.8 s, the same CPU
    time). PYTEST_XDIST_AUTO_NUM_WORKERS, where set, decides as in pytest-xdist."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return len(os.sched_getaffinity(0)) + 1


@pytest.fixture(scope="session")
def tiny_path():
    from batchtui.core.models.builtin import builtin_path

    return builtin_path("tiny")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tiny_path, worker_id):
    """The tiny seeded checkpoint of every architecture of the matrix, by name: written once for the whole run,
    the parallel workers sharing their run's folder (the first to take the lock writes them)."""
    from filelock import FileLock
    from helpers.architectures import CHECKPOINTS, build

    # Each worker's base folder sits in the run's own; a run without workers has only its base folder.
    root = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    folder = root / "architectures"
    with FileLock(str(root / "architectures.lock")):
        if not (folder / "written").exists():
            for name in CHECKPOINTS:
                build(name, folder / name, tiny_path)
            (folder / "written").touch()
    return {name: folder / name for name in CHECKPOINTS}


@pytest.fixture
def broken(tmp_path, tiny_path):
    """Checkpoints a run must refuse, by the name a test gives them: an encoder, a tokenizer without pad or eos,
    a tokenizer with more tokens than the embedding has rows."""
    from helpers.bad_models import embedding_shorter_than_tokenizer, not_a_causal_lm, tokenizer_without_pad_or_eos

    return {
        "not-causal": str(not_a_causal_lm(tmp_path / "bert")),
        "no-pad-no-eos": str(tokenizer_without_pad_or_eos(tiny_path, tmp_path / "nopad")),
        "short-embedding": str(embedding_shorter_than_tokenizer(tiny_path, tmp_path / "short")),
    }


def pytest_collection_finish(session):
    # What is alive once the tests are collected (modules, classes) lives as long as the process: out of the
    # collector's walks.
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session):
    # pytest ends a session with five full collections in a row, to report exceptions raised in finalizers: each
    # walks everything a worker holds (~0.35 s). One walk finds the garbage; the rest then walk nothing.
    gc.collect()
    gc.freeze()
