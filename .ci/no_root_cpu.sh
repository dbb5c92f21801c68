#!/usr/bin/env bash
# CI, second job: the README's no-root install. A fresh virtualenv with no
# system OpenCL driver visible (OCL_ICD_VENDORS names an empty folder, so
# Debian's PoCL is hidden), `pip install -e '.[cpu,test]'` (Intel's CPU
# OpenCL runtime from PyPI, which caffe_ocl registers itself), then a
# representative subset: the layer tests, the pip-driver registration, the
# README's commands from a fresh copy, and a short demo. Needs no root.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
work="$(mktemp -d)"
if ! python3 -m venv "$work/venv" 2>/dev/null; then   # Debian's python3 without ensurepip
  rm -rf "$work/venv"
  if command -v apt-get >/dev/null; then apt-get install -y -qq python3-venv >/dev/null; fi
  python3 -m venv "$work/venv"
fi
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q -e '.[cpu,test]'
echo "no-root job: installed in $((SECONDS - start)) s"

mkdir "$work/no-icd"
export OCL_ICD_VENDORS="$work/no-icd"
export CAFFE_OCL_CACHE="$work/cache"          # a cold kernel cache, as a new user has
unset CAFFE_OCL_DEVICE
"$py" -m caffe_ocl device_query | tee "$work/devices.txt"
grep -q "Intel(R) OpenCL" "$work/devices.txt"

# the layer tests
sel=tests/layers
"$py" -m pytest -q -p no:cacheprovider -n 2 $sel tests/test_device_pip_driver.py \
  tests/commands/test_readme_usage.py tests/test_real_caffe_model.py
echo "no-root job: tests done at $((SECONDS - start)) s"

"$work/venv/bin/caffe_ocl" demo --workdir "$work/demo" --max_iter 200
echo "no-root job: done in $((SECONDS - start)) s"
rm -rf "$work"
