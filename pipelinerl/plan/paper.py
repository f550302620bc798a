"""The PipelineRL paper's setting, as the simulator takes it (arXiv 2509.19128 section 5; the reference
ServiceNow/PipelineRL conf/base.yaml): 128 H100, 48 generating at H=64 and 80 training, Qwen2.5-7B
(the shipped ``h100-7b`` profile), B=1,024, 8 samples a prompt, up to 8,192 new tokens, the conventional
baseline at G=32. The length distribution is not published: a median of 1,000 and a p90 of 3,000 tokens
(a log-logistic, the earlier version's "1K-2K tokens" mean with a heavy tail) stands in for it.

Used by ``pipelinerl bench plan`` (the simulator's speed at this scale) and ``scripts/plan_published.py``
(the paper's ~2x beside the prediction, and the sensitivity around it)."""

from __future__ import annotations

from pipelinerl.plan.cluster import Cluster

SETTINGS = [
    "rl.batch_size=1024",
    "rl.group_size=8",
    "actor.max_in_flight=64",
    "actor.max_new_tokens=8192",
    "run.steps_per_round=32",
    "transport.queue_size=1024",
    "trainer.zero_stage=3",  # the reference's DeepSpeed configuration
]
CLUSTER = Cluster(48, 80, "H100")
PROFILE = "h100-7b"
LENGTHS = (1000.0, 3000.0)  # log-logistic median and p90, cut at actor.max_new_tokens
PROMPT_TOKENS = 200
