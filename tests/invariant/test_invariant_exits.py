"""What the mode leaves behind, and what it must see: an exception raised inside the block reaches the caller as it
was and the exit restores every module, kernel and setting it touched, so that the next block works; a forward with
autograd on (a trainer's) computes the mode's bits; a layer's own instance forward (a patch, accelerate's hooks) is
run and kept; a weight replaced inside the block is the one used."""

import threading

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

from batchtui.core import batch_invariant
from batchtui.core.invariant.elementwise import TailFreeElementwise
from batchtui.core.invariant.matmul import RowInvariantMatmuls
from batchtui.core.invariant.reduction import RowInvariantReductions
from batchtui.core.invariant.routing import NAME
from batchtui.core.models.loading import load_model
from batchtui.core.settings import Settings

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

TEXTS = ["a", "The quick brown fox", "def f(x):\n    return x + 1"]


class Injected(Exception):
    """The error a test raises inside the block."""


@pytest.fixture(scope="module")
def loaded():
    return load_model(Settings(model="qwen2-english-4m", dtype="float32"))


def _batch(tokenizer, texts=TEXTS) -> dict:
    """A left-padded batch with its positions from the mask (as `generate` makes them)."""
    tokenizer.padding_side = "left"
    batch = dict(tokenizer(texts, return_tensors="pt", padding=True))
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return batch


def _rows_equal_alone(model, tokenizer) -> bool:
    """In the mode: each text's real rows of a padded batch bitwise equal its run alone."""
    batch = _batch(tokenizer)
    with torch.no_grad(), batch_invariant(model):
        logits = model(**batch).logits
        for i, text in enumerate(TEXTS):
            alone = model(**tokenizer([text], return_tensors="pt")).logits[0]
            if not torch.equal(logits[i][batch["attention_mask"][i].bool()], alone):
                return False
    return True


def _state(model) -> tuple:
    """What the mode may touch: each module's instance forward, the configs' attention, the aten kernels it
    registers, the thread's torch function modes."""
    return (
        {name: vars(m).get("forward") for name, m in model.named_modules()},
        vars(model).get("train"),
        model.config._attn_implementation,
        RowInvariantMatmuls.registered(),
        RowInvariantReductions.registered(),
        TailFreeElementwise.registered(),
        len(torch.overrides._get_current_function_mode_stack()),
    )


def _raise_on_call(module, calls: int):
    """A forward pre-hook on `module` raising `Injected` at its `calls`-th call."""
    seen = []

    def hook(mod, args):
        seen.append(1)
        if len(seen) == calls:
            raise Injected(f"call {calls}")

    return module.register_forward_pre_hook(hook)


def _in_first_forward(model, tokenizer):
    model(**_batch(tokenizer))


def _in_generate(model, tokenizer):
    batch = _batch(tokenizer)
    del batch["position_ids"]  # (generate makes them)
    model.generate(**batch, max_new_tokens=6, min_new_tokens=6, do_sample=False)


def _in_a_thread(model, tokenizer):
    errors = []

    def work():
        try:
            with batch_invariant(model):
                model(**_batch(tokenizer))
        except Injected as exc:
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    raise errors[0]


@pytest.mark.parametrize(
    "where, calls",
    [("first forward", 1), ("later forward", 3), ("generate", 4), ("a thread", 1), ("autograd", 2)],
)
def test_an_exception_in_the_block_reaches_the_caller_and_leaves_nothing_behind(loaded, where, calls):
    model, tokenizer = loaded.model, loaded.tokenizer
    before = _state(model)
    layer = model.model.layers[1].mlp  # the hook sits where the mode's own forwards run
    handle = _raise_on_call(layer, calls)
    try:
        with pytest.raises(Injected, match=f"call {calls}"):
            if where == "a thread":
                _in_a_thread(model, tokenizer)
            else:
                with batch_invariant(model):
                    with torch.no_grad():
                        model(**_batch(tokenizer))
                    if where == "generate":
                        with torch.no_grad():
                            _in_generate(model, tokenizer)
                    elif where == "autograd":  # a trainer's forward: autograd on
                        _in_first_forward(model, tokenizer)
                    else:
                        with torch.no_grad():
                            for _ in range(3):
                                _in_first_forward(model, tokenizer)
    finally:
        handle.remove()
    assert _state(model) == before
    assert model.config._attn_implementation != NAME
    assert _rows_equal_alone(model, tokenizer)  # the next block works, bitwise


