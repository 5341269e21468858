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

def driver_path() -> str:
    """The driver library custody loads: ``CUSTODY_CUDA_DRIVER``, else ``libcuda.so.1``."""
def is_emulated() -> bool:
    """Whether the driver custody loads is custody's emulator (it exports ``custodyEmuVersion``).
    ``OSError`` when no library loads.
    """
def allocations() -> list[dict]:
    """The live allocations: dicts with ``id`` (the emulator's identity of the allocation),
    ``ptr``, ``size`` (bytes), ``kind`` (``"device"``, ``"pool"``, ``"host"``, ``"managed"``,
    ``"registered"`` or ``"ipc"``), ``device`` and ``pool`` (the pool's handle, or None).
    """
def hazards() -> list[dict]:
    """Every hazard found since the last ``clear("hazards")``: dicts with ``kind``
    (``"unordered_free"``: freed on a stream not ordered after a use; ``"use_after_free"``,
    ``"double_free"`` or ``"free_on_destroyed_stream"``), ``ptr``, ``alloc`` (the allocation's
    ``id``, or None), ``function`` (the driver call that found it), ``stream`` and ``detail``.
    """
def calls() -> list[dict]:
    """The call log (the most recent calls, oldest first): dicts with ``seq``, ``function``,
    ``thread`` (see :func:`thread_id`), ``context``, ``stream`` (as passed), ``resolved_stream``
    (what a default-stream token resolved to), ``stream_context``, ``ptr``, ``alloc`` (the
    allocation's ``id``) and ``result`` (the ``CUresult``, 0 for success).
    """
def clear(what: str) -> None:
    """Forgets the recorded ``"hazards"`` or ``"calls"``, or the pending injected ``"faults"``.
    ``ValueError`` for anything else.
    """
def inject_fault(function: str, nth: int = 1, error: int = 1) -> None:
    """Makes the ``nth`` next call of the driver entry point ``function`` (``"cuMemFreeAsync"``)
    return the ``CUresult`` ``error`` (default 1, ``CUDA_ERROR_INVALID_VALUE``) without effect,
    once. ``nth`` counts from 1 (the next call) to ``2**32 - 1``; ``error`` is from 1 to
    ``2**32 - 1`` (0 is success, not a fault). ``TypeError`` for a ``function`` that is not a
    str or an ``nth`` or ``error`` that is not an int; ``ValueError`` for an entry point the
    emulator does not export, or an ``nth`` or ``error`` out of range. Nothing is injected on
    error.
    """
def thread_id() -> int:
    """The calling thread's id as the call log's ``thread`` shows it."""
