#!/usr/bin/env bash
# The GPU check, for a lent GPU box with torch and transformers but no textual and no network.
# Runs from the repository root in well under 5 minutes on one H100/H200 and writes its JSON under
# $OUT (default ./gpu-check): the seed's a,b,c case and 32 texts x 128 tokens on
# tiny-qwen2.5-1.5b-shape in bf16, with sdpa and eager, `check` (with --modules --decompose and the
# remedies), `generate` (continuations batched vs alone), `sweep --generate` and `bench` (its generate row);
# the batch-invariant mode: bitwise result (`--remedy invariant` in check and generate) and cost (bench ratios
# invariant_vs_compare, invariant_generate_vs_generate); where vLLM is installed, `endpoint` against it.
set -uo pipefail
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XDG_CACHE_HOME="${XDG_CACHE_HOME:-/tmp/batchtui-cache}"
MODEL=tiny-qwen2.5-1.5b-shape
run() { echo "+ $*"; "$@"; echo "exit $?"; }

python - <<'PY' > "$OUT/texts-32x128.txt"
from core.bench import workload
from core.models import load_model
from core.settings import Settings
for text in workload(load_model(Settings(model="tiny-qwen2.5-1.5b-shape", device="cpu")).tokenizer, 32, 128, 128):
    print(text.replace("\n", " "))
PY
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

for attn in sdpa eager; do
  run python -m core check a b c --model $MODEL --dtype bfloat16 --attn $attn --positions arange \
      --modules --decompose --reference --json "$OUT/check-abc-$attn.json"
  run python -m core check --texts-file "$OUT/texts-32x128.txt" --model $MODEL --dtype bfloat16 --attn $attn \
      --batch-size 8 --modules --decompose --json "$OUT/check-32x128-$attn.json" \
      --remedy tf32-off --remedy reduced-precision-off --remedy deterministic --remedy float32 --remedy batch-invariant \
      --remedy invariant
done
run python -m core generate --texts-file "$OUT/texts-32x128.txt" --model $MODEL --dtype bfloat16 \
    --batch-size 8 --max-new-tokens 32 --remedy invariant --json "$OUT/generate-32x128.json"
for padding in left right; do
  run python -m core check --texts-file "$OUT/texts-32x128.txt" --model $MODEL --dtype bfloat16 --batch-size 8 \
      --padding-side $padding --reference --remedy invariant --json "$OUT/check-invariant-$padding.json"
done
run python -m core sweep --generate --texts-file "$OUT/texts-32x128.txt" --model $MODEL --dtypes bfloat16 \
    --batch-sizes 1,8,32 --max-new-tokens 32 --json "$OUT/sweep-generate.json"
run python -m core sweep --texts-file "$OUT/texts-32x128.txt" --model $MODEL --dtypes bfloat16,float32 \
    --batch-sizes 1,2,4,8,16,32 --attns sdpa,eager --padding-sides left --json "$OUT/sweep.json"
run python -m core probe --repeats 3 --json "$OUT/probe.json"
for attn in sdpa eager; do
  run python -m core bench --model $MODEL --dtype bfloat16 --attn $attn --rounds 5 --json "$OUT/bench-$attn.json"
  run python -m core bench --model $MODEL --dtype bfloat16 --attn $attn --texts 32 --min-tokens 256 \
      --max-tokens 256 --batch-size 8 --rounds 2 --json "$OUT/bench-memory-$attn.json"
done
run python -m core bench --model tiny --rounds 10 --json "$OUT/bench-tiny.json"
# `endpoint` against vLLM where vLLM is installed (it brings the openai client): does load change its answers?
if python -c "import vllm" 2>/dev/null; then
  SERVED=$(python -c "from core.builtin_models import builtin_path; print(builtin_path('$MODEL'))")
  PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  python -m vllm.entrypoints.openai.api_server --model "$SERVED" --host 127.0.0.1 --port "$PORT" \
      --dtype bfloat16 > "$OUT/vllm.log" 2>&1 &
  VLLM_PID=$!
  for _ in $(seq 90); do python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" \
      2>/dev/null && break; sleep 2; done
  run python -m core endpoint --url "http://127.0.0.1:$PORT/v1" --texts-file "$OUT/texts-32x128.txt" \
      --max-new-tokens 32 --rounds 3 --json "$OUT/endpoint-vllm.json"
  kill "$VLLM_PID"; wait "$VLLM_PID" 2>/dev/null
else
  echo "vllm is not installed: the endpoint check is skipped"
fi
python - "$OUT" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    data = json.load(open(path))
    for entry in data.get("remedies", []):
        if entry["remedy"] == "invariant":
            print(path, "invariant:", entry["applied"], entry.get("bitwise_equal"), "of", (entry["summary"] or {}).get("texts"), entry["note"])
    ratios = data.get("ratios", {})
    if "invariant_vs_compare" in ratios:
        print(path, "invariant_vs_compare", round(ratios["invariant_vs_compare"], 3),
              "invariant_generate_vs_generate", round(ratios["invariant_generate_vs_generate"], 3))
PY
