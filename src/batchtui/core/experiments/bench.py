"""`batchtui bench`: what a comparison costs next to the forward passes it compares.

Twelve methods on the same model and texts, interleaved over rounds, each timed by its best round (other load on
the machine only ever slows a round: the least disturbed one is the closest to what the method costs, as timeit
has it; a method of under a second is tried three times a round). A ratio of two methods is the median of their
rounds' ratios: the two are timed a few seconds apart in a round, where a box whose speed flips for minutes at a
time (a fifth, on the 2-core boxes measured) can give one method its fast spell and the other none between two
rounds' bests (so each ratio's two methods are timed one right after the other: `RUNS`):
(a) the floor: bare forward passes (one batched pass per chunk, one single pass per text);
(b) the seed's script for every text: batched pass, its padded rows alone, torch.allclose;
(c) compare() as the CLI runs it; (d) compare() with per-module localization;
(e) the generation floor: bare greedy `generate` calls (one per left-padded chunk, one per text alone);
(f) generate_and_compare() as `batchtui generate` runs it, on the same number of new tokens;
(g), (h) compare() and generate_and_compare() in the batch-invariant mode: what the same logits cost;
(i), (j) the trainer's forward over the texts' greedy continuations (`trainer_forward`: training mode, autograd on)
outside and in the mode: what the sampler's logits cost a trainer; (k), (l) a trainer's step over them (that forward,
a token-mean loss, its backward) outside and in the mode.
Both generations' forward passes are also timed by phase (prefill, decode: `phase_clock`; their ratios too are
the medians of the rounds' ratios, each round's from its best try), and the mode's
matmul paths are listed per shape (the library, padded to the height from which it keeps rows, oneDNN, or
fixed-height tiles), with the CPU kernels it leaves to the library for this
model (calls that never need replacing): why the mode costs what it costs on this machine.
Peak memory: on CUDA max_memory_allocated above what was allocated before (the weights); on the
CPU the peak resident-set growth, sampled.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from ..invariant.mode import invariant_if, library_kernels_on_cpu
from ..invariant.rows import chosen_paths
from ..models.loading import LoadedModel, load_model
from ..numbers.generation import DEFAULT_MAX_NEW_TOKENS
from ..run.engine import compare
from ..run.generation import generate_and_compare
from ..run.runner import Runner
from ..run.skeleton import chunks
from ..run.trainer_forward import score_as_trainer, training_step
from ..settings import Settings
from .phase_clock import PHASES, phase_clock

_WORDS = (
    "the model reads each token and attends to the ones before it while padding changes the shape of every "
    "matrix product so kernels differ and small rounding errors grow through the layers into the logits"
).split()


def workload(tokenizer, n_texts: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`n_texts` English-like texts of min..max tokens each (exact for the tokenizer given)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        target = rng.randint(min_tokens, max_tokens)
        words: list[str] = []
        while len(tokenizer(" ".join(words))["input_ids"]) < target:
            words += rng.choices(_WORDS, k=8)
        ids = tokenizer(" ".join(words))["input_ids"][:target]
        texts.append(tokenizer.decode(ids, skip_special_tokens=True))
    return texts


def _bare_runner(loaded: LoadedModel, settings: Settings, padding_side: str | None = None) -> Runner:
    """The same passes as a comparison's, with nothing recorded: logits only."""
    return Runner(loaded, padding_side or settings.padding_side, settings.positions, record=False)


def _chunks(texts: list[str], settings: Settings):
    return chunks(texts, list(range(1, len(texts) + 1)), settings.batch_size)


def floor_passes(loaded: LoadedModel, texts: list[str], settings: Settings) -> None:
    """The passes a comparison cannot do without: one batched pass per chunk, one single pass per text."""
    runner = _bare_runner(loaded, settings)
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            del runner.batched(chunk.texts).output
        for text in texts:
            runner.single(runner.tokenize(text)[0])


