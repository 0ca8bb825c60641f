"""`check --ops`: the first aten op whose inputs for a text are the same in the batched and single runs and whose
output is not. The cause is made here, the same on every machine: a matmul kernel whose result depends on the
call's height (registered through torch.library for the test), in float64 where the CPU's own kernels keep rows."""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
import torch
from helpers.architectures import ARCHITECTURES, ATTENTION
from helpers.height_kernels import height_dependent_addmm

from batchtui.core import Settings, compare
from batchtui.core.cli import main
from batchtui.core.run.first_op import with_first_ops

TEXTS = ["ab", "abcdefg", "xyz"]  # byte tokens: calls of 2, 7 and 3 rows alone, 21 rows batched


def test_the_first_op_is_the_height_dependent_matmul_in_the_first_projection():
    settings = Settings(model="tiny", dtype="float64", modules=True)
    with height_dependent_addmm():
        found = with_first_ops(compare(TEXTS, settings), TEXTS, settings)
    for text in found.texts:
        assert not text.bitwise_equal
        op = text.first_op
        assert op is not None and op.op in ("aten.linear", "aten.addmm")
        assert op.module == "model.layers.0.self_attn.q_proj"  # the first addmm of the pass: Qwen2's q has a bias
        assert op.module.startswith(text.first_divergent_module.name)
        assert op.shape_single[0][:2] == (1, len(text.token_ids)) and op.shape_batched[0][:2] == (3, 7)
        assert 0 < op.max_abs_diff <= 2**-29


def test_the_named_op_s_inputs_are_equal_and_its_output_is_not_here(checkpoints):
    """On another architecture (Llama: projections without bias, so mm), checked independently: hooks on the named
    module see this text's rows of its input equal in both runs, and of its output not."""
    settings = Settings(model=str(checkpoints["llama"]), dtype="float64", modules=True, batch_size=4)
    texts = ["a", "The quick brown fox jumps over it", "hello world", "xyz"]
    from batchtui.core.models.loading import load_model
    from batchtui.core.run.runner import Runner

    loaded = load_model(settings)
    with height_dependent_addmm():
        found = with_first_ops(compare(texts, settings), texts, settings)
        named = {t.first_op.module for t in found.texts if t.first_op is not None}
        assert named == {"model.layers.0.self_attn.q_proj"}
        seen = []
        module = dict(loaded.model.named_modules())["model.layers.0.self_attn.q_proj"]
        handle = module.register_forward_hook(lambda m, args, out: seen.append((args[0].clone(), out.clone())))
        runner = Runner(loaded, "left", "mask", record=False)
        try:
            with torch.inference_mode():
                chunk = runner.batched(texts)
                checked = 0
                for row, text in enumerate(found.texts):
                    if text.first_op is None:  # (a text as long as the shifted calls is shifted alone too: no op)
                        continue
                    checked += 1
                    runner.single(list(text.token_ids))
                    (batched_in, batched_out), (single_in, single_out) = seen[0], seen[-1]
                    real = chunk.attention_mask[row].bool()
                    assert torch.equal(batched_in[row][real], single_in[0])  # the same input for this text...
                    assert not torch.equal(batched_out[row][real], single_out[0])  # ...another output
                assert checked >= 2
        finally:
            handle.remove()


