#!/usr/bin/env bash
# bench/pretrain.py on a lent GPU machine in one call: the eight arms (full data and the slice, scratch and
# pre-trained, seeds 1 and 2) at once, each a process of its own on the one GPU, then the summary and the head
# figure. All eight share the GPU and the 16 cores through the same minutes, so each arm meets the same
# conditions; the minutes per arm are the only budget (pre-training counted in the pre-trained arms).
#
#   bash bench/device_wheels.sh        # here, once: the wheels that machine lacks, into .whl/
#   # the device call, .whl and data/multi30k-de-en carried (python bench/pretrain.py --prepare makes the latter here):
#   bash bench/pretrain_on_device.sh 6 560      # minutes per arm, seconds the whole call may take
#
# Training is fp32 with TF32 matmuls, as when BENCHMARKS.md's figures were measured (the Transformer translator then
# ran 7x slower in bf16 there; since issue 47 it runs 1.1x faster in bf16, not re-measured for pre-training).
# What comes back in $OUT: run.log (the summary; its last line the JSON), table.md, heads.json, heads.png and
# logs.tar.gz (each arm's log, result and log.jsonl).
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-6}
deadline=$((SECONDS + ${2:-560}))
out=${OUT:?set OUT to the folder whose files come back}
runs=${PRETRAIN_RUNS:-/tmp/bench-pretrain}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site:.whl/lite PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/run.log"
# PRETRAIN_EXTRA: more options of every bench/pretrain.py call (e.g. --quick, to try this script on a CPU first)
common=(--out "$runs" --minutes "$minutes" --no-progress --set train.precision=fp32 --set train.num_workers=1 --set train.threads=2 ${PRETRAIN_EXTRA:-})
python3 bench/pretrain.py "${common[@]}" --prepare >>"$out/run.log" 2>&1 || exit 1
mkdir -p "$runs/logs"
for data in full slice; do
    for seed in 1 2; do
        for arm in scratch pretrained; do
            timeout $((deadline - SECONDS - 60)) python3 bench/pretrain.py "${common[@]}" --data $data --seed $seed --arm $arm --no-summary \
                >"$runs/logs/$data-$arm-seed$seed.log" 2>&1 &
        done
    done
done
wait
echo "arms done at ${SECONDS}s" >>"$out/run.log"
timeout $((deadline - SECONDS - 10)) python3 bench/pretrain.py "${common[@]}" --summarise >>"$out/run.log" 2>&1
echo "summary: exit $? at ${SECONDS}s" >>"$out/run.log"
cp "$runs"/table.md "$runs"/heads.json "$runs"/heads.png "$out"/ 2>/dev/null
tar -czf "$out/logs.tar.gz" -C "$runs" logs results $(cd "$runs" && ls -d */log.jsonl 2>/dev/null)
ls -la "$out"