def seed_script(loaded: LoadedModel, texts: list[str], settings: Settings) -> None:
    """The original report's method: each chunk batched, then each of its padded rows alone, torch.allclose."""
    runner = _bare_runner(loaded, settings)
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            batched = runner.batched(chunk.texts)
            for row in range(len(chunk.texts)):
                single = runner.padded_row(batched, row).logits[0]
                torch.allclose(batched.output.logits[row], single, atol=settings.atol, rtol=settings.rtol)


def generate_floor(loaded: LoadedModel, texts: list[str], settings: Settings, new_tokens: int) -> None:
    """What a user runs to see the two continuations: greedy generate on each left-padded chunk and on
    each text alone, nothing else."""
    runner = _bare_runner(loaded, settings, padding_side="left")
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            rows = [runner.tokenize(text)[0] for text in chunk.texts]
            runner.greedy(rows, new_tokens, with_logits=False)
            for ids in rows:
                runner.greedy([ids], new_tokens, with_logits=False)


def sampled_completions(loaded: LoadedModel, texts: list[str], settings: Settings, new_tokens: int) -> list[tuple]:
    """(prompt ids, the batched greedy continuation's ids) of each text: what a trainer scores."""
    runner = _bare_runner(loaded, settings, padding_side="left")
    pairs: list[tuple] = []
    with torch.inference_mode():
        for chunk in _chunks(texts, settings):
            rows = [runner.tokenize(text)[0] for text in chunk.texts]
            pairs += zip(rows, runner.greedy(rows, new_tokens, with_logits=False).new_tokens.tolist())
    return pairs


def trainer_passes(loaded: LoadedModel, pairs: list[tuple], settings: Settings, invariant: bool) -> None:
    """The trainer's forward (`score_as_trainer`: training mode, autograd on) over every chunk of prompt +
    completion, in the mode or not."""
    with invariant_if(invariant, loaded.model):
        for start in range(0, len(pairs), settings.batch_size):
            prompts, completions = zip(*pairs[start : start + settings.batch_size])
            score_as_trainer(loaded.model, list(prompts), list(completions), loaded.pad_token_id)


def training_steps(loaded: LoadedModel, pairs: list[tuple], settings: Settings, invariant: bool) -> None:
    """A trainer's step over every chunk of prompt + completion (`training_step`: forward with autograd, a
    token-mean loss, its backward), in the mode or not."""
    with invariant_if(invariant, loaded.model):
        for start in range(0, len(pairs), settings.batch_size):
            prompts, completions = zip(*pairs[start : start + settings.batch_size])
            training_step(loaded.model, list(prompts), list(completions), loaded.pad_token_id)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object], device: str) -> float:
    """Seconds `fn` takes, the device's queued work included."""
    _synchronize(device)
    started = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - started


class _RssSampler:
    """Peak resident-set size of this process while running, sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> _RssSampler:
        self.start = self._rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


def peak_memory(fn: Callable[[], object], device: str) -> int:
    """Bytes allocated at the peak of `fn` above what was allocated before it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    _return_freed_memory()
    with _RssSampler() as sampler:
        fn()
    return sampler.peak - sampler.start


