#!/usr/bin/env bash
# The GPU measurements of docs/gpu.md, on a machine with one CUDA GPU and no network.
#
# Here (a machine that reaches PyPI), once:
#     bash small_scale/bench/gpu_session.sh prepare
# copies what the GPU machine lacks into two folders that git ignores and the device tool carries:
#   .whl/       wheels for the GPU image's Python (3.12; GPU_PYTHON=3.11 for another): tyro and
#               its two missing dependencies (rpg-train's command line), trl, datasets and their
#               two, math-verify and its two (the image has torch, transformers, accelerate,
#               pandas, pyarrow, xxhash, pytest)
#   .gpu_data/  the shared data the benchmarks read: model configs, the Qwen3 tokenizer,
#               deepmath_int, the eval sets (RPG_DATA_DIR points there)
# Then, on the GPU machine, carry [".whl", ".gpu_data"] and run, in one call:
#     bash small_scale/bench/gpu_session.sh all      # everything below, each part under a time cap: <= 8 min
# or one step per call:
#     bash small_scale/bench/gpu_session.sh tests    # the CUDA tests + the engine and log-prob tests
#     bash small_scale/bench/gpu_session.sh default  # the default rpg-train (seq preset) on the GPU
#     bash small_scale/bench/gpu_session.sh gen      # bench/gpu.py quick, Qwen3-0.6B: batch 32 x 512 tokens
#     bash small_scale/bench/gpu_session.sh quick    # bench/gpu.py quick: 0.6B, 1.7B, 4B
#     bash small_scale/bench/gpu_session.sh 4b-2k    # Qwen3-4B, 2,048-token responses: peak memory
#     bash small_scale/bench/gpu_session.sh 4b-8k    # Qwen3-4B, 8,192-token responses: peak memory
#     bash small_scale/bench/gpu_session.sh trl      # bench/gpu_vs_trl.py: rpg-train vs TRL, ratios
# Each step writes its log and results under $OUT (the device tool's folder that comes back, at
# most 8 files; runs/gpu_session when unset). `all` writes gpu.txt, all.log (every part's output),
# parts.json (each part's exit code and seconds), default_summary.json, gpu.json (0.6B),
# gpu_4b_2k.json and vs_trl.json.
# GPU_SESSION_DEVICE=cpu runs the same steps on a CPU (tiny model, smoke settings): a rehearsal of
# the script, whose numbers say nothing about a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
step="${1:-}"

WHEELS=(tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
        trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
        math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2)
# what the GPU image already has of what rpg-ref and the benchmarks import (its Python's packages);
# every runtime dependency of pyproject.toml is here or in WHEELS (tests/test_gpu_bench.py)
IMAGE_HAS=(torch numpy safetensors transformers accelerate pandas pyarrow xxhash pytest psutil)
STEPS="all|tests|default|gen|quick|4b-2k|4b-8k|trl"

if [ "$step" = prepare ]; then
    exclude="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$exclude")"
    for d in /.whl/ /.gpu_data/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
    rm -rf .whl .gpu_data
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
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
    echo "carry: [\".whl\", \".gpu_data\"]; then, on the GPU: bash small_scale/bench/gpu_session.sh $STEPS"
    exit 0
fi

case "|$STEPS|" in *"|$step|"*) ;; *)
    echo "usage: bash small_scale/bench/gpu_session.sh prepare|$STEPS" >&2; exit 2;;
esac
if [ ! -d .whl ] || [ ! -d .gpu_data ]; then
    echo "gpu_session: .whl/ or .gpu_data/ is missing: run 'bash small_scale/bench/gpu_session.sh prepare' where PyPI is reachable and carry both" >&2
    exit 2
fi
DEVICE="${GPU_SESSION_DEVICE:-cuda}"
case "$DEVICE" in cuda|cpu) ;; *)
    echo "gpu_session: GPU_SESSION_DEVICE is '$DEVICE': cuda (the default) or cpu (a rehearsal)" >&2; exit 2;;
