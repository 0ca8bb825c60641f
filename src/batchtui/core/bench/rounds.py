"""`bench`'s rounds: every method timed side by side, interleaved, each ratio the median of its two methods' rounds'
ratios (the package's doc says why)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from ..invariant.mode import library_kernels_on_cpu
from ..invariant.rows import chosen_paths
from ..models.loading import LoadedModel, load_model
from ..numbers.generation_result import DEFAULT_MAX_NEW_TOKENS
from ..run.engine import compare
from ..run.generation_run import generate_and_compare
from ..settings import Settings
from .clock import peak_memory, synchronize, timed
from .figures import BenchResult, MoreMethods
from .methods import floor_passes, generate_floor, sampled_completions, seed_script, trainer_passes, training_steps
from .phase_clock import PHASES, phase_clock
from .targets import MATMULS, path_row, target, targets_of, weights_dtype

_SHORT_TRIES = 3
# The methods whose forward passes are timed by phase: the generations, in and out of the mode.
PHASED = ("generate", "generate_invariant")


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
    pairs = sampled_completions(loaded, texts, settings, new_tokens)
    methods = _methods(loaded, texts, pairs, settings, new_tokens)
    added = more(loaded, pairs, settings) if more is not None else MoreMethods({}, {})
    methods.update(added.methods)
    steps = _Steps(len(methods) * (rounds + 1) + len(_PEAK_METHODS), progress)
    tries, times, round_phases = _Rounds(loaded, methods, steps).timed(rounds)
    peaks = {}
    for name in _PEAK_METHODS:
        peaks[name] = peak_memory(methods[name], loaded.device)
        steps(f"peak memory {name}")
    best = {name: min(values) for name, values in times.items()}
    result = BenchResult(
        model=settings.model,
        device=loaded.device,
        dtype=loaded.dtype,
        texts=len(texts),
        batch_size=settings.batch_size,
        tokens=sum(len(loaded.tokenizer(t)["input_ids"]) for t in texts),
        vocab_size=loaded.vocab_size,
        rounds=rounds,
        tries=tries,
        seconds=best,
        all_seconds=times,
        peak_bytes=peaks,
        phases={name: each[times[name].index(best[name])] for name, each in round_phases.items()},
        all_phases=round_phases,
        matmul_paths=[
            path_row(c) for c in chosen_paths() if c.key[0][0] in MATMULS and c.key[1] == weights_dtype(loaded)
        ],
        library_kernels=sorted(library_kernels_on_cpu(loaded.model)),
    )
    _ratios(result, times, round_phases, added)
    result.targets = targets_of(result, texts, loaded)
    result.targets += [target(name, result.ratios[name], limit) for name, (_, _, limit) in added.ratios.items()]
    return result


def _matmul_paths(loaded: LoadedModel) -> list[dict]:
    """How the mode computed each kind of matmul of the model's dtype, in words a table shows."""
    dtype = weights_dtype(loaded)
    return [path_row(c) for c in chosen_paths() if c.key[0][0] in MATMULS and c.key[1] == dtype]


_PEAK_METHODS = ("floor", "compare")
# Each ratio of `bench`'s own: (the method, its base)
_PAIRS = {
    "compare_vs_floor": ("compare", "floor"),
    "modules_vs_floor": ("compare_modules", "floor"),
    "compare_vs_seed": ("compare", "seed"),
    "generate_vs_floor": ("generate", "generate_floor"),
    "invariant_vs_compare": ("compare_invariant", "compare"),
    "invariant_generate_vs_generate": ("generate_invariant", "generate"),
    "invariant_trainer_vs_trainer": ("trainer_invariant", "trainer"),
    "invariant_train_step_vs_train_step": ("train_step_invariant", "train_step"),
}


def _methods(loaded: LoadedModel, texts: list[str], pairs: list[tuple], settings: Settings, new_tokens: int) -> dict:
    """Each of `bench`'s own methods by name (the package's doc lists them)."""
    module_settings = settings.with_changes(modules=True)
    invariant_settings = settings.with_changes(invariant=True)
    return {
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


class _Steps:
    """`progress(done, total, label)` after every call the bench makes."""

    def __init__(self, total: int, progress) -> None:
        self.total, self.progress, self.done = total, progress, 0

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, label)


class _Rounds:
    """The warm-up, then `rounds` rounds of every method in `round_order`, each round's best try kept."""

    def __init__(self, loaded: LoadedModel, methods: dict, steps: _Steps) -> None:
        self.loaded, self.methods, self.steps = loaded, methods, steps

    def timed(self, rounds: int) -> tuple[dict[str, int], dict[str, list[float]], dict[str, list[dict[str, float]]]]:
        """(tries a round of each method, each round's best seconds, the phased methods' phases in those)."""
        warm_up = {}
        for name, fn in self.methods.items():  # warm-up: kernels, caches, the tokenizer's decode table
            warm_up[name] = timed(fn, self.loaded.device)
            self.steps(f"warm-up {name}")
        # A method of under a second is timed three times a round, interleaved with the others, and its round's
        # best kept: a busy machine's noise (other tenants, a clock that drifts by a third from minute to minute)
        # weighs most on short timings, and the tries cost little beside generate's seconds.
        tries = {name: _SHORT_TRIES if seconds < 1.0 else 1 for name, seconds in warm_up.items()}
        times: dict[str, list[float]] = {name: [] for name in self.methods}
        round_phases: dict[str, list[dict[str, float]]] = {name: [] for name in PHASED}  # of each round's best try
        for round_ in range(rounds):
            order = round_order(list(self.methods), round_)
            best: dict[str, tuple[float, dict[str, float]]] = {name: (float("inf"), {}) for name in self.methods}
            for attempt in range(max(tries.values())):
                for name in (name for name in order if attempt < tries[name]):
                    best[name] = min(best[name], self._once(name), key=lambda timing: timing[0])
                    if attempt == tries[name] - 1:
                        self.steps(f"round {round_ + 1}/{rounds} {name}")
            for name in self.methods:
                times[name].append(best[name][0])
            for name in PHASED:
                round_phases[name].append(best[name][1])
        return tries, times, round_phases

    def _once(self, name: str) -> tuple[float, dict[str, float]]:
        device = self.loaded.device
        if name not in PHASED:  # the other methods' passes run without the clock's hooks
            return timed(self.methods[name], device), {}
        with phase_clock(self.loaded.model, lambda: synchronize(device)) as clock:
            seconds = timed(self.methods[name], device)
        return seconds, dict(clock)


def _ratios(result: BenchResult, times: dict, round_phases: dict, added: MoreMethods) -> None:
    """Each ratio the median of its two methods' rounds' ratios, with its least and greatest round."""

    def median_of(key: str, each: list[float]) -> float:
        result.spreads[key] = (min(each), max(each))
        return statistics.median(each)

    def paired(name: str, base: str, key: str) -> float:
        return median_of(key, [a / b for a, b in zip(times[name], times[base])])

    result.ratios = {key: paired(name, base, key) for key, (name, base) in _PAIRS.items()}
    for phase in PHASES:
        if all(each[phase] > 0 for each in round_phases["generate"]):
            key = f"invariant_{phase}_vs_{phase}"
            rounds_of = zip(round_phases["generate_invariant"], round_phases["generate"])
            result.ratios[key] = median_of(key, [a[phase] / b[phase] for a, b in rounds_of])
    for name, (method, base, _) in added.ratios.items():
        result.ratios[name] = paired(method, base, name)


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