def _return_freed_memory() -> None:
    """Hand freed heap back to the OS, so that RSS growth measures this run and not the last one's leftovers."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the figure is then an upper bound
        pass


@dataclass
class BenchResult:
    model: str
    device: str
    dtype: str
    texts: int
    batch_size: int
    tokens: int
    vocab_size: int
    rounds: int
    tries: dict[str, int]  # timings per round of each method (three where it takes under a second)
    seconds: dict[str, float]  # each method's best round
    all_seconds: dict[str, list[float]]  # each round's best try
    peak_bytes: dict[str, int]
    # The generations' forward passes by phase (prefill, decode), seconds, in their best round's best try
    phases: dict[str, dict[str, float]] = field(default_factory=dict)
    # the same in each round's best try (the phase ratios are medians of the rounds' ratios, as the others)
    all_phases: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # How the mode computed each kind of matmul: op, operand shape, dtype, path, height, each path's height
    matmul_paths: list[dict] = field(default_factory=list)
    # The aten ops whose CPU kernels the mode leaves to the library for this model (its calls never need them)
    library_kernels: list[str] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)  # of two methods: the median of their rounds' ratios
    spreads: dict[str, tuple[float, float]] = field(default_factory=dict)  # each ratio's least and greatest round
    targets: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


_SHORT_TRIES = 3
# The methods whose forward passes are timed by phase: the generations, in and out of the mode.
PHASED = ("generate", "generate_invariant")
# Built-in models small enough that per-call overheads, not the passes, dominate their timings.
SMALL_BUILTINS = ("tiny", "qwen2-english-4m")
# The memory target is about logits of a real vocabulary (Qwen2.5: 151,936 tokens).
LARGE_VOCABULARY = 100_000


def bench(
    texts: list[str],
    settings: Settings,
    rounds: int = 5,
    progress=None,
    new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    more: Callable[[LoadedModel, list[tuple], Settings], MoreMethods] | None = None,
) -> BenchResult:
    """Every method timed side by side; `more(loaded, pairs, settings)`: methods of a layer above this one (the
    rollouts' scoring) timed with them, on the same sampled (prompt, completion) pairs the trainer scores."""
    loaded = load_model(settings)
    device = loaded.device
    module_settings = settings.with_changes(modules=True)
    invariant_settings = settings.with_changes(invariant=True)
    pairs = sampled_completions(loaded, texts, settings, new_tokens)
    methods = {
        "floor": lambda: floor_passes(loaded, texts, settings),
        "seed": lambda: seed_script(loaded, texts, settings),
        "compare": lambda: compare(texts, settings),
        "compare_modules": lambda: compare(texts, module_settings),
        "generate_floor": lambda: generate_floor(loaded, texts, settings, new_tokens),
        "generate": lambda: generate_and_compare(texts, settings, new_tokens),
        "compare_invariant": lambda: compare(texts, invariant_settings),
        "generate_invariant": lambda: generate_and_compare(texts, invariant_settings, new_tokens),
        "trainer": lambda: trainer_passes(loaded, pairs, settings, invariant=False),
        "trainer_invariant": lambda: trainer_passes(loaded, pairs, settings, invariant=True),
        "train_step": lambda: training_steps(loaded, pairs, settings, invariant=False),
        "train_step_invariant": lambda: training_steps(loaded, pairs, settings, invariant=True),
    }
    added = more(loaded, pairs, settings) if more is not None else MoreMethods({}, {})
    methods.update(added.methods)
    peak_methods = ("floor", "compare")
    steps = len(methods) * (rounds + 1) + len(peak_methods)
    done = 0

    def step(label: str) -> None:  # `progress(done, total, label)` after every call the bench makes
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, steps, label)

    warm_up = {}
    for name, fn in methods.items():  # warm-up: kernels, caches, the tokenizer's decode table
        warm_up[name] = _timed(fn, device)
        step(f"warm-up {name}")
    # A method of under a second is timed three times a round, interleaved with the others, and its round's best
    # kept: a busy machine's noise (other tenants, a clock that drifts by a third from minute to minute) weighs most
    # on short timings, and the tries cost little beside generate's seconds.
    tries = {name: _SHORT_TRIES if seconds < 1.0 else 1 for name, seconds in warm_up.items()}
    times: dict[str, list[float]] = {name: [] for name in methods}
    round_phases: dict[str, list[dict[str, float]]] = {name: [] for name in PHASED}  # of each round's best try

    def timed(name: str) -> tuple[float, dict[str, float]]:
        if name not in PHASED:  # the other methods' passes run without the clock's hooks
            return _timed(methods[name], device), {}
        with phase_clock(loaded.model, lambda: _synchronize(device)) as clock:
            seconds = _timed(methods[name], device)
        return seconds, dict(clock)

    for round_ in range(rounds):
        order = round_order(list(methods), round_)
        round_best: dict[str, tuple[float, dict[str, float]]] = {name: (float("inf"), {}) for name in methods}
        for attempt in range(max(tries.values())):
            for name in (name for name in order if attempt < tries[name]):
                round_best[name] = min(round_best[name], timed(name), key=lambda timing: timing[0])
                if attempt == tries[name] - 1:
                    step(f"round {round_ + 1}/{rounds} {name}")
        for name in methods:
            times[name].append(round_best[name][0])
        for name in PHASED:
            round_phases[name].append(round_best[name][1])
    peaks = {}
    for name in peak_methods:
        peaks[name] = peak_memory(methods[name], device)
        step(f"peak memory {name}")
    best = {name: min(values) for name, values in times.items()}
    tokens = sum(len(loaded.tokenizer(t)["input_ids"]) for t in texts)
    result = BenchResult(
        model=settings.model,
        device=device,
        dtype=loaded.dtype,
        texts=len(texts),
        batch_size=settings.batch_size,
        tokens=tokens,
        vocab_size=loaded.vocab_size,
        rounds=rounds,
        tries=tries,
        seconds=best,
        all_seconds=times,
        peak_bytes=peaks,
        phases={name: each[times[name].index(best[name])] for name, each in round_phases.items()},
        all_phases=round_phases,
        matmul_paths=[_path_row(c) for c in chosen_paths() if c.key[0][0] in _MATMULS and c.key[1] == _dtype(loaded)],
        library_kernels=sorted(library_kernels_on_cpu(loaded.model)),
    )

    def median_of(key: str, each: list[float]) -> float:
        result.spreads[key] = (min(each), max(each))
        return statistics.median(each)

    def paired(name: str, base: str, key: str) -> float:
        return median_of(key, [a / b for a, b in zip(times[name], times[base])])

    def paired_phase(phase: str, key: str) -> float:
        rounds_of = zip(round_phases["generate_invariant"], round_phases["generate"])
        return median_of(key, [a[phase] / b[phase] for a, b in rounds_of])

    pairs_of = {
        "compare_vs_floor": ("compare", "floor"),
        "modules_vs_floor": ("compare_modules", "floor"),
        "compare_vs_seed": ("compare", "seed"),
        "generate_vs_floor": ("generate", "generate_floor"),
        "invariant_vs_compare": ("compare_invariant", "compare"),
        "invariant_generate_vs_generate": ("generate_invariant", "generate"),
        "invariant_trainer_vs_trainer": ("trainer_invariant", "trainer"),
        "invariant_train_step_vs_train_step": ("train_step_invariant", "train_step"),
    }
    result.ratios = {key: paired(name, base, key) for key, (name, base) in pairs_of.items()}
    for phase in PHASES:
        if all(each[phase] > 0 for each in round_phases["generate"]):
            key = f"invariant_{phase}_vs_{phase}"
            result.ratios[key] = paired_phase(phase, key)
    for name, (method, base, _) in added.ratios.items():
        result.ratios[name] = paired(method, base, name)
    result.targets = _targets(result, texts, loaded)
    result.targets += [_target(name, result.ratios[name], limit) for name, (_, _, limit) in added.ratios.items()]
    return result


