#!/usr/bin/env bash
# The README's GPU figures, as measured on a lent accelerator that reaches no package registry.
#
# Before: on a machine with pip, download the project's pure-Python dependencies that the accelerator's
# image lacks into .whl/ (wheels for its Python), and copy the embedded SmolLM2 tokenizer into
# .device/tok/ (tokenizer.json, tokenizer_config.json, special_tokens_map.json); both folders are ignored
# by git. Then, on the GPU machine, from the repository root:
#
#     OUT=runs/gpu_device bash benchmarks/gpu_device.sh                     # the loop
#     OUT=runs/gpu_device BENCH=step_speed bash benchmarks/gpu_device.sh     # a step's parts, side by side
#     OUT=runs/gpu_device BENCH=population bash benchmarks/gpu_device.sh     # issue 48: 4 x 64 sequences, one
#                                              # adapter at a time vs one batch (growing prefix, CUDA graph)
#
# It installs the wheels beside the image's own torch/transformers/peft, prints the versions, and runs
# benchmarks/gpu_loop.py (or step_speed.py) on random-init Qwen2.5-1.5B weights in bf16, the loop with
# the engines that import there.
set -uo pipefail
OUT=${OUT:-runs/gpu_device}
ENGINES=${ENGINES:-transformers}
BENCH=${BENCH:-loop}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_device: installing the carried wheels failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.txt"
python3 - <<'EOF' | tee "$OUT/versions.txt"
import importlib, torch
print("cuda available:", torch.cuda.is_available())
for name in ("torch", "transformers", "peft", "mlflow", "vllm"):
    try:
        print(name, importlib.import_module(name).__version__)
    except ImportError as e:
        print(name, "not importable:", e)
import evotrainer.loop.experiment  # noqa: F401  (fails here, fast, if a dependency is missing)
print("evotrainer imports")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_device: the environment is incomplete"; exit 1; }
if [ "$BENCH" = population ]; then
    python3 benchmarks/population_rollouts.py --random-init qwen2.5-1.5b --tokenizer .device/tok --device cuda \
        --dtype bfloat16 --branches 4 --prompts 64 --batch-size 64 --new-tokens "${NEW_TOKENS:-128}" \
        --paths transformers,together-dynamic,together-static --repeats "${REPEATS:-3}" \
        --json "$OUT/population_gpu.json" 2>&1 | tee "$OUT/population_gpu.log"
    exit "${PIPESTATUS[0]}"
fi
if [ "$BENCH" = step_speed ]; then
    python3 benchmarks/step_speed.py --random-init qwen2.5-1.5b --tokenizer .device/tok --device cuda \
        --dtype bfloat16 --repeats "${REPEATS:-3}" ${SHAPES:-} --json "$OUT/step_speed.json" 2>&1 | tee "$OUT/step_speed.log"
    exit "${PIPESTATUS[0]}"
fi
python3 benchmarks/gpu_loop.py --tokenizer .device/tok --arch qwen2.5-1.5b --device cuda --dtype bfloat16 \
    --engines "$ENGINES" --out /tmp/gpu_loop --json "$OUT/gpu_loop.json" 2>&1 | tee "$OUT/gpu_loop.log"
