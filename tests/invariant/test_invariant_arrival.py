"""The mode holds however a text's tokens arrive: its logits at every position are the bits of one forward of the
whole text alone, whether it is decoded token by token over a KV cache (greedy or sampled, batched or alone, the
dynamic, static or sliding cache transformers picks), prefilled in chunks of any sizes, continued behind a prefix
reused from a cache, or scored in a trainer's padded batch of prompt + completion (prompts left-padded and
completions right-padded, or all right-padded) in training mode with autograd on and with gradient checkpointing, or
packed one after another in one row with positions from 0 each (verl's and OpenRLHF's layout; every architecture
whose masks tell packed sequences apart; one the layout refuses is shown to attend across them).
On the built-ins and every architecture of the matrix, in bfloat16 and float32; the same without the mode differs
(`test_without_the_mode_decode_and_prefill_differ`)."""

import copy
import random

import pytest
import torch
import transformers
from helpers.architectures import CHECKPOINTS, load_checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from batchtui.core import batch_invariant
from batchtui.core.errors import InputError
from batchtui.core.invariant.compiled_kernels import SWITCH
from batchtui.core.models.builtin import builtin_path
from batchtui.core.run.packed_layout import check_packs, completion_logits

pytestmark = pytest.mark.cpu_kernels  # run again with the AVX2 kernels (.ci/run)

PROMPTS = ["a", "The quick brown fox", "def f(x):\n    return x + 1\n\nprint(f(2))"]
NEW_TOKENS = 12
BUILT_INS = ("tiny", "qwen2-english-4m")
# Beyond the matrix, where a fused kernel's float32 bits depend on an operand's address (head sizes 34 and 25, one
# key head): the mode's attention calls no such kernel.
HELD_OUT = {
    "qwen2-one-kv-head-34": (
        "Qwen2Config",
        {"hidden_size": 68, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 34},
    ),
    "stablelm-head-25": (
        "StableLmConfig",
        {"hidden_size": 50, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2},
    ),
}  # fmt: skip
MODELS = (*CHECKPOINTS, *BUILT_INS, *HELD_OUT)
DTYPES = (torch.bfloat16, torch.float32)


@pytest.fixture(scope="module")
def models(checkpoints, tiny_path, tmp_path_factory):
    held_out = {}
    for name, (config_class, kwargs) in HELD_OUT.items():
        tokenizer = AutoTokenizer.from_pretrained(tiny_path)
        config = getattr(transformers, config_class)(vocab_size=len(tokenizer), max_position_embeddings=256, **kwargs)
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        held_out[name] = folder
    return {**checkpoints, **{name: builtin_path(name) for name in BUILT_INS}, **held_out}


def _generate(model, tokenizer, prompts, **options):
    """Batched (left-padded) generation: per prompt, its ids, the new tokens and each step's logits ([steps, V])."""
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(
        **batch,
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        **options,
    )
    width = batch.input_ids.shape[1]
    steps = torch.stack(out.logits, dim=1)
    rows = []
    for i in range(len(prompts)):
        ids = batch.input_ids[i][batch.attention_mask[i].bool()]
        rows.append((ids, out.sequences[i, width:], steps[i]))
    return rows


def _whole(model, ids: torch.Tensor) -> torch.Tensor:
    """One forward of the whole sequence alone: [n, V] logits in float32 (exact for bf16)."""
    return model(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], use_cache=False).logits[0].float()


def _differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not torch.equal(a.float(), b.float())