@dataclass(frozen=True)
class MoreMethods:
    """Methods `bench` times beside its own (timed one after the other in their order), and the ratios of two of them
    with each one's limit: name -> (method, base, limit)."""

    methods: dict[str, Callable[[], None]]
    ratios: dict[str, tuple[str, str, float]]


# Timed one after the other, in this order or its reverse, in every round: each ratio's two methods side by side
# (the comparison has three partners; the seed's script, the least watched, sits one away from it). A 2-core box's
# speed swings by a third within seconds, and in a round of all eight methods a generation's seconds fell between
# a ratio's two: the mode's rounds' ratios ranged from 0.75 to 1.37 in one bench.
RUNS = (
    ("compare_modules", "floor", "compare", "compare_invariant", "seed"),
    ("generate_floor", "generate", "generate_invariant"),
    ("trainer", "trainer_invariant"),
    ("train_step", "train_step_invariant"),
)


def round_order(names: list[str], round_: int) -> list[str]:
    """The methods' order in round `round_`: each of `RUNS` timed as one, the runs (and a method in none) rotated by
    one each round so that drift (heat, other load) falls on every method alike, and every other round each run
    reversed, so that neither of two neighbours is always first."""
    in_runs = {name for run in RUNS for name in run}
    others = [name for name in names if name not in in_runs]  # (`MoreMethods`': one run, in their order)
    groups = [list(run) for run in RUNS] + ([others] if others else [])
    shift = round_ % len(groups)
    groups = groups[shift:] + groups[:shift]
    return [name for group in groups for name in (group if round_ % 2 == 0 else group[::-1])]


