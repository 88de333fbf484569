#!/usr/bin/env bash
# Issue 47's GPU figures in one call on a lent GPU machine:
# 1. the GPU check with GPU-sized token batches: environment, host synchronisations per training step, then per
#    recipe (the Transformer translation recipe first) bf16 and fp32 + TF32 tokens/s, losses, peak memory and kernel
#    share (bench/gpu_smoke.py), its step limits scaled to 224 s in all;
# 2. the time-to-quality run in the time left: the Multi30k Transformer GPU recipe
#    (tasks/configs/multi30k_de_en_transformer_gpu.yaml: the same token batches, the square-root learning-rate rule of
#    docs/scaling.md, "Batches by tokens"), at most 5 minutes of training, then its test BLEU; each epoch's line is
#    written as it ends. On an H200 about 8 minutes for both (BENCHMARKS.md, "Fast on a GPU, issue 47: on an H200").
# What comes back in $OUT: gpu_smoke.log, steps.jsonl (one line a step, written as each ends, so a call cut short
# keeps what it measured) and time_to_quality.log (its last line the JSON).
#
#   bash bench/device_wheels.sh        # here, once: the wheels that machine lacks, into .whl/
#   python bench/multi30k.py --quick   # here, once: prepares data/multi30k-de-en (git-ignored) to carry
#   # the device call, .whl and data/multi30k-de-en carried, from the checkout:
#   bash bench/gpu_check_on_device.sh 582     # seconds the whole call may take (a call's limit is 600)
#
# TIME_TO_QUALITY_EXTRA, GPU_CHECK_EXTRA: more options for each step (e.g. "--quick --set train.device=cpu" and
# "--device cpu --tiny", to try the script on a CPU first). GPU_CHECK_SECONDS: the check's outer limit (270).
# TIME_TO_QUALITY=0: no time-to-quality run (a run the call's end would cut short measures nothing).
# Whether train.compile pays (the training step four times a recipe: bf16 and fp32, eager and compiled), three
# recipes a call:
#   TIME_TO_QUALITY=0 GPU_CHECK_SECONDS=540 GPU_CHECK_EXTRA="--only environment,training --compile --limit-scale 0.75
#       --recipes translation_transformer,captioning,multitask" bash bench/gpu_check_on_device.sh 582
# Its step limits are 0.75 x (30 + 2.5 x 200) s = 398 s: the training step checks its deadline between epochs, so a
# compiled variant's first epoch (the compiling) may run past it by a minute or two, inside the 540 s; each variant's
# line is in gpu_smoke.log as it ends. One device call of this or of bench/captioning_on_device.sh fits a task's
# 15 minutes of device time, not both.
set -uo pipefail
cd "$(dirname "$0")/.."
deadline=$((SECONDS + ${1:-582}))
out=${OUT:?set OUT to the folder whose files come back}
mkdir -p "$out"  # a try-out on a CPU names a folder that may not exist yet
source bench/device_env.sh  # the carried wheels, and PYTHONPATH
tokens=(--set train.batch_tokens=8500)  # the GPU recipe's batches: about 8 x the CPU recipes' 64 pairs (1,061 padded target tokens)
recipes=translation_transformer,translation,captioning_transformer,multitask_transformer,captioning,multitask

# Step limits 0.7 x (30 + 90 + 200) s = 224 s without --compile (five recipes' host syncs took 43 s on an H200); the
# outer timeout only for a hang past them.
# shellcheck disable=SC2086  # the EXTRA variables hold several options
timeout "${GPU_CHECK_SECONDS:-270}" python3 bench/gpu_smoke.py --out "$out" --only environment,host_syncs,training --recipes "$recipes" \
    --steps 100 --limit-scale 0.7 "${tokens[@]}" ${GPU_CHECK_EXTRA:-} >"$out/gpu_smoke.log" 2>&1
echo "gpu check: exit $? at ${SECONDS}s" | tee -a "$out/gpu_smoke.log"

left=$((deadline - SECONDS - 5))
if [[ ${TIME_TO_QUALITY:-1} == 0 ]]; then
    echo "time to quality: skipped (TIME_TO_QUALITY=0)" | tee "$out/time_to_quality.log"
    exit 0
fi
if ((left < 60)); then
    echo "time to quality: skipped, ${left}s left of the call" | tee "$out/time_to_quality.log"
    exit 0
fi
# shellcheck disable=SC2086
timeout "$left" python3 bench/multi30k.py --config tasks/configs/multi30k_de_en_transformer_gpu.yaml \
    --no-progress --out /tmp/time-to-quality ${TIME_TO_QUALITY_EXTRA:-} >"$out/time_to_quality.log" 2>&1
echo "time to quality: exit $? at ${SECONDS}s" | tee -a "$out/time_to_quality.log"
