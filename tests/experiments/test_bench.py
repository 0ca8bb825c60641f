"""`batchtui bench` produces the figures scripts read (its timings are not asserted: no timed tests)."""

import json
import re

import pytest

from batchtui.core.bench.methods import workload
from batchtui.core.cli.bench import run_bench
from batchtui.core.models.loading import load_model
from batchtui.core.settings import Settings


@pytest.mark.slow
def test_bench_json_has_ratios_and_targets(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = ["--model", "tiny", "--text-count", "3", "--min-text-tokens", "4", "--max-text-tokens", "9", "--rounds", "2",
            "--max-new-tokens", "4"]  # fmt: skip
    tokenizer = load_model(Settings(model="tiny")).tokenizer
    side = tokenizer.padding_side
    code = run_bench([*args, "--json", str(out), "--padding-side", "left" if side == "right" else "right"])
    assert tokenizer.padding_side == side  # the model the other commands share is left as it was
    # Progress after every call the bench makes (14 methods warmed up and timed twice, 2 peaks), with an estimate.
    printed = capsys.readouterr()
    progress = [line for line in printed.err.splitlines() if line.startswith("[")]
    assert progress[-1].startswith("[########################] 44/44 peak memory compare")
    assert any("s left" in line for line in progress)
    data = json.loads(out.read_text())
    assert set(data["ratios"]) >= {"compare_vs_floor", "modules_vs_floor", "compare_vs_seed", "generate_vs_floor"}
    # Each round's best try of each method: three tries a round for a method of under a second, one otherwise.
    assert data["tries"].keys() == data["seconds"].keys() and set(data["tries"].values()) <= {1, 3}
    rounds = data["all_seconds"]
    assert all(len(values) == 2 for values in rounds.values())
    assert data["seconds"] == {name: min(values) for name, values in rounds.items()}
    # A ratio of two methods: the median of their rounds' ratios (of two rounds, their mean).
    for ratio, name, base in (
        ("compare_vs_floor", "compare", "floor"),
        ("generate_vs_floor", "generate", "generate_floor"),
        ("invariant_vs_compare", "compare_invariant", "compare"),
        ("invariant_generate_vs_generate", "generate_invariant", "generate"),
        ("invariant_trainer_vs_trainer", "trainer_invariant", "trainer"),
        ("invariant_train_step_vs_train_step", "train_step_invariant", "train_step"),
        ("rollouts_vs_forward", "rollouts", "rollouts_forward"),
    ):
        each = [a / b for a, b in zip(rounds[name], rounds[base])]
        assert data["ratios"][ratio] == pytest.approx(sum(each) / 2, rel=1e-12), ratio
        assert data["spreads"][ratio] == pytest.approx([min(each), max(each)], rel=1e-12), ratio
    seconds = data["seconds"]
    # The generations' forward passes by phase in each round's best try (within its seconds), the best round's as
    # `phases`, and their ratios paired by round as the methods' are (of two rounds, the mean).
    for name in ("generate", "generate_invariant"):
        each = data["all_phases"][name]
        assert len(each) == 2 and data["phases"][name] == each[rounds[name].index(seconds[name])]
        for phases, round_seconds in zip(each, rounds[name]):
            assert phases["prefill"] > 0 and phases["decode"] > 0 and sum(phases.values()) <= round_seconds
    for phase in ("prefill", "decode"):
        each = [
            a[phase] / b[phase] for a, b in zip(*(data["all_phases"][n] for n in ("generate_invariant", "generate")))
        ]
        assert data["ratios"][f"invariant_{phase}_vs_{phase}"] == pytest.approx(sum(each) / 2, rel=1e-12), phase
    # Every matmul the mode computed, and how: a path it measured, padded to that path's height.
    paths = data["matmul_paths"]
    # The built-in model's products are its linear layers', each computed at the layer (the list is the
    # process's: other tests' products may be in it too).
    assert {p["op"] for p in paths} >= {"linear", "linear+bias"} and all(p["dtype"] == "bfloat16" for p in paths)
    assert all(p["path"] in p["heights"] and p["height"] == p["heights"][p["path"]] for p in paths)
    table = printed.out[printed.out.index("the mode's matmuls") :]
    assert all(re.search(rf"{re.escape(p['op'])} +{p['operand']} +{p['path']} ", table) for p in paths)
    # The CPU kernels the mode left to the library for this model: a norm's mean and float32 rsqrt, a mask's sum, and
    # the products and activation made only inside the linear layers and activation modules the mode computes itself.
    assert data["library_kernels"] == ["addmm", "mean.dim", "mm", "rsqrt", "silu", "sum.dim_IntList"]
    assert "computes itself): addmm, mean.dim, mm, rsqrt, silu, sum.dim_IntList" in printed.out
    names = ["compare_vs_floor", "compare_vs_seed", "generate_vs_floor", "invariant_vs_compare"]
    assert [t["name"] for t in data["targets"]] == [
        *names, "invariant_generate_vs_generate", "invariant_trainer_vs_trainer", "invariant_train_step_vs_train_step",
        "rollouts_vs_forward",
    ]  # fmt: skip
    limits = [1.10, 1.0, 1.25, 1.10, 1.30, 1.50, 1.50, 1.2]  # the small models' limits
    assert [t["limit"] for t in data["targets"]] == limits
    for target in data["targets"]:
        assert {"name", "value", "limit", "pass"} <= target.keys()
        assert target["pass"] == (target["value"] <= target["limit"])
    assert code == (0 if all(t["pass"] for t in data["targets"]) else 4)
    assert data["texts"] == 3 and data["vocab_size"] == 512  # the bench's default, tiny


def test_each_round_times_every_method_once_each_ratio_s_two_side_by_side_and_rotates():
    from batchtui.core.bench.rounds import round_order

    names = ["floor", "seed", "compare", "compare_modules", "generate_floor", "generate"]
    names += ["compare_invariant", "generate_invariant", "trainer", "trainer_invariant", "train_step"]
    names += ["train_step_invariant"]
    orders = [round_order(names, r) for r in range(12)]
    assert all(sorted(order) == sorted(names) for order in orders)
    beside = [("compare", "floor"), ("compare_modules", "floor"), ("generate", "generate_floor")]
    beside += [("compare_invariant", "compare"), ("generate_invariant", "generate"), ("trainer_invariant", "trainer")]
    beside += [("train_step_invariant", "train_step")]
    for order in orders:  # each ratio's method right after or right before its base; the seed's one away
        for method, base in beside:
            assert abs(order.index(method) - order.index(base)) == 1, (method, base, order)
        assert abs(order.index("compare") - order.index("seed")) == 2, order
    # the two in turn first, and each run leads every other round
    assert [o.index("compare") < o.index("compare_invariant") for o in orders[:4]] == [True, False, True, False]
    assert [o.index("generate") < o.index("generate_invariant") for o in orders[:4]] == [True, False, True, False]
    assert [order[0] for order in orders[:3]] == ["compare_modules", "generate_invariant", "trainer"]


def test_workload_has_the_asked_token_counts():
    tokenizer = load_model(Settings(model="tiny")).tokenizer
    texts = workload(tokenizer, 6, 32, 128)
    counts = [len(tokenizer(t)["input_ids"]) for t in texts]
    assert len(texts) == 6 and all(32 <= c <= 128 for c in counts)
    assert workload(tokenizer, 6, 32, 128) == texts  # seeded


def test_the_phase_clock_splits_a_generation_into_one_prefill_and_its_decoding_steps():
    """Each forward pass of `generate` timed by phase, counted against the test's own hook: the first pass over the
    prompt is the prefill, each later one (one new position per row, over the cache) a decoding step."""
    import torch

    from batchtui.core.bench.phase_clock import phase_clock

    loaded = load_model(Settings(model="tiny", dtype="float32"))
    model, tokenizer = loaded.model, loaded.tokenizer
    widths = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        ids = tokenizer(["some prompt text"], return_tensors="pt")
        with phase_clock(model) as seconds, torch.inference_mode():
            model.generate(**ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
            decoded = dict(seconds)
            model(**ids)  # no cache: a prefill
    finally:
        hook.remove()
    assert widths[0] == ids["input_ids"].shape[1] > 1 and widths[1:5] == [1, 1, 1, 1]  # one prefill, four steps
    assert decoded["prefill"] > 0 and decoded["decode"] > 0
    assert seconds["decode"] == decoded["decode"] and seconds["prefill"] > decoded["prefill"]
    hooks = model._forward_pre_hooks, model._forward_hooks
    assert not any(hooks)  # the clock leaves nothing behind