_MATMULS = ("linear", "mm", "addmm", "bmm")


def _dtype(loaded: LoadedModel) -> torch.dtype:
    return next(loaded.model.parameters()).dtype


def _path_row(chosen) -> dict:
    """One kind of matmul the mode computed, in words a table can show: the operand that is not the rows as
    [in, out] (a linear layer's weight transposed)."""
    (op, operand, *rest), dtype, _, _, _, _, threads = chosen.key
    if op == "linear":  # its weight as stored, [out, in]; and whether it adds a bias
        op, operand = ("linear+bias" if rest[0] else "linear"), (operand[1], operand[0])
    return {
        "op": op,
        "operand": "x".join(str(n) for n in operand),
        "dtype": str(dtype).removeprefix("torch."),
        "threads": threads,
        "path": chosen.path,
        "height": chosen.height,
        "ceiling": chosen.ceiling,
        "heights": chosen.heights,
        "failed": list(chosen.failed),
        "unneeded": list(chosen.unneeded),
    }


def _target(name: str, value: float, limit: float) -> dict:
    return {"name": name, "value": value, "limit": limit, "pass": value <= limit}


def _targets(result: BenchResult, texts: list[str], loaded: LoadedModel) -> list[dict]:
    r = result.ratios
    # What a comparison adds to the passes it compares: a tenth on a model of a few million weights (whose forward
    # passes cost about what reading their logits does), a twentieth on a real model's shape; and never more
    # than the seed's own script, which compares nothing per position.
    targets = [
        _target("compare_vs_floor", r["compare_vs_floor"], 1.10 if result.model in SMALL_BUILTINS else 1.05),
        _target("compare_vs_seed", r["compare_vs_seed"], 1.0),
    ]
    if result.model in SMALL_BUILTINS:  # generate's per-step calls weigh more there too
        targets.append(_target("generate_vs_floor", r["generate_vs_floor"], 1.25))
    else:
        targets += [
            _target("modules_vs_floor", r["modules_vs_floor"], 1.30),
            _target("generate_vs_floor", r["generate_vs_floor"], 1.15),
        ]
    # The same logits at a cost one leaves on, on every model and machine: ahead of the peers' batch-invariant modes
    # (1.34x to 2.4x) and close to the library.
    targets += [
        _target("invariant_vs_compare", r["invariant_vs_compare"], 1.10),
        _target("invariant_generate_vs_generate", r["invariant_generate_vs_generate"], 1.30),
        _target("invariant_trainer_vs_trainer", r["invariant_trainer_vs_trainer"], 1.50),
        _target("invariant_train_step_vs_train_step", r["invariant_train_step_vs_train_step"], 1.50),
    ]
    longest = max(len(loaded.tokenizer(t)["input_ids"]) for t in texts)
    chunk_logits = min(result.batch_size, len(texts)) * longest * result.vocab_size * 4
    extra = result.peak_bytes["compare"] - result.peak_bytes["floor"]
    result.ratios["memory_vs_chunk_logits"] = extra / chunk_logits
    if result.vocab_size >= LARGE_VOCABULARY:  # with a tiny vocabulary, hidden states outweigh logits
        targets.append(_target("memory_vs_chunk_logits", extra / chunk_logits, 1.5))
    return targets
