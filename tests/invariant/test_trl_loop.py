"""TRL's own RL loop in the mode: GRPOTrainer, with its own generation (`generate`) and its own loss forward (no
position ids, its fused LM head), run for several steps while the weights change; every completion token's logprob in
the loss is, bit for bit, the one the sampler drew it from: log_softmax(z / T) of the logits `generate` computed at
that step (recorded here through `output_logits`). Without the mode the same harness pairs the same tokens, close but
not equal."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from batchtui.core.errors import NotInvariant
from batchtui.core.invariant.mode import batch_invariant
from batchtui.core.models.builtin import builtin_path

trl = pytest.importorskip("trl", minversion="1.16")
datasets = pytest.importorskip("datasets")

pytestmark = pytest.mark.slow

PROMPTS = ["The function returns", "A list is", "Python is a language that", "To open a file,", "The module",
           "Errors are raised when the value", "An iterator", "Use the keyword"]  # fmt: skip


class _Recording(trl.GRPOTrainer):
    """GRPOTrainer, its sampler's logprobs and its loss's recorded: (prompt, completion) -> the sampler's per-token
    logprobs; and each loss forward's (ids, mask, completion length, logprobs)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampled: dict[tuple, torch.Tensor] = {}
        self.scored: list[tuple] = []

    def _generate_single_turn(self, *args, **kwargs):
        own = self.model.generate

        def generate(**inputs):
            out = own(**inputs, output_logits=True, return_dict_in_generate=True)
            start = inputs["input_ids"].shape[1]
            for i, sequence in enumerate(out.sequences):
                prompt = _real(inputs["input_ids"][i], inputs["attention_mask"][i])
                completion = sequence[start:].tolist()
                drawn = [(out.logits[j][i].float() / self.temperature).log_softmax(-1)[token]
                         for j, token in enumerate(completion)]  # fmt: skip
                self.sampled[(prompt, tuple(completion))] = torch.stack(drawn)
            return out.sequences

        self.model.generate = generate
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            del self.model.generate

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        logps, *rest = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        self.scored.append((input_ids.clone(), attention_mask.clone(), logits_to_keep, logps.detach().clone()))
        return (logps, *rest)


def _real(ids: torch.Tensor, mask: torch.Tensor) -> tuple:
    return tuple(t for t, m in zip(ids.tolist(), mask.tolist(), strict=True) if m)


def _pairs(trainer: _Recording) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(the sampler's logprobs, the loss's) for every completion the loss scored, matched by its tokens."""
    pairs = []
    for ids, mask, kept, logps in trainer.scored:
        cut = ids.shape[1] - kept
        for i in range(ids.shape[0]):
            length = int(mask[i, cut:].sum())
            completion = ids[i, cut : cut + length].tolist()
            prompt = _real(ids[i, :cut], mask[i, :cut])
            drawn = [v for (p, c), v in trainer.sampled.items() if p == prompt and list(c[:length]) == completion]
            assert drawn, "a scored completion the sampler never drew"
            pairs.append((drawn[0][:length], logps[i, :length]))
    return pairs


def _train(tmp_path, dtype: torch.dtype, temperature: float, invariant: bool) -> list[tuple]:
    path = builtin_path("qwen2-english-4m")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    before = model.get_output_embeddings().weight.detach().clone()
    args = trl.GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
        max_steps=3, use_cpu=True, report_to="none", save_strategy="no", temperature=temperature, beta=0.0,
        learning_rate=1e-3, seed=0, bf16=False, disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    trainer = _Recording(
        model=model,
        reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
    )
    with batch_invariant(trainer.model) if invariant else contextlib.nullcontext():
        trainer.train()
    assert trainer.state.global_step == 3 and len(trainer.scored) == 3  # a loss forward a step...
    assert not torch.equal(model.get_output_embeddings().weight, before)  # ...while the weights change
    return _pairs(trainer)


@pytest.mark.parametrize(("dtype", "temperature"), [(torch.float32, 1.0), (torch.bfloat16, 0.7)])
def test_in_the_mode_every_token_s_loss_logprob_is_the_one_it_was_drawn_with(tmp_path, dtype, temperature):
    pairs = _train(tmp_path, dtype, temperature, invariant=True)
    assert len(pairs) == 3 * 8  # every completion of every step, each token of it
    for drawn, scored in pairs:
        assert torch.equal(drawn, scored), (drawn - scored).abs().max()


def test_without_the_mode_the_harness_pairs_the_same_tokens(tmp_path):
    """The same recording outside the mode: every scored completion found among the sampled ones, each logprob close
    to the one drawn (what separates them is rounding; the mode removes it)."""
    pairs = _train(tmp_path, torch.float32, 1.0, invariant=False)
    assert len(pairs) == 3 * 8
    for drawn, scored in pairs:
        torch.testing.assert_close(scored, drawn, rtol=0, atol=1e-3)


def test_the_mode_stands_in_for_trl_s_head_inside_the_block_only():
    """Inside the block TRL's fused head is the stand-in, which refuses a call it does not know (another TRL's) in one
    line; after it, TRL's own kernel."""
    home = trl.trainer.utils
    own = home._ChunkedLogProbFunction
    model = AutoModelForCausalLM.from_pretrained(builtin_path("tiny"))
    with batch_invariant(model):
        stand_in = home._ChunkedLogProbFunction
        assert stand_in is not own
        with pytest.raises(NotInvariant, match=r"fused LM head is called in a way the mode does not know"):
            stand_in.apply(torch.zeros(2, 4), unknown_argument=1)
    assert home._ChunkedLogProbFunction is own
