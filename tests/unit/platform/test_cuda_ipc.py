"""The CUDA IPC handle record: torch's reduce_tensor arguments in, the same arguments out, no pickle.
(Opening a handle needs a GPU: tests/integration/test_weight_group.py, marked gpu.)"""

import msgspec
import pytest
import torch

from pipelinerl.platform.cuda_ipc import CudaHandle, export


def reduced(dtype: torch.dtype = torch.bfloat16) -> tuple:
    """The shape of reduce_tensor's arguments for a CUDA tensor (values made up)."""
    return (
        torch.Tensor,
        torch.Size([1024]),
        (1,),
        0,
        torch.storage.TypedStorage,
        dtype,
        0,
        b"\x01handle" * 8,
        2048,
        0,
        False,
        b"/torch_123_456",
        3,
        b"\x02event" * 8,
        True,
    )


def test_a_handle_survives_the_wire_and_gives_back_the_rebuild_arguments():
    handle = CudaHandle.from_reduced(reduced())
    again = CudaHandle.decode(handle.encode())
    assert again == handle
    assert again.to_rebuild_args() == reduced()


def test_a_handle_without_an_event_keeps_none():
    args = list(reduced(torch.float32))
    args[13] = None
    handle = CudaHandle.decode(CudaHandle.from_reduced(tuple(args)).encode())
    assert handle.event_handle is None and handle.to_rebuild_args()[5] is torch.float32


def test_a_dtype_outside_the_weights_is_refused():
    with pytest.raises(ValueError, match="'int64'"):
        CudaHandle.from_reduced(reduced(torch.int64))


def test_a_record_with_unknown_or_missing_fields_is_refused():
    fields = msgspec.structs.asdict(CudaHandle.from_reduced(reduced()))
    assert CudaHandle.decode(msgspec.msgpack.encode(fields)) == CudaHandle.from_reduced(reduced())
    with pytest.raises(msgspec.ValidationError):
        CudaHandle.decode(msgspec.msgpack.encode({**fields, "callable": "os.system"}))
    del fields["storage_handle"]
    with pytest.raises(msgspec.ValidationError):
        CudaHandle.decode(msgspec.msgpack.encode(fields))


def test_only_cuda_memory_is_exported():
    with pytest.raises(ValueError, match="on cpu"):
        export(torch.zeros(4))
