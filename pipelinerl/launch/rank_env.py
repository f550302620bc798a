"""Where a trainer rank stands in the job, as torchrun (``torch.distributed.run``) tells its workers.

torchrun, like DeepSpeed's launcher, starts each rank with its place in the job in environment
variables, which ``torch.distributed``'s ``env://`` rendezvous and ``deepspeed.init_distributed``
read. The launcher supervises one process per rank itself (each rank has its log, its restart and
its stop), so it sets the very variables torchrun would set for the same placement, computed here
(the trainer serves the rendezvous at ``MASTER_ADDR:MASTER_PORT`` itself, listening on that address
only: ``platform/stores.py``);
``tests/unit/launch/test_rank_env.py`` starts real torchrun agents and compares. The trainer takes
its rank from ``RANK`` and its GPU from ``LOCAL_RANK``, so ``torchrun -m pipelinerl.workers.trainer``
places it the same way.

Pure: no process, no environment read.
"""

from __future__ import annotations

ROLE_NAME = "trainer"


def torchrun_env(
    rank: int, ranks_per_node: int, nodes: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables torchrun gives global rank ``rank`` of ``nodes`` nodes of ``ranks_per_node``
    ranks each (``--nnodes nodes --nproc-per-node ranks_per_node --role trainer``, nodes numbered in
    rank order, rendezvous at ``master_addr:master_port``)."""
    world = ranks_per_node * nodes
    if ranks_per_node < 1 or nodes < 1:
        raise ValueError(f"a job needs at least one node of one rank, not {nodes} of {ranks_per_node}")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside 0..{world - 1} ({nodes} nodes of {ranks_per_node} ranks)")
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % ranks_per_node),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(rank // ranks_per_node),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_NAME": ROLE_NAME,
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
