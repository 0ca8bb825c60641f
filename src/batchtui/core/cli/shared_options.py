"""The options several commands take, each defined once here: one name, one meaning, one help text, wherever it
appears (a command may give it another default: the help says which). `tests/cli/test_option_meanings.py` reads every
command's --help and fails where one name carries two meanings or two names carry one."""

from __future__ import annotations

from typing import Any

from ..numbers.generation_result import DEFAULT_MAX_NEW_TOKENS
from ..settings import DEFAULT_ATOL, DEFAULT_MODEL, DEFAULT_RTOL, DTYPES, KERNEL_CLASSES, PADDING_SIDES, POSITION_MODES
from .validators import int_at_least, ints_argument, names_argument

SHARED: dict[str, dict] = {
    "--model": {"default": DEFAULT_MODEL, "help": "the model: a built-in name, a local path or a Hub id"},
    "--dtype": {"default": "auto", "choices": DTYPES, "help": "the weights' dtype (auto: the checkpoint's)"},
    "--device": {"default": "auto", "help": "cuda, cuda:1, mps, cpu... (under torchrun: each rank's own GPU)"},
    "--device-map": {"metavar": "MAP", "help": "'auto': shard the model across this host's GPUs (needs accelerate)"},
    "--attn": {
        "metavar": "IMPL",
        "help": "attn_implementation: sdpa, eager, flash_attention_2... (default: the model's)",
    },
    "--trust-remote-code": {"action": "store_true", "help": "run the checkpoint's own Python code"},
    "--batch-size": {"type": int, "default": 8, "metavar": "N", "help": "texts per batched pass"},
    "--padding-side": {"default": "left", "choices": PADDING_SIDES, "help": "the side the padding goes"},
    "--positions": {"default": "mask", "choices": POSITION_MODES, "help": "position ids"},
    "--atol": {"type": float, "default": DEFAULT_ATOL, "help": "allclose's absolute tolerance"},
    "--rtol": {"type": float, "default": DEFAULT_RTOL, "help": "allclose's relative tolerance"},
    "--invariant": {
        "action": "store_true",
        "help": "run the model in the batch-invariant mode: a text's logits do not depend on its batch",
    },  # fmt: skip
    "--invariant-classes": {
        "metavar": "CLASSES",
        "default": "",
        "help": f"only these parts of the mode, comma-separated ({','.join(KERNEL_CLASSES)}); also --invariant=CLASSES",
    },
    "--max-new-tokens": {
        "type": int_at_least(1),
        "default": DEFAULT_MAX_NEW_TOKENS,
        "metavar": "N",
        "help": "tokens generated per text",
    },  # fmt: skip
    "--rounds": {"type": int_at_least(1), "metavar": "R", "help": "times the measurement is repeated"},
    "--dtypes": {"type": names_argument, "help": "the dtypes to try, comma-separated"},
    "--batch-sizes": {"type": ints_argument, "help": "the batch sizes to try, comma-separated"},
    "--temperature": {
        "type": float,
        "metavar": "T",
        "help": "the rollouts' sampling temperature (scored as log_softmax(logits / T), as TRL and verl do)",
    },
    "--json": {"metavar": "PATH", "help": "write the report to PATH ('-' for stdout)"},
    "--quiet": {"action": "store_true", "help": "no progress on stderr (a bar on a terminal, a few lines in a log)"},
    "--url": {"help": "an OpenAI-compatible server's address (vLLM, SGLang, transformers serve...), e.g. "
              "http://127.0.0.1:8000/v1; --model names the served model"},  # fmt: skip
    "--api-key-env": {"metavar": "NAME", "help": "the environment variable holding the server's API key (never "
                      "printed)"},  # fmt: skip
    "--batch-tokens": {"type": int, "metavar": "N", "help": "padded tokens per forward at most (rows times the "
                       "longest prompt plus the longest completion)"},  # fmt: skip
    "--ops": {
        "action": "store_true",
        "help": "where two runs part, name the first aten op that makes them, inside the first module where they "
        "part (check: a text alone and batched, with --modules implied; generate, with --vs-trainer: the sampler and "
        "the trainer)",
    },
}


def add_shared(parser: Any, *names: str, **settings) -> None:  # (a parser, or a group of its options)
    """The shared options `names` on `parser`; `settings`: what a command sets otherwise, by option name without its
    dashes (`default`, `required`; `default_said`: a default said in words, where it is not a value): never the
    meaning."""
    for name in names:
        spec = dict(SHARED[name])
        spec.update(settings.get(name.removeprefix("--").replace("-", "_"), {}))
        if "default_said" in spec:
            spec["help"] += f" (default: {spec.pop('default_said')})"
        parser.add_argument(name, **spec)
