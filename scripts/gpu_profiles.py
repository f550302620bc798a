"""Build the shipped GPU cost profiles (pipelinerl/plan/profiles/h100-*.json, h200-*.json) from published
figures, with the arithmetic here and each figure's source in the file it writes.

    .venv/bin/python scripts/gpu_profiles.py            # writes the six profiles
    .venv/bin/python scripts/gpu_profiles.py --check    # fails if a written profile differs

No figure here was measured by this platform on a GPU: they are published component costs, or derived
from them with the physics of a decode step (its weights and KV cache read from memory), as said per
figure. docs/plan.md lists the sources; replace a profile with `pipelinerl plan calibrate` on the
platform's own GPU runs once there are some.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipelinerl.plan.paper import LENGTHS as PAPER_LENGTHS

OUT = Path(__file__).resolve().parent.parent / "pipelinerl" / "plan" / "profiles"

# Peak bf16 dense FLOP/s is the same on both (one GH100 die); HBM bandwidth differs.
PEAK_FLOPS = 989.5e12  # NVIDIA H100 SXM datasheet; inference-sim/inference-sim hardware_config.json
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s: NVIDIA's H100 SXM and H200 product pages

# BLIS's vLLM step-time model fitted to real vLLM traces (inference-sim/inference-sim defaults.yaml,
# trained_physics_coefficients @ f90a1e3a): a step costs beta_weight x (weights / bandwidth) + a
# per-layer and a per-step overhead; each cached token read costs beta_kv x (its bytes / bandwidth).
BLIS = "inference-sim/inference-sim defaults.yaml trained_physics_coefficients @ f90a1e3a"
BETA_WEIGHT, BETA_KV = 1.3625, 1.9471
PER_LAYER_S, PER_STEP_S, PER_REQUEST_S = 32.10e-6, 126.0e-6, 4.417e-6
TP_STEP_S = (
    2e-3  # a tensor-parallel engine's all-reduces: BLIS's 7B TP2 fit (5.70 ms) over its physics (3.9 ms)
)
DECODE_GEMM_EFFICIENCY = {"0.5B": 0.3, "7B": 0.7, "32B": 0.7}  # 7B: matches BLIS's blackbox 25.4 us/sequence
PREFILL_MFU = {"0.5B": 0.25, "7B": 0.45, "32B": 0.45}  # BLIS hardware_config.json mfuPrefill 0.45 (H100)
# The trainer: 6 x params FLOPs a trained token at a model FLOPs utilisation (MFU) between 0.15 (what the
# paper's 48:80 split implies if it was balanced) and 0.30 (Llama 3's 38-43 %, arXiv 2407.21783 Table 4,
# less activation recompute); not published for a DeepSpeed ZeRO-3 RL trainer.
TRAIN_MFU = {"0.5B": 0.15, "7B": 0.25, "32B": 0.25}
TRAIN_BASE_S = {"0.5B": 0.5, "7B": 1.0, "32B": 3.0}  # an estimate: no published figure
TRAINER_GPUS = 8  # the step-time figures are for one node of 8 trainer GPUs; plan/cluster.py scales them
# The trainer's broadcast of the weights (NCCL, across nodes), anchored on published runs.
TRANSFER_S = {"0.5B": 0.2, "7B": 0.5, "32B": 2.3}
TRANSFER_SOURCE = {
    "0.5B": "huggingface/trl PR #5892: ~0.18 s weight_sync_time, Qwen3-0.6B, H100, vLLM's NCCL API",
    "7B": "15.2 GB over ~40 GB/s InfiniBand = 0.38 s plus per-tensor overhead; verl one_step_off_policy "
    "README: 'under 300ms' (7B, H20); NeMo-RL nccl-reshard-refit.md: 0.21-0.34 s (4B, H100)",
    "32B": "huggingface/trl PR #7131: '32B weight sync is ~2.3s' (Qwen3-32B, 16+16 H200)",
}
# The trainer's link to the engines, as the transfer's cost model (plan/transfer.py) reads it: the bytes
# over InfiniBand at the ~40 GB/s the 7B anchor above assumes, a cost a bucket (an estimate: an NCCL
# broadcast's latency and launch, tens to hundreds of microseconds), and the rest of each anchored
# transfer as a fixed cost, at the platform's default bucket size.
LINK = "NCCL over InfiniBand (about 40 GB/s)"
LINK_BYTES_PER_S = 40e9
PER_BUCKET_S = 0.2e-3
ANCHOR_BUCKET_BYTES = 32 * 2**20  # transport.weight_bucket_mib's default
# The trainer's step estimates are taken as ZeRO-3's: the stage of the reference PipelineRL's DeepSpeed
# configuration (ServiceNow/PipelineRL conf/deepspeed/deepspeed_stage3_*.json).
ZERO_STAGE = 3
# The reference PipelineRL (ServiceNow/PipelineRL pipelinerl/vllm1.py @ 58d39345) pauses generation for
# the whole per-tensor broadcast: the pause is the transfer and the pause's own cost (~0.03-0.1 s: TRL PR
# #7178, 0.030 s; marin issue #8955, median 0.107 s).
PAUSE_OVERHEAD_S = 0.05


@dataclass(frozen=True)
class Model:
    size: str
    params: float  # parameters
    layers: int
    weights_read: float  # bytes read per decode step (bf16, without the input embedding)
    kv_bytes_per_token: int  # 2 (K, V) x layers x KV heads x head dim x 2 bytes
    source: str


MODELS = [
    Model("0.5B", 0.494e9, 24, 0.99e9, 12_288, "Qwen/Qwen2.5-0.5B config.json; arXiv 2412.15115 Table 1"),
    Model("7B", 7.62e9, 28, 14.1e9, 57_344, "Qwen/Qwen2.5-7B config.json; arXiv 2412.15115 Table 1"),
    Model("32B", 32.76e9, 64, 64.0e9, 262_144, "Qwen/Qwen2.5-32B config.json"),
]
# An engine's GPUs: 32B at TP1 on an H100 leaves no room for 8K-token sequences' KV cache.
TENSOR_PARALLEL = {("H100", "32B"): 2, ("H200", "32B"): 1}


def figure(value: float, source: str, unit: str = "s") -> dict[str, object]:
    return {"value": float(f"{value:.4g}"), "unit": unit, "source": source}


def profile(gpu: str, model: Model) -> dict[str, object]:
    tp = TENSOR_PARALLEL.get((gpu, model.size), 1)
    bandwidth = BANDWIDTH[gpu]
    base = BETA_WEIGHT * model.weights_read / (tp * bandwidth) + PER_LAYER_S * model.layers + PER_STEP_S
    base += TP_STEP_S if tp > 1 else 0.0
    per_sequence = 2 * model.params / (tp * PEAK_FLOPS * DECODE_GEMM_EFFICIENCY[model.size]) + PER_REQUEST_S
    per_context = BETA_KV * model.kv_bytes_per_token / (tp * bandwidth)
    prefill = 2 * model.params / (tp * PEAK_FLOPS * PREFILL_MFU[model.size])
    per_token_gpu_s = 6 * model.params / (PEAK_FLOPS * TRAIN_MFU[model.size])
    transfer = TRANSFER_S[model.size]
    derived = f"derived: {BLIS}, {model.source}, {gpu} {bandwidth / 1e12:g} TB/s"
    figures = {
        "decode_base_s": figure(base, f"{derived}; weights {model.weights_read / 1e9:g} GB / TP {tp}"),
        "decode_per_sequence_s": figure(
            per_sequence,
            f"derived: 2 x params FLOPs at {DECODE_GEMM_EFFICIENCY[model.size]:g} of {PEAK_FLOPS / 1e12:g} "
            f"TFLOP/s (TP {tp}) + {BLIS} per-request 4.4 us; 7B matches BLIS's blackbox Qwen2.5-7B H100 fit "
            "(25.4 us)",
        ),
        "decode_per_context_token_s": figure(
            per_context, f"{derived}; KV {model.kv_bytes_per_token} B a token, beta_kv {BETA_KV}"
        ),
        "prefill_per_token_s": figure(
            prefill,
            f"derived: 2 x params FLOPs at MFU {PREFILL_MFU[model.size]:g} (inference-sim "
            f"hardware_config.json mfuPrefill 0.45 for H100), TP {tp}",
        ),
        "train_base_s": figure(TRAIN_BASE_S[model.size], "estimate: no published per-step fixed cost"),
        "train_per_token_s": figure(
            per_token_gpu_s / TRAINER_GPUS,
            f"estimate: 6 x params FLOPs a token at MFU {TRAIN_MFU[model.size]:g} (0.15-0.30: arXiv "
            f"2407.21783 Table 4 less recompute; the paper's 48:80 split) on {TRAINER_GPUS} GPUs",
        ),
        "train_per_sequence_s": figure(0.0, "not separated from the per-token cost"),
        "transfer_s": figure(transfer, TRANSFER_SOURCE[model.size]),
        "update_pause_s": figure(
            transfer + PAUSE_OVERHEAD_S,
            "ServiceNow/PipelineRL pipelinerl/vllm1.py @ 58d39345 pauses for the whole broadcast: the "
            "transfer + 0.05 s (TRL PR #7178: 0.030 s; marin issue #8955: median 0.107 s)",
        ),
    }
    update_bytes = int(2 * model.params)  # bf16
    buckets = -(-update_bytes // ANCHOR_BUCKET_BYTES)
    fixed = max(0.0, transfer - update_bytes / LINK_BYTES_PER_S - buckets * PER_BUCKET_S)
    return {
        "name": f"{gpu.lower()}-{model.size.lower()}",
        "description": (
            f"Qwen2.5-{model.size} on {gpu}: vLLM engines of {tp} GPU{'s' if tp > 1 else ''}, a DeepSpeed "
            "trainer; published and derived figures (scripts/gpu_profiles.py), not this platform's GPU runs"
        ),
        "figures": figures,
        "hardware": {
            "gpu": gpu,
            "gpus_per_engine": tp,
            "trainer_gpus": TRAINER_GPUS,
            "model_params_b": round(model.params / 1e9, 3),
            "kv_bytes_per_token": model.kv_bytes_per_token,
            "zero_stage": ZERO_STAGE,
            "source": f"{model.source}; the step estimates taken as ZeRO-{ZERO_STAGE}'s (the reference "
            "PipelineRL's DeepSpeed configuration)",
        },
        "transfer": {
            "link": LINK,
            "bytes_per_s": LINK_BYTES_PER_S,
            "per_bucket_s": PER_BUCKET_S,
            "fixed_s": float(f"{fixed:.4g}"),
            "update_bytes": update_bytes,
            "source": f"the bytes at {LINK_BYTES_PER_S / 1e9:g} GB/s and {PER_BUCKET_S * 1e3:g} ms a bucket "
            f"(estimates); the fixed cost what is left of the anchored transfer_s ({transfer} s) in "
            f"{ANCHOR_BUCKET_BYTES >> 20} MiB buckets",
        },
        # The paper's stand-in (plan/paper.py): taken when `pipelinerl plan` is given no --lengths.
        "lengths": f"loglogistic:{PAPER_LENGTHS[0]:g},{PAPER_LENGTHS[1]:g}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if a shipped profile is not what this writes"
    )
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    stale = []
    for gpu in BANDWIDTH:
        for model in MODELS:
            data = profile(gpu, model)
            path = OUT / f"{data['name']}.json"
            text = json.dumps(data, indent=2) + "\n"
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(path.name)
            else:
                path.write_text(text)
                print(f"wrote {path}")
    if stale:
        print(f"not what scripts/gpu_profiles.py writes: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
