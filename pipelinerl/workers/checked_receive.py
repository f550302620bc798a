"""An actor's weight update, used only if it is the trainer's, byte for byte.

The weight group is unauthenticated; the notice channel (CurveZMQ) is not. After the broadcast of
update v the trainer sends ``WeightDigests`` of v there: one digest per bucket, each hashed while
the bucket was broadcast. The member hashes every bucket as it arrives (``WeightGroup.
receive_update``), so once the last bucket is in, only the comparison is left.

``announced_digests`` reads the trainer's digests off the actor's notice socket. ``receive_checked``
is the vLLM side: the engine's workers are the members, but the actor process holds the notice
socket, so every worker answers its digests, the comparison happens here, and the workers keep the
update (staged for loading) only if every bucket of every worker matches; otherwise they drop it and
``BucketsRefused`` names the buckets. (The transformers actor is the member itself:
``ReceivedUpdate.check``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

from pipelinerl.platform.transport import Receiver
from pipelinerl.platform.weight_digest import refused_buckets
from pipelinerl.platform.weights import BucketsRefused
from pipelinerl.platform.wire import Message, Shutdown, WeightDigests, WeightUpdate
from pipelinerl.workers.engines.protocol import EngineWorkers

# The trainer sends the digests as soon as its broadcast ends, which is when the member has the
# update's last bucket: this is a bound for a lost message, not a wait anyone should reach.
DIGESTS_WAIT_S: Final = 60.0


def announced_digests(
    notices: Receiver, version: int, wait_s: float = DIGESTS_WAIT_S
) -> tuple[list[bytes] | None, Message | None]:
    """The trainer's digests of update ``version`` from the notice socket, and the notice that came
    first instead if one did (the next ``WeightUpdate``, or ``Shutdown``: the digests were lost; the
    caller handles it next). ``(None, None)`` if nothing came within ``wait_s``. Digests of another
    version (a stale repeat) are skipped."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        message = notices.recv(timeout_s=min(left, 0.5))
        if isinstance(message, WeightDigests) and message.policy_version == version:
            return list(message.bucket_digests), None
        if isinstance(message, WeightUpdate | Shutdown):
            return None, message
    return None, None


def receive_checked(
    workers: EngineWorkers,
    names: list[str],
    shapes: list[list[int]],
    dtypes: list[str],
    announced: Callable[[], Sequence[bytes] | None],
) -> float:
    """Receive one update into the workers' staging, checked: ``announced()`` gives the trainer's
    digests once the broadcast is over (None: they did not come). Returns the slowest worker's
    receiving seconds; ``BucketsRefused`` (the workers keep nothing) if a bucket did not match."""
    receipt = workers.receive(names, shapes, dtypes)
    digests = announced()
    refused: set[int] = set()
    reason = ""
    for received in receipt.digests:  # every worker (tensor-parallel shard) received every bucket
        mismatched, why = refused_buckets(received, digests)
        refused.update(mismatched)
        reason = reason or why
    workers.keep_received(not refused)
    if refused:
        raise BucketsRefused(sorted(refused), reason)
    return receipt.seconds