def test_a_forward_with_autograd_gives_the_mode_s_bits_and_a_backward(loaded):
    """The issue's case: a no_grad forward in the block, then one without (as every trainer runs): no error, the
    same logits bitwise, gradients close to the library's own."""
    model, tokenizer = loaded.model, loaded.tokenizer
    batch = _batch(tokenizer)
    with batch_invariant(model):
        with torch.no_grad():
            inference = model(**batch).logits
        training = model(**batch).logits
    assert training.requires_grad and torch.equal(training.detach(), inference)
    training.float().logsumexp(-1).sum().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(**batch).logits.float().logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(ours[name], p.grad, rtol=1e-3, atol=1e-4, msg=name)
    model.zero_grad()
    assert _rows_equal_alone(model, tokenizer)


@pytest.mark.parametrize("kind", ["patched", "accelerate"])
def test_a_layer_s_own_instance_forward_is_run_in_the_block_and_kept_after(loaded, kind):
    model, tokenizer = loaded.model, loaded.tokenizer
    layer = model.model.layers[0].mlp.down_proj
    if kind == "patched":
        original = layer.forward
        layer.forward = lambda x: original(x) * 2.0
    else:

        class Doubling(ModelHook):
            def post_forward(self, module, output):
                return output * 2.0

        add_hook_to_module(layer, Doubling())
    own = vars(layer)["forward"]
    try:
        batch = _batch(tokenizer)
        with torch.no_grad():
            expected = model(**batch).logits
            with batch_invariant(model):
                inside = model(**batch).logits
        torch.testing.assert_close(inside, expected, rtol=1e-4, atol=1e-4)
        assert vars(layer)["forward"] is own
        assert _rows_equal_alone(model, tokenizer)
    finally:
        if kind == "patched":
            del layer.forward
        else:
            remove_hook_from_module(layer)


@pytest.mark.parametrize("change", ["new parameter", "data", "tied head"])
def test_a_weight_replaced_inside_the_block_is_the_one_used(change):
    loaded = load_model(Settings(model="qwen2-english-4m", dtype="float32"))
    model, tokenizer = loaded.model, loaded.tokenizer
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 0.5)
    layer = model.model.layers[0].self_attn.q_proj
    batch = _batch(tokenizer)

    def replace():
        if change == "new parameter":
            layer.weight = torch.nn.Parameter(layer.weight.detach() * 1.5)
        elif change == "data":
            layer.weight.data = layer.weight.detach() * 1.5
        else:
            model.lm_head.weight = model.model.embed_tokens.weight

    with torch.no_grad(), batch_invariant(model):
        before = model(**batch).logits
        replace()
        inside = model(**batch).logits
        rows = [inside[i][batch["attention_mask"][i].bool()] for i in range(len(TEXTS))]
        alone = [model(**tokenizer([text], return_tensors="pt")).logits[0] for text in TEXTS]
    with torch.no_grad():
        outside = model(**batch).logits
    assert not torch.allclose(before, inside)  # the change changes the logits...
    torch.testing.assert_close(inside, outside, rtol=1e-4, atol=1e-4)  # ...to what the model now computes
    assert all(torch.equal(r, a) for r, a in zip(rows, alone))


@pytest.mark.slow
def test_train_and_eval_inside_the_block_keep_the_mode_s_forwards(loaded):
    """transformers' `train` re-kernelizes a model that uses hub kernels, popping every decorated layer's instance
    forward (an activation's, a norm's): inside the block they are the mode's again after it, and the trainer's
    logits keep the mode's bits at two threads (a silu left to the library gave a tail mid-row)."""
    model, tokenizer = loaded.model, loaded.tokenizer
    batch = _batch(tokenizer)
    before = _state(model)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with batch_invariant(model):
            given = {name: vars(m).get("forward") for name, m in model.named_modules()}
            with torch.no_grad():
                inference = model(**batch).logits
            model.train()
            assert {name: vars(m).get("forward") for name, m in model.named_modules()} == given
            training = model(**batch).logits
            model.eval()
            assert {name: vars(m).get("forward") for name, m in model.named_modules()} == given
    finally:
        torch.set_num_threads(saved)
        model.eval()
    assert torch.equal(training.detach(), inference)
    assert _state(model) == before
