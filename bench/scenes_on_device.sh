#!/usr/bin/env bash
# Both scene benches (the RNN recipe, then the Transformer one) in one call on a lent GPU machine, with the
# importance maps scored against the ground truth (issue 32). What comes back in $OUT, flat (8 files at most):
# each bench's log (its last line the JSON), and each joint model's best.pt and last.pt without the optimizer
# state (small enough to come back; `bench/scenes.py --evaluate-only --out DIR` reads them from DIR/joint/).
#
#   bash bench/device_wheels.sh                      # here, once: the wheels that machine lacks, into .whl/
#   # the device call, .whl carried, from the checkout:
#   bash bench/scenes_on_device.sh 560               # seconds the whole call may take
#
# Training is fp32 (TF32 matmuls) as on the CPU; bf16 trained these scene models 18-25 % slower on an H200
# (BENCHMARKS.md, "Fast on a GPU, issue 47: on an H200"). Each model stops by its own early stopping, as on the
# CPU; --minutes only caps it. The Transformer gets whatever time the RNN left: where it runs out, the log says so
# and its checkpoints still come back, to be evaluated elsewhere with --evaluate-only.
set -uo pipefail
cd "$(dirname "$0")/.."
deadline=$((SECONDS + ${1:-560}))
out=${OUT:?set OUT to the folder whose files come back}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=src:/tmp/site:.whl/lite PYTHONUNBUFFERED=1  # .whl/lite: BLEU and CIDEr-D (device_wheels.sh)

slim() {  # $1: run folder, $2: prefix of the copies in $out
    for name in best last; do
        [ -f "$1/joint/$name.pt" ] || continue
        python3 - "$1/joint/$name.pt" "$out/$2-$name.pt" <<'EOF'
import sys
from dataclasses import replace
from attnkit.checkpoint import load_checkpoint, save_checkpoint
checkpoint = load_checkpoint(sys.argv[1])
save_checkpoint(sys.argv[2], replace(checkpoint, training={**checkpoint.training, "optimizer": {}}))
EOF
    done
}

scenes() {  # $1: name, $2: recipe, $3: seconds kept back for what follows; trains, evaluates, slims the checkpoints
    timeout $((deadline - SECONDS - $3)) python3 bench/scenes.py --config "$2" --no-separate --minutes 4 \
        --set train.precision=fp32 --out "/tmp/scenes-$1" --no-progress >"$out/scenes-$1.log" 2>&1
    echo "$1: exit $? at ${SECONDS}s" | tee -a "$out/scenes-$1.log"
    slim "/tmp/scenes-$1" "$1"
}

scenes rnn tasks/configs/scenes_multitask.yaml 150           # the Transformer's time and the copies after it
scenes transformer tasks/configs/scenes_transformer.yaml 20
ls -la "$out"