def test_check_ops_on_the_command_line_and_in_json(tmp_path, capsys):
    report = tmp_path / "ops.json"
    with height_dependent_addmm():
        code = main(["check", "--model", "tiny", "--dtype", "float64", *TEXTS, "--ops", "--json", str(report)])
    out = capsys.readouterr().out
    assert code in (0, 1)
    entries = json.loads(report.read_text())["texts"]
    assert all(e["first_op"]["module"] == "model.layers.0.self_attn.q_proj" for e in entries)
    assert entries[0]["first_op"]["shape_single"][0][:2] == [1, 2]
    assert "  first op: aten." in out and "in model.layers.0.self_attn.q_proj: [1, 2, 128]" in out
    plain = tmp_path / "plain.json"
    assert main(["check", "--model", "tiny", "--dtype", "float64", "a", "--ops", "--json", str(plain)]) == 0
    assert "first_op" not in json.loads(plain.read_text())["texts"][0]  # bitwise: nothing to name


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_on_every_architecture_the_op_named_lies_in_the_first_divergent_module(checkpoints, name):
    settings = Settings(model=str(checkpoints[name]), dtype="float64", modules=True, attn=ATTENTION.get(name))
    texts = ["a", "The quick brown fox jumps over it", "hello world"]
    with height_dependent_addmm(rows=64):  # more rows than any text alone (34 at most), fewer than the batch
        found = with_first_ops(compare(texts, settings), texts, settings)
    divergent = [t for t in found.texts if not t.bitwise_equal]
    assert divergent  # the made cause reaches every architecture's batched rows
    for text in divergent:
        assert text.first_op is not None, (name, text.line)
        assert text.first_op.module.startswith(text.first_divergent_module.name), (name, text.first_op)


async def test_the_app_s_detail_says_where_the_text_first_parts_in_the_module_view():
    from helpers.tui_helpers import make_app, settle

    app = make_app(texts=TEXTS, dtype="float64", positions="mask", modules=True)
    with height_dependent_addmm():
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot, app)
            assert all(t.first_op is not None for t in app.state.comparison.texts)
            app.select(1, 0)
            await pilot.pause()
            shown = " ".join(str(app.query_one("#detail-numbers").render()).split())
            assert "text first parts at aten." in shown and "in model.layers.0.self_attn.q_proj" in shown


@contextlib.contextmanager
def batch_dependent_cos():
    """aten::cos on the CPU, plus 2**-20 on every output of a call over more than one row of its first dimension: a
    cause inside the rotary embedding, a module outside the layers that the comparison does not record."""

    def cos(x):
        out = torch.ops.aten.cos.out(x, out=torch.empty_like(x))
        return out + 2**-20 if x.dim() >= 2 and x.shape[0] > 1 else out  # (float32: the rotary embedding's dtype)

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        library.impl("cos", cos, "CPU")
    try:
        yield
    finally:
        library._destroy()


def test_a_cause_in_a_module_the_comparison_does_not_record_is_found_there():
    """The rotary embedding's cos follows the batch: the first recorded module that parts is the first attention
    (which takes cos and sin already apart), and the first op is the cos in `model.rotary_emb`, found over the whole
    pass where none inside that module parts on equal inputs."""
    settings = Settings(model="tiny", dtype="float64", modules=True)
    with batch_dependent_cos():
        found = with_first_ops(compare(TEXTS, settings), TEXTS, settings)
    for text in found.texts:
        assert not text.bitwise_equal
        op = text.first_op
        assert op is not None and op.op == "aten.cos" and op.module == "model.rotary_emb", op


def test_the_cause_says_what_was_measured_and_words_a_reason_as_likely():
    from batchtui.core.numbers.comparison import FirstOp

    mul = FirstOp("aten.mul", "model.norm", ((1, 5, 64), (64,)), ((3, 9, 64), (64,)), 1e-7)
    assert mul.cause() == (
        "the same inputs for this text alone and batched, other output bits: likely the op's vector tail or its "
        "threads' split falling elsewhere in the larger call"
    )
    same = FirstOp("aten.mul", "model.norm", ((3, 9, 64),), ((3, 9, 64),), 1e-7)
    assert same.cause().endswith("in calls of the same shape: the op's own kernel, not the call's size, differs")
    mm = FirstOp("aten.addmm", "q_proj", ((256,), (2, 128), (128, 256)), ((256,), (21, 128), (128, 256)), 1e-7)
    assert mm.cause().startswith("a 2-row call alone, 21 rows batched: likely ")
    assert all("likely" in op.cause() for op in (mul, mm)) and mm.kernel_class == "matmul"
