"""How trainer rank 0 hands each new policy to the actors: a ``WeightUpdate`` notice over ZeroMQ PUB, the
tensors in buckets over the weight group, then ``WeightDigests`` (every bucket's digest) over ZeroMQ
PUB; and, at the end, ``Shutdown``.

The notices travel over CurveZMQ (authenticated); the weight group does not (``platform/weights.py``).
So the digests of what the group carried follow it on the notice channel, and an actor loads nothing
of an update that does not match them (``workers/checked_receive.py``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.transport import CurveKeys, Sender
from pipelinerl.platform.weights import MIB, WeightGroup, weight_backend
from pipelinerl.platform.wire import Shutdown, WeightDigests, WeightUpdate

logger = logging.getLogger("pipelinerl.trainer")

# How long a weight update waits for every stage to subscribe to the notices before it is published to
# those there are: the first one (stages still connecting over a slow link), and later ones (a stage
# reconnecting; a stage that died is not waited for long).
FIRST_NOTICE_SUBSCRIBERS_WAIT_S, NOTICE_SUBSCRIBERS_WAIT_S = 30.0, 2.0
SHUTDOWN_REPEATS = 3  # PUB/SUB may drop one; actors treat repeats as one


class WeightPublisher:
    """Rank 0's notice socket (bound XPUB) and the weight group it leads."""

    def __init__(self, context: Any, config: PipelineConfig, keys: CurveKeys, device: str) -> None:
        transport = config.transport
        self.subscribers_expected = config.actor.num_actors + 1  # the actors and the preprocessor
        self.notices = Sender(
            context,
            transport.address("weights"),
            "xpub",
            bind=True,
            keys=keys,
            max_message_bytes=transport.max_message_bytes,
            name="trainer",
        )
        self.group = WeightGroup.lead(
            transport.host,
            transport.port("weight_group"),
            config.weight_group_size(),
            backend=weight_backend(
                transport.weight_backend, device, config.actor.engine, config.cluster.colocate
            ),
            bucket_bytes=transport.weight_bucket_mib * MIB,
            device=torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else "cpu",
        )

    @property
    def unauthenticated_count(self) -> int:
        return self.notices.unauthenticated_count

    def publish(
        self, named: list[tuple[str, torch.Tensor]], policy_version: int, samples_trained: int
    ) -> None:
        """Notice, broadcast and digests of ``named`` (every parameter, gathered) as ``policy_version``."""
        tensors = [param.detach() for _, param in named]
        # Every actor must hear of the update before the broadcast that waits for all of them: on a slow
        # link a subscription can arrive after a first notice, which a PUB drops.
        wait_s = NOTICE_SUBSCRIBERS_WAIT_S if self.notices.sent_count else FIRST_NOTICE_SUBSCRIBERS_WAIT_S
        if not self.notices.wait_for_subscribers(self.subscribers_expected, wait_s):
            logger.warning(
                "weights v%d: %d of %d stages subscribe to the notices after %.0f s; publishing anyway",
                policy_version,
                self.notices.subscribers(),
                self.subscribers_expected,
                wait_s,
            )
        self.notices.send(
            WeightUpdate(
                policy_version=policy_version,
                parameter_names=[name for name, _ in named],
                parameter_shapes=[list(t.shape) for t in tensors],
                parameter_dtypes=[dtype_name(t) for t in tensors],
                samples_trained=samples_trained,
                created_at=time.time(),
            )
        )
        digests = self.group.send(tensors)  # each bucket hashed while it is broadcast
        self.notices.send(WeightDigests(policy_version=policy_version, bucket_digests=digests))

    def shutdown(self, reason: str) -> None:
        """Tell every stage the run is over, then close the notice socket."""
        for _ in range(SHUTDOWN_REPEATS):
            self.notices.send(Shutdown(reason=reason))
            time.sleep(0.05)
        self.notices.close()
