#!/usr/bin/env bash
# Prepares what an air-gapped GPU host (the `device` tool's H200: Python 3.12, torch 2.11 + CUDA 13,
# transformers 5.17, no vLLM, DeepSpeed, pyzmq or pydantic, no network) needs to verify the platform's
# GPU path, in two carried folders that each fit the 64 MiB a call may carry beside the working tree:
#
#   bash scripts/gpu/prepare.sh            (here, in the checkout's root; about 5 minutes)
#   call 1: carry .c1, run  mkdir -p /root/stash && cp .c1/* /root/stash/
#   call 2 (within 30 s, while the machine is warm): carry .c2, run  BUDGET=500 bash .c2/verify.sh
#
# .c1: the first part of vLLM 0.26.0 (its wheel less FA2's kernels, which a Hopper GPU does not use,
#      the MoE kernels, the Rust front end and DeepGEMM's builds for other Pythons), as tar.xz;
# .c2: the last part, its SHA-256, the dependency wheels (wheels.txt, DeepSpeed built without ops),
#      the embedded model's warm start (run.home), verify.sh, decode_sweep.py and a `pipelinerl` launcher.
# verify.sh installs into /tmp/site, then runs `doctor`, `doctor --smoke`, `pytest -m gpu` and, time
# permitting, decode_sweep.py, each under its own time limit, logging to $OUT.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
HERE=scripts/gpu
CACHE=${PIPELINERL_GPU_CACHE:-$HOME/.cache/pipelinerl/gpu}
VLLM=vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl
mkdir -p "$CACHE" .git/info
for path in /.c1/ /.c2/ /.venv-vllm/; do grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude; done

platforms=()
for tag in manylinux1 manylinux2014 manylinux_2_5 manylinux_2_12 manylinux_2_17 manylinux_2_24 manylinux_2_26 \
  manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_39; do
  platforms+=(--platform "${tag}_x86_64")
done
download() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

echo "1/4 vLLM 0.26.0, trimmed for Hopper"
[[ -f $CACHE/$VLLM ]] || download -d "$CACHE" vllm==0.26.0
if [[ ! -f $CACHE/vllm-trim.tar.xz ]]; then
  trim=$(mktemp -d)
  unzip -q "$CACHE/$VLLM" -d "$trim" -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
    'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/deep_gemm/_C.cpython-31[0134]-*'
  tar -C "$trim" -cf - . | xz -9 -T2 >"$CACHE/vllm-trim.tar.xz.tmp"
  mv "$CACHE/vllm-trim.tar.xz.tmp" "$CACHE/vllm-trim.tar.xz"
  rm -rf "$trim"
fi

echo "2/4 dependency wheels (cp312 manylinux) and DeepSpeed without ops"
rm -rf .c1 .c2
mkdir -p .c1 .c2/deps .c2/home/warmstart
mapfile -t specs < <(grep -vE '^\s*(#|$)' $HERE/wheels.txt | awk '{print $1}')
download -d .c2/deps "${specs[@]}"
deepspeed=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('deepspeed'))")
[[ -f $CACHE/deepspeed-$deepspeed-py3-none-any.whl ]] ||
  DS_BUILD_OPS=0 .venv/bin/pip wheel -q --no-deps --no-build-isolation "deepspeed==$deepspeed" -w "$CACHE"
cp "$CACHE/deepspeed-$deepspeed-py3-none-any.whl" .c2/deps/

echo "3/4 the embedded model's warm start"
warm=$(.venv/bin/python -c "from pipelinerl.launch.model_source import resolve_model
from pipelinerl.platform.config import load_config
print(resolve_model(load_config()))" | tail -1)
cp -r "$warm" .c2/home/warmstart/

echo "4/4 the two carried folders"
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
part=$((63 * 1024 * 1024 - tree - 512 * 1024))
split -b "$part" -d -a 2 "$CACHE/vllm-trim.tar.xz" .c1/vllm.tar.xz.part-
mv .c1/vllm.tar.xz.part-01 .c2/
[[ ! -e .c1/vllm.tar.xz.part-02 ]] || { echo "vLLM needs more than two parts" >&2; exit 1; }
(cd "$CACHE" && sha256sum vllm-trim.tar.xz | sed 's/vllm-trim.tar.xz/vllm.tar.xz/') >.c2/SHA256SUMS
cp $HERE/verify.sh $HERE/decode_sweep.py .c2/
printf '#!/usr/bin/env python3\nfrom pipelinerl.cli import app\n\napp()\n' >.c2/pipelinerl
for folder in .c1 .c2; do
  size=$(du -sb "$folder" | cut -f1)
  printf '%s: %.1f MiB (+ the working tree, %.1f MiB)\n' "$folder" "$(bc -l <<<"$size/1048576")" "$(bc -l <<<"$tree/1048576")"
  ((size + tree <= 64 * 1024 * 1024)) || { echo "$folder is over the 64 MiB a call carries" >&2; exit 1; }
done
