#!/usr/bin/env bash
# The GPU checks as one prepared command, for a lent GPU machine that has torch/torchvision with CUDA, numpy,
# pillow, opencv, scikit-image, psutil, pytest, nvidia-ml-py but no network: the rest comes as wheels in .whl/
# (pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 ...: lmdb,
# webdataset, braceexpand, albumentations, albucore, pydantic(-core), annotated_types, typing_inspection,
# typing_extensions, stringzilla, simsimd, nvidia-nvimgcodec-cu13, nvidia-nvjpeg 13.x).
#
#   bash benchmarks/gpu_device_run.sh [quick|full|feed]      results in $OUT (default /tmp/gpu-out)
#
# quick: the cuda-marked tests, the decode table on 2,048 photos, the training feed for ResNet-18 once (~3 min);
# full: the cuda-marked tests, the decode table and the training feed table on 6,144 photos (~8 min);
# feed: the cuda-marked tests and the training feed table on 6,144 photos (~6 min).
set -u
mode=${1:-full}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
started=$(date +%s)
say() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$OUT/log.txt"; }

say "installing the carried wheels"
python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD
export LD_LIBRARY_PATH=$(ls -d /tmp/site/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
python3 setup.py build_ext --inplace > "$OUT/build.txt" 2>&1 || say "C extension build failed (see build.txt)"
[ -d fastdata/converters ] || cp -r converters fastdata/converters  # what the install's package-dir mapping does
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/log.txt"
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)" \
  | tee -a "$OUT/log.txt"
python3 -c "from fastdata.image.device.decoders import nvimgcodec_missing as m; print('nvimgcodec:', m() or 'ok')" \
  2>&1 | tail -1 | tee -a "$OUT/log.txt"

say "cuda-marked tests"
timeout 100 python3 -m pytest -q -m cuda -p no:cacheprovider tests/image > "$OUT/cuda_tests.txt" 2>&1
tail -15 "$OUT/cuda_tests.txt" | tee -a "$OUT/log.txt"

if [ "$mode" = quick ]; then
  images=2048; repeats=1; models=resnet18; budget=15
else
  images=6144; repeats=2; models=resnet18,resnet50; budget=25
fi
if [ "$mode" != feed ]; then
say "decode table ($images photos)"
timeout 120 python3 benchmarks/gpu_check.py --images "$images" --repeats "$([ "$mode" = quick ] && echo 1 || echo 3)" \
  --out /tmp/gpu-data --json "$OUT/gpu_check.json" > "$OUT/gpu_check.txt" 2>&1
tail -14 "$OUT/gpu_check.txt" | tee -a "$OUT/log.txt"
fi

say "training feed ($models, $repeats repeats)"
timeout 330 python3 benchmarks/gpu_train_feed.py --images "$images" --models "$models" --repeats "$repeats" \
  --tune-budget "$budget" --out /tmp/gpu-data --json "$OUT/gpu_train_feed.json" > "$OUT/gpu_train_feed.txt" 2>&1
grep -v "nvjpeg2k\|nvtiff\|Note:" "$OUT/gpu_train_feed.txt" | tail -45 | tee -a "$OUT/log.txt"
say "done"