def _chunked(model, ids: torch.Tensor, cuts: list[int], cache=None, start: int = 0) -> torch.Tensor:
    """The sequence fed in pieces (ending at `cuts`) through a cache: the pieces' logits concatenated."""
    cache = DynamicCache(config=model.config) if cache is None else cache
    pieces = []
    for end in [*cuts, len(ids)]:
        if end <= start:
            continue
        piece = ids[start:end][None]
        positions = torch.arange(start, end)[None]
        mask = torch.ones(1, end, dtype=torch.long)
        out = model(input_ids=piece, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        pieces.append(out.logits[0].float())
        start = end
    return torch.cat(pieces)


def _trainer_batch(tokenizer, sequences, prompt_lengths, left_prompts: bool):
    """TRL's GRPO layout (`left_prompts`): prompts left-padded to the longest prompt, completions right-padded to the
    longest completion; else every sequence right-padded. Input ids, mask, and each row's real positions."""
    pad = tokenizer.pad_token_id
    if left_prompts:
        p_width = max(prompt_lengths)
        c_width = max(len(s) - p for s, p in zip(sequences, prompt_lengths))
        rows, masks = [], []
        for seq, p in zip(sequences, prompt_lengths):
            c = len(seq) - p
            rows.append([pad] * (p_width - p) + seq[:p].tolist() + seq[p:].tolist() + [pad] * (c_width - c))
            masks.append([0] * (p_width - p) + [1] * len(seq) + [0] * (c_width - c))
    else:
        width = max(len(s) for s in sequences)
        rows = [s.tolist() + [pad] * (width - len(s)) for s in sequences]
        masks = [[1] * len(s) + [0] * (width - len(s)) for s in sequences]
    ids, mask = torch.tensor(rows), torch.tensor(masks)
    return ids, mask, [mask[i].bool() for i in range(len(sequences))]


def _trainer_logits(model, ids, mask, checkpointing: bool) -> torch.Tensor:
    """The trainer's forward: training mode (dropout 0 in these configs), autograd on, positions from the mask."""
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        assert logits.requires_grad
        return logits.detach().float()
    finally:
        if checkpointing:
            model.gradient_checkpointing_disable()
        model.eval()


def _packed_logits(model, name: str, sequences, prompt_lengths) -> list[torch.Tensor]:
    """Each sequence's completion logits with every sequence packed in one row (training mode, autograd on); none
    where the layout refuses the model, which must then attend across them (which architectures do depends on the
    transformers release: its masks read the positions or not)."""
    try:
        check_packs(model, name)
    except InputError:
        with torch.no_grad():
            row = torch.cat([sequences[0], sequences[1]])[None]
            places = torch.cat([torch.arange(len(sequences[0])), torch.arange(len(sequences[1]))])[None]
            packed = model(input_ids=row, position_ids=places, use_cache=False).logits[0, len(sequences[0]) :]
        assert _differs(packed.float(), _whole(model, sequences[1])), f"{name}: refused, yet it packs"
        return []
    prompts = [s[:p].tolist() for s, p in zip(sequences, prompt_lengths)]
    completions = [s[p:].tolist() for s, p in zip(sequences, prompt_lengths)]
    model.train()
    try:
        with torch.enable_grad():
            return [c.detach().float() for c in completion_logits(model, prompts, completions, 0, 10_000)]
    finally:
        model.eval()


def _no_dropout(model) -> None:
    """Dropout (and OPT's layer drop) off everywhere a training-mode forward reads it: modules, their float
    attributes (OPT keeps its rates as numbers), the config."""
    for owner in [model.config, *model.modules()]:
        if isinstance(owner, torch.nn.Dropout):
            owner.p = 0.0
        for name, value in list(vars(owner).items()):
            if ("dropout" in name or "pdrop" in name or name == "layerdrop") and isinstance(value, float):
                setattr(owner, name, 0.0)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """The kernels split work by thread count: each count is its own computation, and must hold by itself."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(params=["compiled", "python"])
def kernels(request, monkeypatch):
    """The mode's compiled kernels, and the Python paths taken where they cannot be built: each keeps the promise."""
    monkeypatch.setenv(SWITCH, {"compiled": "1", "python": "0"}[request.param])
    return request.param


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_a_text_s_logits_are_the_same_however_its_tokens_arrive(models, name, threads, kernels):
    rng = random.Random(0)
    for dtype in DTYPES:
        model, tokenizer = load_checkpoint(models[name], name, dtype)
        _no_dropout(model)
        with batch_invariant(model):
            with torch.no_grad():
                generated = _generate(model, tokenizer, PROMPTS, do_sample=False)
                sequences = [torch.cat([ids, new]) for ids, new, _ in generated]
                wholes = [_whole(model, seq) for seq in sequences]
                for (ids, _, steps), seq, whole in zip(generated, sequences, wholes):
                    where = f"{name} {dtype} {len(ids)}-token prompt"
                    p = len(ids)
                    # each decoding step (the batch's, left-padded, over the cache) = the one forward's position
                    assert not _differs(steps, whole[p - 1 : p - 1 + NEW_TOKENS]), f"{where}: decode vs prefill"
                    alone = _generate(model, tokenizer, [tokenizer.decode(ids)], do_sample=False)
                    if torch.equal(alone[0][0], ids):  # the prompt tokenizes back to itself
                        assert not _differs(alone[0][2], steps), f"{where}: decoded alone vs in the batch"
                    cuts = sorted(rng.sample(range(1, len(seq)), k=min(3, len(seq) - 1)))
                    assert not _differs(_chunked(model, seq, cuts), whole), f"{where}: chunks at {cuts}"
                    # a prefix's cache, copied, continued: the prefix computed once for another continuation
                    prefix = rng.randrange(1, len(seq))
                    cache = DynamicCache(config=model.config)
                    _chunked(model, seq[:prefix], [], cache)
                    reused = _chunked(model, seq, [], copy.deepcopy(cache), start=prefix)
                    assert not _differs(reused, whole[prefix:]), f"{where}: behind a reused {prefix}-token prefix"
            prompt_lengths = [len(ids) for ids, _, _ in generated]
            for left_prompts in (True, False):
                ids, mask, real = _trainer_batch(tokenizer, sequences, prompt_lengths, left_prompts)
                for checkpointing in (False, True):
                    logits = _trainer_logits(model, ids, mask, checkpointing)
                    for i, whole in enumerate(wholes):
                        layout = "GRPO" if left_prompts else "right-padded"
                        assert not _differs(logits[i][real[i]], whole), (
                            f"{name} {dtype} text {i}: trainer's {layout} batch (checkpointing {checkpointing})"
                        )
            for i, packed in enumerate(_packed_logits(model, name, sequences, prompt_lengths)):
                p = prompt_lengths[i]
                assert not _differs(packed, wholes[i][p - 1 : -1]), f"{name} {dtype} text {i}: packed in one row"


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["static", "sampled"])
def test_decoding_over_a_static_cache_or_sampled_matches_the_prefill(models, threads, cache, kernels):
    """A static cache (its slots past the text empty, masked), and sampled decoding (the logits before the sampler's
    processing): each step's logits are the one forward's, at one thread and at two."""
    for name in ("qwen2-english-4m", "mistral-window", "gemma2"):
        for dtype in DTYPES:
            model, tokenizer = load_checkpoint(models[name], name, dtype)
            options = {"cache_implementation": "static", "do_sample": False}
            if cache == "sampled":
                torch.manual_seed(0)
                options = {"do_sample": True, "temperature": 1.5, "top_k": 0}
            with batch_invariant(model), torch.no_grad():
                for ids, new, steps in _generate(model, tokenizer, PROMPTS, **options):
                    whole = _whole(model, torch.cat([ids, new]))
                    p = len(ids)
                    assert not _differs(steps, whole[p - 1 : p - 1 + NEW_TOKENS]), f"{name} {dtype} {cache}"


def test_without_the_mode_decode_and_prefill_differ(models):
    """The tests above can fail: the same workload's decoding steps part from the prefill without the mode."""
    model, tokenizer = load_checkpoint(models["qwen2-english-4m"], "qwen2-english-4m", torch.float32)
    apart = 0
    with torch.no_grad():
        for ids, new, steps in _generate(model, tokenizer, PROMPTS, do_sample=False):
            whole = _whole(model, torch.cat([ids, new]))
            apart += _differs(steps, whole[len(ids) - 1 : len(ids) - 1 + NEW_TOKENS])
    assert apart > 0
