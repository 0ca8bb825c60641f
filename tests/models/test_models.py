"""Loading: built-in models through from_pretrained, reuse, trust_remote_code off by default."""

import json
import subprocess

import pytest
import transformers

from batchtui.core import Settings
from batchtui.core.models.builtin import BUILTIN_MODELS, builtin_path, cache_root
from batchtui.core.models.loading import load_model


def test_builtin_tiny_is_written_once_under_xdg_cache(tiny_path):
    assert tiny_path.parent == cache_root()
    assert str(tiny_path).startswith(__import__("os").environ["XDG_CACHE_HOME"])
    stamp = (tiny_path / "model.safetensors").stat().st_mtime_ns
    assert builtin_path("tiny") == tiny_path
    assert (tiny_path / "model.safetensors").stat().st_mtime_ns == stamp
    assert json.loads((tiny_path / "config.json").read_text())["model_type"] == "qwen2"


def test_qwen_shape_config_has_the_real_dimensions():
    config = BUILTIN_MODELS["tiny-qwen2.5-1.5b-shape"].config
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (1536, 28, 151936)


def test_loaded_model_is_reused_and_trust_remote_code_is_off(monkeypatch):
    seen = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    first = load_model(Settings(model="tiny", dtype="float32", attn="eager"))
    assert load_model(Settings(model="tiny", dtype="float32", attn="eager", batch_size=3, top_k=2)) is first
    assert seen == [False]
    load_model(Settings(model="tiny", dtype="float32", attn="eager", trust_remote_code=True))
    assert seen == [False, True]
    assert first.attn == "eager" and first.dtype == "float32" and first.pad_token_id == 256


def test_tokenizer_without_pad_token_pads_with_eos_and_says_so(tiny_path, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from batchtui.core import compare

    local = tmp_path / "no-pad"
    shutil.copytree(tiny_path, local)
    tokenizer = AutoTokenizer.from_pretrained(local)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(local)
    assert AutoTokenizer.from_pretrained(local).pad_token is None
    result = compare(["short", "a longer text"], Settings(model=str(local)))
    assert result.config["pad_token_id"] == 258  # <|im_end|>, the eos token
    assert any("no pad token" in note and "<|im_end|>" in note for note in result.notes)


def test_device_map_loads_through_accelerate_and_gives_the_same_numbers():
    from batchtui.core import compare

    texts = ["short", "a longer text with padding"]
    plain = compare(texts, Settings(model="tiny", dtype="float32", modules=True))
    sharded = compare(texts, Settings(model="tiny", dtype="float32", modules=True, device_map="auto"))
    assert sharded.config["device_map"] == "auto" and sharded.config["device"] == "cpu"
    assert [t.max_abs_diff for t in sharded.texts] == [t.max_abs_diff for t in plain.texts]
    assert [t.modules for t in sharded.texts] == [t.modules for t in plain.texts]


def finished(process: subprocess.Popen, timeout: float = 90) -> subprocess.CompletedProcess:
    """A started process waited for, with its output."""
    stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.slow
def test_with_the_hub_unreachable_a_cached_hub_id_loads_at_once_and_one_not_cached_says_so(tmp_path):
    """A hub that answers nothing (it closes every connection): a hub id in the local cache loads from it after
    one request, not after huggingface_hub's retries for every file (minutes); one not cached fails after one, with
    the reason. The hub's address is read when huggingface_hub is imported: each run is a process of its own."""
    import os
    import shutil
    import sys

    from helpers.servers import raw_socket_server

    repo = tmp_path / "huggingface" / "hub" / "models--someone--tiny"
    shutil.copytree(builtin_path("tiny"), repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    with raw_socket_server(b"") as (url, received):
        env["HF_ENDPOINT"] = url.removesuffix("/v1")
        # Both at once: each is a process of its own, mostly importing, and the test waits for the slower only.
        started = {
            model: subprocess.Popen(
                [sys.executable, "-m", "batchtui.core", "check", "--model", model, "a"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for model in ("someone/tiny", "someone/absent")
        }
        try:
            runs = {model: finished(process) for model, process in started.items()}
        finally:
            for process in started.values():
                process.kill()
    assert runs["someone/tiny"].returncode == 0 and "OK: all 1 texts allclose" in runs["someone/tiny"].stdout
    assert runs["someone/absent"].returncode == 2
    assert runs["someone/absent"].stderr.strip() == (
        "batchtui: error: hub id 'someone/absent' is not in the local cache and the hub cannot be reached: "
        "pass a local folder"
    )
    # One probe each; besides it at most huggingface_hub's once-a-day fetch of its registry: no retries.
    asked = [request.split(b"\r\n")[0] for request in received]
    assert asked.count(b"HEAD / HTTP/1.1") == 2 and len(asked) <= 3, asked


def test_a_decoding_step_takes_the_cache_by_the_keyword_the_model_names_it():
    """transformers 5.25 renamed `past_key_values` to `cache` (the old name goes in 5.40): a step over the cache a
    prefill returned, passed by the model's own keyword, warns of nothing and computes the prefill's last position."""
    import warnings

    import torch

    from batchtui.core.compat.transformers import cache_kwarg, cache_of

    model = load_model(Settings(model="tiny", dtype="float64")).model
    ids = torch.tensor([[5, 9, 2, 7, 3]])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        whole = model(input_ids=ids).logits[0, -1]
        cache = cache_of(model(input_ids=ids[:, :-1], use_cache=True))
        step = model(input_ids=ids[:, -1:], use_cache=True, **{cache_kwarg(model): cache}).logits[0, -1]
    assert cache is not None
    torch.testing.assert_close(step, whole, rtol=0, atol=1e-10)
