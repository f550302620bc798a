"""vLLM decode step against the sequences in flight, one engine, a Qwen2.5-0.5B-shaped model with random
weights (no tokenizer). For each H: H requests of PROMPT random tokens, MAX_NEW new tokens each (ignore_eos),
submitted at once; step_ms = wall / MAX_NEW (prefill of H prompts included, reported apart as prefill_ms
from a 1-token run). Prints one JSON line per H and writes all to --out."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import torch
import vllm
from transformers import Qwen2Config, Qwen2ForCausalLM
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
        vocab_size=1024,
    ),
}


def build(shape: str, out: str, dtype: str) -> int:
    torch.manual_seed(0)
    config = Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


async def run(args: argparse.Namespace) -> list[dict]:
    top = max(args.in_flight)
    kwargs = dict(
        model=args.model,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        seed=0,
        max_model_len=args.prompt + args.max_new + 8,
        max_num_seqs=top,
        enforce_eager=args.eager,
        enable_prefix_caching=False,
        disable_log_stats=True,
    )
    if torch.cuda.is_available():
        kwargs["gpu_memory_utilization"] = args.gpu_mem
    else:
        kwargs["kv_cache_memory_bytes"] = 1 << 30
    started = time.perf_counter()
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    startup = time.perf_counter() - started
    rng = random.Random(0)
    vocab = SHAPES[args.shape]["vocab_size"]

    def prompts(n: int) -> list[list[int]]:
        return [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(n)]

    async def batch(n: int, new: int, tag: str) -> float:
        params = SamplingParams(
            n=1,
            temperature=1.0,
            max_tokens=new,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

        async def one(i: int, p: list[int]) -> int:
            final = None
            async for out in engine.generate({"prompt_token_ids": p}, params, request_id=f"{tag}-{i}"):
                final = out
            return len(final.outputs[0].token_ids)

        begun = time.perf_counter()
        lengths = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts(n))))
        assert all(x == new for x in lengths), lengths
        return time.perf_counter() - begun

    rows = []
    try:
        await batch(8, 16, "warm")
        for h in args.in_flight:
            prefill = min([await batch(h, 1, f"p{h}-{r}") for r in range(2)])
            walls = [await batch(h, args.max_new, f"d{h}-{r}") for r in range(args.repeats)]
            wall = sorted(walls)[len(walls) // 2]
            row = {
                "in_flight": h,
                "prompt": args.prompt,
                "max_new": args.max_new,
                "wall_s": round(wall, 4),
                "prefill_s": round(prefill, 4),
                "step_ms": round(1000 * (wall - prefill) / (args.max_new - 1), 4),
                "tokens_per_s": round(h * args.max_new / wall, 1),
                "walls": [round(w, 4) for w in walls],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        engine.shutdown()
    return [{"startup_s": round(startup, 1)}, *rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--in-flight", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128, 256]
    )
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--max-new", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-mem", type=float, default=0.5)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    params = build(args.shape, args.model, args.dtype)
    rows = asyncio.run(run(args))
    record = {
        "shape": args.shape,
        "parameters": params,
        "dtype": args.dtype,
        "eager": args.eager,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "startup_s": rows[0]["startup_s"],
        "points": rows[1:],
    }
    record["vllm"] = vllm.__version__
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("RESULT", json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
