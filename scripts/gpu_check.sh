#!/usr/bin/env bash
# The GPU check, for a lent GPU box with torch and transformers but no textual and no network:
#   scripts/gpu_check.sh [triton] [invariant] [repeat] [numbers] [bench] [endpoint] [profile] [levers]   (none: all)
#   scripts/gpu_check.sh quick   (about 7 minutes: fits one call of a 15-minute lease with its start)
# Runs from the repository root and writes its JSON under $OUT (default ./gpu-check), on
# tiny-qwen2.5-1.5b-shape in bf16 with 32 texts of 128 tokens (`texts-32x128.txt`) and 32 of 16..128 tokens,
# padded in a batch (`texts-32x16-128.txt`). Minutes as measured on one H200 (each command loads the model):
# - triton (about a minute, not yet run on a GPU): `scripts/triton_check.py` in bf16 and fp32: the mode's Triton
#   kernels against cuBLAS's F.linear and SDPA on the 1.5B shape's layers (milliseconds, ratios, errors against
#   float64) and whether a row and a decoding step keep their bits;
# - invariant (~5): the batch-invariant mode's bitwise result step by step in `generate` (fixed-length and
#   padded texts: 1.8 to 2.7 minutes each, the model's load included) and with right and left padding in `check`
#   (`--remedy invariant`, ~0.4 each);
# - repeat (24 s with the model's load): the same comparison of the padded texts twice in one process: is the
#   report the same, digit for digit? (where not, the first field that differs);
# - numbers (over 4; its sweeps and probe not yet timed): the seed's a,b,c case and 32x128 with sdpa and eager
#   (`check --modules --decompose` and every remedy, ~1 minute each), `sweep` (logits and `--generate`), `probe`;
# - bench (over 3): `bench` on the 1.5B shape with sdpa and eager (its ratios, invariant_vs_compare and
#   invariant_generate_vs_generate among them; ~1.5 minutes each at --rounds 3 --max-new-tokens 8, more as run
#   here) and its memory workload;
# - endpoint: where vLLM is installed, `endpoint` against it (does load change its answers?);
# - profile (about 1.5 minutes each): `scripts/profile_compare.py`, in and out of the batch-invariant mode: the
#   hooks' cost, each stage of a comparison, its milliseconds, kernel launches and waits, and the lines that wait;
# - levers (about two minutes, estimated; not yet run on a GPU): `scripts/gpu_levers.py`: compare/floor and memory
#   with a metrics block 2x and 4x the current one and groups of 2 and 4 blocks (the reports must stay the same),
#   what the hooks' copies cost, and the invariant mode's compare and generate with tiles of 64 (now), 256 and 1024
#   rows (every text must stay bitwise);
# - quick (about 7 minutes): triton, repeat, profile out of the mode, levers, and one `bench` with sdpa at --rounds 2
#   --max-new-tokens 8 (165 s on an H200), its JSON as bench-quick.json.
set -uo pipefail
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # the checkout's batchtui.core, not installed
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/batchtui-cache}"
MODEL="${MODEL:-tiny-qwen2.5-1.5b-shape}"  # another built-in model for a quick run on a CPU
SECTIONS="${*:-triton invariant repeat numbers bench endpoint profile levers}"
[[ " $SECTIONS " == *" quick "* ]] && SECTIONS="$SECTIONS triton repeat profile-compare levers bench-quick"
run() { echo "+ $*"; local start=$SECONDS; "$@"; echo "exit $? in $((SECONDS - start)) s"; }
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }

python - "$OUT" "$MODEL" <<'PY'
import sys
from batchtui.core.bench.methods import workload
from batchtui.core.models.loading import load_model
from batchtui.core.settings import Settings
tokenizer = load_model(Settings(model=sys.argv[2], device="cpu")).tokenizer
for name, shortest in (("texts-32x128.txt", 128), ("texts-32x16-128.txt", 16)):
    with open(f"{sys.argv[1]}/{name}", "w") as file:
        file.writelines(text.replace("\n", " ") + "\n" for text in workload(tokenizer, 32, shortest, 128))
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
FIXED="$OUT/texts-32x128.txt"
PADDED="$OUT/texts-32x16-128.txt"

if wants triton; then
  for dtype in bfloat16 float32; do
    run python scripts/triton_check.py --dtype $dtype --out "$OUT/triton-$dtype.json"
  done
fi
if wants invariant; then
  for texts in FIXED PADDED; do
    run python -m batchtui.core generate --texts-file "${!texts}" --model $MODEL --dtype bfloat16 --batch-size 8 \
        --max-new-tokens 32 --remedy invariant --json "$OUT/generate-invariant-${texts,,}.json"
  done
  for padding in right left; do
    run python -m batchtui.core check --texts-file "$PADDED" --model $MODEL --dtype bfloat16 --batch-size 8 \
        --padding-side $padding --remedy invariant --json "$OUT/check-invariant-$padding.json"
  done
