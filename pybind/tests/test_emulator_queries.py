"""``custody.emulator``, the emulated driver's queries as a user's own tests call them (README,
"Use it from Python"): each query's fields as its docstring names them, an injected fault that
fails one call, ``clear("faults")`` that forgets a pending one, and fault injection refusing what
the C interface (an ``unsigned`` count and ``CUresult``) would wrap or truncate without a word,
injecting nothing then. Emulator only: on a real driver the module raises ``RuntimeError``."""

from __future__ import annotations

import pytest

import custody
from custody import emulator
from conftest import needs_emulator

pytestmark = needs_emulator


def test_the_queries_show_an_allocation_its_free_and_the_call_that_freed_it(device, stream, emu):
    assert emulator.is_emulated()
    emulator.clear("calls")
    buf = device.memory_resource.allocate(64, stream=stream)
    (mine,) = [a for a in emulator.allocations() if a["ptr"] == buf.handle]
    assert (mine["size"], mine["kind"], mine["device"]) == (64, "pool", 0), mine
    buf.close()
    assert all(a["id"] != mine["id"] for a in emulator.allocations())
    frees = [
        c for c in emulator.calls() if c["function"] == "cuMemFreeAsync" and c["alloc"] == mine["id"]
    ]
    assert len(frees) == 1, frees
    (free,) = frees
    assert free["thread"] == emulator.thread_id()
    assert (free["stream"], free["result"]) == (stream.handle, 0), free
    assert emulator.hazards() == []


def test_an_injected_fault_fails_one_call_and_clear_forgets_a_pending_one(stream, emu):
    emulator.inject_fault("cuStreamSynchronize")
    with pytest.raises(custody.CUDAError, match="CUDA_ERROR_INVALID_VALUE"):
        stream.sync()
    stream.sync()  # once only
    emulator.inject_fault("cuStreamSynchronize")
    emulator.clear("faults")
    stream.sync()


@pytest.mark.parametrize("nth", [0, -1, 2**32, 2**32 + 1])
def test_a_call_count_out_of_range_is_refused_and_injects_nothing(stream, emu, nth):
    # ctypes passed -1 as 2**32 - 1 and 2**32 + 1 as 1 (a fault on the very next call).
    with pytest.raises(
        ValueError,
        match=rf"^nth counts the calls from 1, the next one: from 1 to 2\*\*32 - 1, got {nth}$",
    ):
        emulator.inject_fault("cuStreamSynchronize", nth)
    stream.sync()


@pytest.mark.parametrize("error", [0, -1, 2**32])
def test_an_error_code_out_of_range_is_refused_and_injects_nothing(stream, emu, error):
    with pytest.raises(ValueError, match=rf"^error is a CUresult .*, got {error}$"):
        emulator.inject_fault("cuStreamSynchronize", 1, error)
    stream.sync()


@pytest.mark.parametrize(
    "args, named",
    [
        ((b"cuStreamSynchronize",), "function is a driver entry point's name"),
        ((None,), "function is a driver entry point's name"),
        (("cuStreamSynchronize", "1"), "nth is an int"),
        (("cuStreamSynchronize", 1.0), "nth is an int"),
        (("cuStreamSynchronize", 1, None), "error is an int"),
    ],
)
def test_an_argument_of_the_wrong_type_is_named(stream, emu, args, named):
    with pytest.raises(TypeError, match=f"^{named}"):
        emulator.inject_fault(*args)
    stream.sync()


def test_an_unknown_entry_point_is_named():
    with pytest.raises(ValueError, match=r"^no fault injected: 'cuBogus' is not an entry point"):
        emulator.inject_fault("cuBogus")
