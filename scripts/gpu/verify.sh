#!/usr/bin/env bash
# The GPU host's side of scripts/gpu/prepare.sh (call 2, with .c2 carried and .c1's part already in
# /root/stash): join and install vLLM and the platform's missing wheels into /tmp/site, then verify the GPU
# path: `doctor`, `doctor --smoke` (one GPU: the trainer and a colocated vLLM actor, updates by CUDA IPC),
# `pytest -m gpu`, and the decode sweep when time is left. Each step has its own time limit and the next
# runs after a failure; everything is logged to $OUT/log.txt, with the smoke record, the tests' JUnit XML,
# the runs' logs and records (runs.tgz) and the decode sweep beside it. BUDGET: seconds for the whole.
set -u
T0=$SECONDS
export PYTHONUNBUFFERED=1
C=$PWD/.c2
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== [$((SECONDS - T0)) s] $*"; }
left() { echo $(( ${BUDGET:-520} - (SECONDS - T0) )); }
step "host"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; nproc; python3 -V; command -v python3
step "install"
mkdir -p /root/stash /tmp/site
cp "$C"/vllm.tar.xz.part-* /root/stash/
(cd /root/stash && cat vllm.tar.xz.part-* > vllm.tar.xz && sha256sum -c "$C/SHA256SUMS") || { echo "CHECKSUM FAILED"; exit 3; }
if command -v xz >/dev/null; then tar -xJf /root/stash/vllm.tar.xz -C /tmp/site; else
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" /root/stash/vllm.tar.xz /tmp/site; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$C"/deps/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -5
du -sh /tmp/site
export PYTHONPATH=/tmp/site:$PWD
PY=$(command -v python3)
mkdir -p .venv-vllm/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$PY" > .venv-vllm/bin/python && chmod +x .venv-vllm/bin/python
step "imports"
timeout 120 python3 -c "
import time; t=time.perf_counter()
import torch, transformers, vllm, deepspeed, pydantic, zmq, msgspec
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.vllm_flash_attn.flash_attn_interface import FA3_AVAILABLE, FA3_UNAVAILABLE_REASON
print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__,
      'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0), 'FA3', FA3_AVAILABLE, FA3_UNAVAILABLE_REASON, f'{time.perf_counter()-t:.1f} s')
"
SETS=(--set tracking.enabled=false --set "run.home=$C/home" --set actor.engine=vllm)
step "doctor (machine, config, engines, collectives)"
timeout 120 python3 "$C/pipelinerl" doctor --only machine --only config --only engines --only collectives "${SETS[@]}"
echo "doctor rc=$?"
step "doctor --smoke (1 GPU: colocated vLLM actor, CUDA IPC)"
timeout 260 python3 "$C/pipelinerl" doctor --smoke --only machine --record "$OUT/smoke-nvidia-h200.json" "${SETS[@]}"
echo "smoke rc=$?"
step "pytest -m gpu"
timeout $(( $(left) > 200 ? 200 : $(left) - 20 )) python3 -m pytest -m gpu -p no:cacheprovider -q -rA --timeout 170 \
  --junitxml="$OUT/gpu-junit.xml" tests/unit/workers/test_policy_step.py tests/unit/workers/test_recipes_step.py \
  tests/integration/test_weight_group.py tests/integration/test_vllm_engine.py
echo "pytest rc=$?"
step "collect"
tar -czf "$OUT/runs.tgz" --exclude="*.safetensors" --exclude="*.bin" --exclude="*.pt" --exclude="checkpoint*" --exclude="*.whl" runs /tmp/pytest-of-root 2>/dev/null
ls -la "$OUT"
if (( $(left) > 110 )); then
  step "decode sweep, Qwen2.5-0.5B shape, bf16, CUDA graphs ($(left) s left)"
  timeout $(( $(left) - 15 )) python3 "$C/decode_sweep.py" --shape 0.5b --model /root/q05b --out "$OUT/decode-h200-0.5b.json"
  echo "decode rc=$?"
fi
step "done"