fi
if wants repeat; then
  run python - "$MODEL" "$PADDED" <<'PY'
import json, sys
from batchtui.core.run.engine import compare
from batchtui.core.reports.report import to_json_dict
from batchtui.core.settings import Settings
texts = open(sys.argv[2]).read().splitlines()
settings = Settings(model=sys.argv[1], dtype="bfloat16", batch_size=8)
first, second = ({k: v for k, v in to_json_dict(compare(texts, settings)).items() if k != "elapsed_s"} for _ in "ab")
print("the same report twice:", json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True))


def first_difference(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return next((d for k in keys if (d := first_difference(a.get(k), b.get(k), f"{path}.{k}"))), None)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := first_difference(x, y, f"{path}[{i}]"))), None)
    return None if a == b else f"{path}: {a!r} then {b!r}"


print("first difference:", first_difference(first, second))
PY
fi
if wants numbers; then
  for attn in sdpa eager; do
    run python -m batchtui.core check a b c --model $MODEL --dtype bfloat16 --attn $attn --positions arange \
        --modules --decompose --reference --json "$OUT/check-abc-$attn.json"
    run python -m batchtui.core check --texts-file "$FIXED" --model $MODEL --dtype bfloat16 --attn $attn \
        --batch-size 8 --modules --decompose --json "$OUT/check-32x128-$attn.json" \
        --remedy tf32-off --remedy reduced-precision-off --remedy deterministic --remedy float32 \
        --remedy batch-invariant --remedy invariant
  done
  run python -m batchtui.core sweep --generate --texts-file "$FIXED" --model $MODEL --dtypes bfloat16 \
      --batch-sizes 1,8,32 --max-new-tokens 32 --json "$OUT/sweep-generate.json"
  run python -m batchtui.core sweep --texts-file "$FIXED" --model $MODEL --dtypes bfloat16,float32 \
      --batch-sizes 1,2,4,8,16,32 --attns sdpa,eager --padding-sides left --json "$OUT/sweep.json"
  run python -m batchtui.core probe --repeats 3 --json "$OUT/probe.json"
fi
if wants bench; then
  for attn in sdpa eager; do
    run python -m batchtui.core bench --model $MODEL --dtype bfloat16 --attn $attn --rounds 5 --json "$OUT/bench-$attn.json"
  done
  run python -m batchtui.core bench --model $MODEL --dtype bfloat16 --text-count 32 --min-text-tokens 256 --max-text-tokens 256 \
      --batch-size 8 --rounds 2 --json "$OUT/bench-memory.json"
fi
# `endpoint` against vLLM where vLLM is installed (it brings the openai client): does load change its answers?
if wants endpoint; then
  if python -c "import vllm" 2>/dev/null; then
    SERVED=$(python -c "from batchtui.core.models.builtin import builtin_path; print(builtin_path('$MODEL'))")
    PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    python -m vllm.entrypoints.openai.api_server --model "$SERVED" --host 127.0.0.1 --port "$PORT" \
        --dtype bfloat16 > "$OUT/vllm.log" 2>&1 &
    VLLM_PID=$!
    for _ in $(seq 90); do python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" \
        2>/dev/null && break; sleep 2; done
    run python -m batchtui.core endpoint --url "http://127.0.0.1:$PORT/v1" --texts-file "$FIXED" \
        --max-new-tokens 32 --rounds 3 --json "$OUT/endpoint-vllm.json"
    kill "$VLLM_PID"; wait "$VLLM_PID" 2>/dev/null
  else
    echo "vllm is not installed: the endpoint check is skipped"
  fi
fi
# The scripts' readouts are kept as files too: the command's output that comes back is only its tail.
if wants profile || wants profile-compare; then
  run python scripts/profile_compare.py --model $MODEL --dtype bfloat16 2>&1 | tee "$OUT/profile.txt"
fi
if wants profile; then
  run python scripts/profile_compare.py --model $MODEL --dtype bfloat16 --invariant 2>&1 \
      | tee "$OUT/profile-invariant.txt"
fi
if wants levers; then
  run python scripts/gpu_levers.py --model $MODEL --dtype bfloat16 2>&1 | tee "$OUT/levers.txt"
fi
if wants bench-quick; then
  run python -m batchtui.core bench --model $MODEL --dtype bfloat16 --attn sdpa --rounds 2 --max-new-tokens 8 \
      --json "$OUT/bench-quick.json"
fi
python - "$OUT" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    data = json.load(open(path))
    for entry in data.get("remedies", []):
        if entry["remedy"] == "invariant":
            print(path, "invariant:", entry["applied"], entry.get("bitwise_equal"), "of", (entry["summary"] or {}).get("texts"), entry["note"])
    ratios = data.get("ratios", {})
    mode = {name: round(value, 3) for name, value in ratios.items() if name.startswith("invariant_")}
    if mode:  # the mode's forward, generation, trainer's forward and training step against the library's
        print(path, " ".join(f"{name} {value}" for name, value in mode.items()))
PY