esac
site="$(mktemp -d)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl
export PYTHONPATH="$PWD:$site" RPG_DATA_DIR="$PWD/.gpu_data" PYTHONUNBUFFERED=1
for m in "${IMAGE_HAS[@]}"; do
    python3 -c "import $m" 2>/dev/null || {
        echo "gpu_session: this Python ($(command -v python3)) has no $m: add its wheel to WHEELS and run prepare again" >&2
        exit 2; }
done
OUT="${OUT:-runs/gpu_session}"
mkdir -p "$OUT"
scratch="$(mktemp -d)"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
  echo "device: $DEVICE; commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"; } > "$OUT/gpu.txt"

# one step: its command line (the benchmarks' --device is the session's device)
run_step() {
    case "$1" in
    tests)   python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_hf_engine.py \
                 tests/test_logprobs.py;;
    default) rm -rf "$scratch/default"
             python3 -m rpg_ref.cli --device "$DEVICE" --out "$scratch/default" --no-progress &&
                 cp "$scratch/default/summary.json" "$OUT/default_summary.json";;
    gen)     if [ "$DEVICE" = cuda ]; then m=(--models qwen3-0.6b); else m=(); fi
             python3 -m small_scale.bench.gpu --device "$DEVICE" "${m[@]}" --out "$OUT/gpu.json";;
    quick)   python3 -m small_scale.bench.gpu --device "$DEVICE" --out "$OUT/gpu_quick.json";;
    4b-2k|4b-8k)
             if [ "$DEVICE" = cuda ]; then
                 tokens=$([ "$1" = 4b-2k ] && echo 2048 || echo 8192)
                 m=(--models qwen3-4b --mode full --max-new-tokens "$tokens" --prompts 1 --steps 2)
             else m=(); fi
             python3 -m small_scale.bench.gpu --device "$DEVICE" "${m[@]}" \
                 --out "$OUT/gpu_${1//-/_}.json";;
    trl)     rm -rf "$scratch/vs_trl"
             python3 -m small_scale.bench.gpu_vs_trl --device "$DEVICE" --out "$scratch/vs_trl" &&
                 cp "$scratch"/vs_trl/*/result.json "$OUT/vs_trl.json";;
    esac
}

if [ "$step" != all ]; then
    set -o pipefail
    run_step "$step" 2>&1 | tee "$OUT/$step.log"
    exit "${PIPESTATUS[0]}"
fi

# all: each part under its cap (seconds; together 465 s, so the call ends within 8 minutes with
# the install), in the order of what matters most; a part that fails or runs out of time is
# recorded and the next one runs
PARTS=(tests:60 default:90 gen:90 4b-2k:135 trl:90)
: > "$OUT/all.log"
echo "[" > "$scratch/parts"
sep=""
for p in "${PARTS[@]}"; do
    name="${p%%:*}" cap="${p##*:}"
    echo "=== $name (cap ${cap} s) ===" | tee -a "$OUT/all.log"
    t0=$(date +%s)
    set +e
    ( export -f run_step; export DEVICE OUT scratch
      timeout --signal=TERM --kill-after=10 "$cap" bash -c "run_step $name" ) >> "$OUT/all.log" 2>&1
    rc=$?
    set -e
    secs=$(( $(date +%s) - t0 ))
    echo "=== $name: exit $rc in ${secs} s$([ "$rc" = 124 ] && echo ' (ran out of time)') ===" | tee -a "$OUT/all.log"
    printf '%s {"part": "%s", "exit": %d, "seconds": %d, "cap_s": %d}\n' "$sep" "$name" "$rc" "$secs" "$cap" >> "$scratch/parts"
    sep=","
done
echo "]" >> "$scratch/parts"
cp "$scratch/parts" "$OUT/parts.json"
cat "$OUT/parts.json"
