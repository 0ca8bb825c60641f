"""Which of the invariant mode's parts a difference comes from (`check --explain kernels`), and the mode's parts on
their own (`--invariant=CLASSES`, `--remedy invariant:A+B`). The cause is made here, the same on every machine: an
attention function that lets padded keys leak into each query, which only the attention class removes."""

from __future__ import annotations

import json
import re

import pytest
import torch

from batchtui.core import Settings, compare
from batchtui.core.cli import main
from batchtui.core.cli import progress as progress_lines
from batchtui.core.experiments.kernel_classes import attribute_kernels, with_classes
from batchtui.core.settings import KERNEL_CLASSES

TEXTS = ["a", "The quick brown fox jumps over it", "hello world", "xyz"]  # mixed lengths: padding on three


@pytest.fixture
def leaky_attention():
    """`leaky`: SDPA with padded keys weighted exp(-3) instead of 0 (its mask function is SDPA's own)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    def leaky(module, query, key, value, attention_mask, **kwargs):
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros((), dtype=query.dtype).masked_fill(~attention_mask, -3.0)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("leaky", leaky)
    AttentionMaskInterface.register("leaky", sdpa_mask)
    yield "leaky"
    AttentionInterface._global_mapping.pop("leaky", None)
    AttentionMaskInterface._global_mapping.pop("leaky", None)


def test_attribution_names_the_attention_class_for_a_leak_through_padded_keys(leaky_attention):
    settings = Settings(model="tiny", dtype="float32", attn=leaky_attention, batch_size=4)
    found = attribute_kernels(TEXTS, settings, lambda texts, s: compare(texts, s))
    by_name = {c.name: c for c in found.classes}
    assert [c.name for c in found.classes] == list(KERNEL_CLASSES)
    assert found.baseline_bitwise_texts < len(TEXTS)  # the leak reaches the padded rows
    assert by_name["attention"].without_bitwise_texts < len(TEXTS)  # nothing else removes it
    assert found.minimal is not None and "attention" in found.minimal
    mended = compare(TEXTS, with_classes(settings, found.minimal))
    assert all(t.bitwise_equal for t in mended.texts) and found.minimal_cost_ratio > 0
    low, high = found.minimal_cost_spread  # timed in paired rounds, as `bench` does: a median and its spread
    assert low <= found.minimal_cost_ratio <= high
    for name in ("matmul", "reduction", "elementwise"):  # none of them alone touches attention over padded keys
        assert by_name[name].alone_bitwise_texts <= by_name["attention"].alone_bitwise_texts
        assert by_name[name].max_abs_diff_alone > 1e-3


def test_explain_kernels_on_the_command_line_and_the_minimal_set_applied(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress_lines, "DELAY_S", 0.0)  # a log's lines from the first pass, however quick the run
    report = tmp_path / "kernels.json"
    command = ["check", "--model", "tiny", "--dtype", "float32", *TEXTS, "--explain", "kernels", "--json", str(report)]
    code = main(command)
    out, err = capsys.readouterr()
    kernels = json.loads(report.read_text())["kernels"]
    # one progress over every run, never back to the start of a run's passes (a log's plain lines); besides it only
    # the mode's own lines while it measures its kernels on this machine
    lines = err.splitlines()
    assert all(line.startswith(("[", "batchtui: measur")) for line in lines), err
    progress = [line for line in lines if line.startswith("[")]
    counts = [tuple(map(int, re.search(r"\] (\d+)/(\d+) run", line).groups())) for line in progress]
    done, totals = [d for d, _ in counts], [t for _, t in counts]  # (a search past the plan adds to the total)
    assert done and done == sorted(done) and totals == sorted(totals) and done[-1] == totals[-1]
    assert [c["name"] for c in kernels["classes"]] == list(KERNEL_CLASSES)
    assert code in (0, 1) and out.splitlines()[0].startswith("class ")
    minimal = kernels["minimal"]
    assert minimal is not None  # the whole mode keeps its promise on the built-in model
    if minimal:
        applied = tmp_path / "applied.json"
        assert main(["check", "--model", "tiny", "--dtype", "float32", *TEXTS, f"--invariant={','.join(minimal)}",
                     "--json", str(applied)]) in (0, 1)  # fmt: skip
        texts = json.loads(applied.read_text())["texts"]
        assert all(t["max_abs_diff"] == 0 for t in texts)
        assert f"the minimal set {'+'.join(minimal)} makes all {len(TEXTS)} bitwise" in out
    else:
        assert "no class is needed" in out


def test_the_mode_s_parts_as_an_option_and_a_remedy(tmp_path, capsys):
    assert main(["check", "--model", "tiny", "a", "--invariant=bogus"]) == 2
    assert "invariant classes must be some of matmul, reduction, attention, elementwise" in capsys.readouterr().err
    report = tmp_path / "r.json"
    assert main(["check", "--model", "tiny", "--invariant", "hello", "--json", str(report)]) in (0, 1)
    assert [t["text"] for t in json.loads(report.read_text())["texts"]] == ["hello"]  # a text, not the flag's value
    assert main(["check", "--model", "tiny", *TEXTS, "--remedy", "invariant:matmul+attention", "--json", str(report)]) \
        in (0, 1)  # fmt: skip
    entry = next(r for r in json.loads(report.read_text())["remedies"] if r["remedy"] == "invariant:matmul+attention")
    assert entry["applied"] is True and entry["config"]["invariant_classes"] == "matmul,attention"
    settings = Settings(model="tiny", invariant=True, invariant_classes="attention, matmul").validated()
    assert settings.kernel_classes == ("attention", "matmul")


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen3-moe"])
def test_on_other_architectures_the_minimal_set_leaves_every_text_bitwise(checkpoints, name):
    """Whatever this CPU's kernels make differ (perhaps nothing): the set found, applied, leaves no text apart."""
    settings = Settings(model=str(checkpoints[name]), dtype="float32", batch_size=4)
    found = attribute_kernels(TEXTS, settings, lambda texts, s: compare(texts, s))
    assert found.minimal is not None, name  # the whole mode keeps its promise here
    applied = compare(TEXTS, with_classes(settings, found.minimal))
    assert all(t.bitwise_equal for t in applied.texts), name
    assert all(c.without_bitwise_texts <= len(TEXTS) for c in found.classes)
