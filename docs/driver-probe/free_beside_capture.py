"""Probe: what stream-ordered allocation calls on a stream that is *not* being captured do while a
capture of another stream runs, on the capturing thread and on another thread, for each capture
mode: the call's status, the capture's state after it, how the capture ends, and whether the
memory was freed (the default pool's used bytes). Raw driver calls (cuda-bindings), no custody.

    python3 docs/driver-probe/free_beside_capture.py

Each row: the capture's mode, the thread that makes the call, the call (``free``:
cuMemFreeAsync of memory allocated on t before the capture; ``alloc``: cuMemAllocAsync on t;
``memfree``: cuMemFree of cuMemAlloc memory; ``/relaxed``: with the calling thread's interaction
mode relaxed around the call), then the call's status, the capture's status after it, how
cuStreamEndCapture ended, and whether the memory was freed or allocated. The H200's answers are
in h200-580.159.04-free-beside-capture.txt beside this file; the emulator runs it too
(``LD_LIBRARY_PATH`` at a directory whose ``libcuda.so.1`` is ``libcuda_emu.so``).
"""

import threading

from cuda.bindings import driver as d

N = 1 << 20
MODES = {
    "global": d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


def check(result):
    err = result[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err.name}")
    return result[1] if len(result) == 2 else result[1:]


def name(err):
    return err.name.replace("CUDA_ERROR_", "").replace("CUDA_", "")


check(d.cuInit(0))
dev = check(d.cuDeviceGet(0))
ctx = check(d.cuDevicePrimaryCtxRetain(dev))
check(d.cuCtxSetCurrent(ctx))
pool = check(d.cuDeviceGetDefaultMemPool(dev))
USED = d.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT


def used():
    return int(check(d.cuMemPoolGetAttribute(pool, USED)))


def status_of(s):
    err, st = d.cuStreamIsCapturing(s)
    return name(st) if err == d.CUresult.CUDA_SUCCESS else "query:" + name(err)


def relaxed_call(call):
    """`call` with this thread's capture interaction mode relaxed, then restored."""
    err, old = d.cuThreadExchangeStreamCaptureMode(MODES["relaxed"])
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError("exchange: " + name(err))
    try:
        call()
    finally:
        check(d.cuThreadExchangeStreamCaptureMode(old))


def scenario(mode, where, op, relax=False):
    flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
    s = check(d.cuStreamCreate(flags))
    t = check(d.cuStreamCreate(flags))
    p = check(d.cuMemAllocAsync(N, t)) if op == "free" else None
    if op == "memfree":
        p = check(d.cuMemAlloc(N))
        mem_before = check(d.cuMemGetInfo())[0]
    check(d.cuStreamSynchronize(t))
    before = used()
    out = {}

    def call():
        if relax:
            return relaxed_call(plain_call)
        return plain_call()

    def plain_call():
        if op == "memfree":
            out["call"] = name(d.cuMemFree(p)[0])
        elif op == "free":
            out["call"] = name(d.cuMemFreeAsync(p, t)[0])
        else:
            err, q = d.cuMemAllocAsync(N, t)
            out["call"] = name(err)
            out["q"] = q if err == d.CUresult.CUDA_SUCCESS else None

    check(d.cuStreamBeginCapture(s, MODES[mode]))
    if where == "same thread":
        call()
    else:
        def other():
            check(d.cuCtxSetCurrent(ctx))
            call()
        th = threading.Thread(target=other)
        th.start()
        th.join()
    out["after"] = status_of(s)
    err, g = d.cuStreamEndCapture(s)
    out["end"] = name(err)
    if err == d.CUresult.CUDA_SUCCESS and g is not None:
        d.cuGraphDestroy(g)
    e = d.cuStreamSynchronize(t)[0]
    out["sync_t"] = name(e)
    after = used()
    if op == "memfree":
        out["freed"] = out["call"] == "SUCCESS"
        if not out["freed"]:
            out["late_free"] = name(d.cuMemFree(p)[0])
    elif op == "free":
        out["freed"] = after < before
        if not out["freed"]:
            out["late_free"] = name(d.cuMemFreeAsync(p, t)[0])
    else:
        out["allocated"] = after > before
        if out.get("q") is not None:
            check(d.cuMemFreeAsync(out["q"], t))
    check(d.cuStreamSynchronize(t))
    check(d.cuStreamDestroy(s))
    check(d.cuStreamDestroy(t))
    tag = op + ("/relaxed" if relax else "")
    print(f"{mode:12s} {where:12s} {tag:15s} " + " ".join(f"{k}={v}" for k, v in out.items() if k != "q"),
          flush=True)


print("driver", check(d.cuDriverGetVersion()))
for relax in (False, True):
    for mode in MODES:
        for where in ("same thread", "other thread"):
            for op in ("free", "alloc", "memfree"):
                try:
                    scenario(mode, where, op, relax)
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    print(f"{mode:12s} {where:12s} {op} relax={relax} probe failed: {e!r}",
                          flush=True)
