"""What custody's emulated CUDA driver (``libcuda_emu.so``) saw, from Python: the live
allocations, the hazards its stream-order checker found (a free not ordered after a use, a use
after free, ...) and the call log, with fault injection for tests.

The functions read the driver library custody loads (``CUSTODY_CUDA_DRIVER``, else
``libcuda.so.1``); on a real driver :func:`is_emulated` is False and the others raise
``RuntimeError``; when no driver library loads at all, each raises ``OSError``. Each query returns a list of dicts (JSON from the emulator's
``custodyEmuQuery``)::

    import custody
    from custody import emulator

    if emulator.is_emulated():
        emulator.clear("hazards")
        ...                                   # work with custody (or any CUDA library)
        assert emulator.hazards() == [], emulator.hazards()
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
import threading

__all__ = [
    "allocations",
    "calls",
    "clear",
    "driver_path",
    "hazards",
    "inject_fault",
    "is_emulated",
    "thread_id",
]

_library = None
_lock = threading.Lock()

# The largest C `unsigned` (the interface's `nth` and `CUresult`).
_UINT_MAX = 2**32 - 1


def driver_path() -> str:
    """The driver library custody loads: ``CUSTODY_CUDA_DRIVER``, else ``libcuda.so.1``."""
    return os.environ.get("CUSTODY_CUDA_DRIVER") or "libcuda.so.1"


def _open():
    global _library
    with _lock:
        if _library is None:
            lib = ctypes.CDLL(driver_path())
            if not hasattr(lib, "custodyEmuVersion"):
                _library = False
            else:
                lib.custodyEmuQuery.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
                lib.custodyEmuQuery.restype = ctypes.c_size_t
                lib.custodyEmuClear.argtypes = [ctypes.c_char_p]
                lib.custodyEmuClear.restype = None
                lib.custodyEmuInjectFault.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint]
                lib.custodyEmuInjectFault.restype = ctypes.c_int
                lib.custodyEmuThreadId.argtypes = []
                lib.custodyEmuThreadId.restype = ctypes.c_ulonglong
                _library = lib
        return _library


def is_emulated() -> bool:
    """Whether the driver custody loads is custody's emulator (it exports ``custodyEmuVersion``).
    ``OSError`` when no library loads."""
    return bool(_open())


def _emulator():
    lib = _open()
    if not lib:
        raise RuntimeError(
            f"{driver_path()} is not custody's emulated driver: set CUSTODY_CUDA_DRIVER to "
            "libcuda_emu.so (`cargo build -p cuda-custody-emu` builds target/debug/libcuda_emu.so)"
        )
    return lib


def _query(what: str) -> list:
    lib = _emulator()
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        needed = lib.custodyEmuQuery(what.encode(), buf, size)
        if needed < size:
            return json.loads(buf.value.decode() or "[]")
        size = needed + 1


def allocations() -> list[dict]:
    """The live allocations: dicts with ``id`` (the emulator's identity of the allocation),
    ``ptr``, ``size`` (bytes), ``kind`` (``"device"``, ``"pool"``, ``"host"``, ``"managed"``,
    ``"registered"`` or ``"ipc"``), ``device`` and ``pool`` (the pool's handle, or None)."""
    return _query("allocations")


def hazards() -> list[dict]:
    """Every hazard found since the last ``clear("hazards")``: dicts with ``kind``
    (``"unordered_free"``: freed on a stream not ordered after a use; ``"use_before_alloc"``:
    used on a stream not ordered after its stream-ordered allocation; ``"use_after_free"``,
    ``"double_free"`` or ``"free_on_destroyed_stream"``), ``ptr``, ``alloc`` (the allocation's
    ``id``, or None), ``function`` (the driver call that found it), ``stream`` and ``detail``."""
    return _query("hazards")


def calls() -> list[dict]:
    """The call log (the most recent calls, oldest first): dicts with ``seq``, ``function``,
    ``thread`` (see :func:`thread_id`), ``context``, ``stream`` (as passed), ``resolved_stream``
    (what a default-stream token resolved to), ``stream_context``, ``ptr``, ``alloc`` (the
    allocation's ``id``) and ``result`` (the ``CUresult``, 0 for success)."""
    return _query("calls")


def clear(what: str) -> None:
    """Forgets the recorded ``"hazards"`` or ``"calls"``, or the pending injected ``"faults"``.
    ``ValueError`` for anything else."""
    if what not in ("hazards", "calls", "faults"):
        raise ValueError(f"clear() takes 'hazards', 'calls' or 'faults', got {what!r}")
    _emulator().custodyEmuClear(what.encode())


def inject_fault(function: str, nth: int = 1, error: int = 1) -> None:
    """Makes the ``nth`` next call of the driver entry point ``function`` (``"cuMemFreeAsync"``)
    return the ``CUresult`` ``error`` (default 1, ``CUDA_ERROR_INVALID_VALUE``) without effect,
    once. ``nth`` counts from 1 (the next call) to ``2**32 - 1``; ``error`` is from 1 to
    ``2**32 - 1`` (0 is success, not a fault). ``TypeError`` for a ``function`` that is not a
    str or an ``nth`` or ``error`` that is not an int; ``ValueError`` for an entry point the
    emulator does not export, or an ``nth`` or ``error`` out of range. Nothing is injected on
    error."""
    if not isinstance(function, str):
        raise TypeError(
            f"function is a driver entry point's name (a str), got {type(function).__name__}"
        )
    nth = _count_argument("nth", nth, "counts the calls from 1, the next one")
    error = _count_argument("error", error, "is a CUresult (0 is success, not a fault)")
    lib = _emulator()
    if lib.custodyEmuInjectFault(function.encode(), nth, error) != 0:
        raise ValueError(f"no fault injected: {function!r} is not an entry point of the emulator")


def _count_argument(name: str, value, what: str) -> int:
    """``value`` as an int from 1 to ``2**32 - 1`` (the C interface's ``unsigned``), which
    ctypes would otherwise wrap or truncate without a word."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} is an int, got {type(value).__name__}") from None
    if not 1 <= value <= _UINT_MAX:
        raise ValueError(f"{name} {what}: from 1 to 2**32 - 1, got {value}")
    return value


def thread_id() -> int:
    """The calling thread's id as the call log's ``thread`` shows it."""
    return int(_emulator().custodyEmuThreadId())
