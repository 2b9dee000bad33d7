#!/usr/bin/env bash
# Issue 11's GPU measurements, in steps that each end well inside one 10-minute device call.
#
# Here (a machine that reaches PyPI), once:
#     bash small_scale/gpu_session.sh prepare
# copies what the GPU machine lacks into two folders that git ignores and the device tool carries:
#   .whl/       wheels for the GPU image's Python 3.12: trl, datasets and their two missing
#               dependencies, math-verify and its two (the image has torch, transformers,
#               accelerate, pandas, pyarrow, xxhash)
#   .gpu_data/  the shared data the benchmarks read: model configs, the Qwen3 tokenizer,
#               deepmath_int, the eval sets (RPG_DATA_DIR points there)
# Then, on the GPU machine, one call per step, carry [".whl", ".gpu_data"]:
#     bash small_scale/gpu_session.sh tests    # the CUDA tests + the engine and log-prob tests
#     bash small_scale/gpu_session.sh quick    # gpu_bench.py quick: 0.6B, 1.7B, 4B
#     bash small_scale/gpu_session.sh 4b-2k    # Qwen3-4B, 2,048-token responses: peak memory
#     bash small_scale/gpu_session.sh 4b-8k    # Qwen3-4B, 8,192-token responses: peak memory
#     bash small_scale/gpu_session.sh trl      # bench_gpu_vs_trl.py: rpg-train vs TRL, ratios
# Each step writes its log and results under $OUT (the device tool's folder that comes back;
# runs/gpu_session when unset).
set -euo pipefail
cd "$(dirname "$0")/.."
step="${1:-}"

WHEELS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2)

if [ "$step" = prepare ]; then
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    for d in /.whl/ /.gpu_data/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
    rm -rf .whl .gpu_data
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
    src="${RPG_DATA_DIR:-../shared/data}"
    for need in models tokenizer/qwen3 train/deepmath_int.jsonl eval; do
        if [ ! -e "$src/$need" ]; then
            echo "gpu_session: $src/$need is missing: set RPG_DATA_DIR to the shared data folder" >&2
            exit 2
        fi
        mkdir -p ".gpu_data/$(dirname "$need")"
        cp -r "$src/$need" ".gpu_data/$need"
    done
    du -sh .whl .gpu_data
    echo "carry: [\".whl\", \".gpu_data\"]; then, on the GPU: bash small_scale/gpu_session.sh tests|quick|4b-2k|4b-8k|trl"
    exit 0
fi

case "$step" in tests|quick|4b-2k|4b-8k|trl) ;; *)
    echo "usage: bash small_scale/gpu_session.sh prepare|tests|quick|4b-2k|4b-8k|trl" >&2; exit 2;;
esac
if [ ! -d .whl ] || [ ! -d .gpu_data ]; then
    echo "gpu_session: .whl/ or .gpu_data/ is missing: run 'bash small_scale/gpu_session.sh prepare' where PyPI is reachable and carry both" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site" RPG_DATA_DIR="$PWD/.gpu_data" PYTHONUNBUFFERED=1
OUT="${OUT:-runs/gpu_session}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" >> "$OUT/gpu.txt"

case "$step" in
tests)
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_hf_engine.py \
        tests/test_logprobs.py 2>&1 | tee "$OUT/tests.log";;
quick)
    python3 small_scale/gpu_bench.py --out "$OUT/gpu.json" 2>&1 | tee "$OUT/quick.log";;
4b-2k)
    python3 small_scale/gpu_bench.py --models qwen3-4b --mode full --max-new-tokens 2048 \
        --prompts 1 --steps 2 --out "$OUT/gpu_4b_2k.json" 2>&1 | tee "$OUT/4b_2k.log";;
4b-8k)
    python3 small_scale/gpu_bench.py --models qwen3-4b --mode full --max-new-tokens 8192 \
        --prompts 1 --steps 2 --out "$OUT/gpu_4b_8k.json" 2>&1 | tee "$OUT/4b_8k.log";;
trl)
    python3 small_scale/bench_gpu_vs_trl.py --out /tmp/vs_trl 2>&1 | tee "$OUT/trl.log"
    cp /tmp/vs_trl/qwen3-0.6b-cuda/result.json "$OUT/vs_trl.json";;
esac
