# Sourced, from the checkout's root, by the scripts that run on the lent GPU machine and go on without carried
# wheels when tried on a CPU first (gpu_check_on_device.sh, captioning_on_device.sh): installs the wheels in .whl/
# (bench/device_wheels.sh) when there are any, and puts src, them and .whl/lite (pycocoevalcap's BLEU and CIDEr-D
# alone; METEOR needs its jar and Java) on PYTHONPATH.
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=src:/tmp/site:.whl/lite PYTHONUNBUFFERED=1
