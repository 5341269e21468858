"""Probe: in a process that imported a pool allocation, does work queued on a non-blocking
stream before the importer's free of the pointer on the legacy stream run before the unmap?

Why (docs/cuda-core-compat.md, "The H200-only failures"): cuda.core 1.2's worker-pool and
send-buffers IPC tests fill an imported buffer from fresh managed memory on a new non-blocking
stream and close it at once, the free on the legacy stream and not ordered after the fill (the
driver API documentation makes a use after the stream reaches the free undefined). With
cuda.core the workers pass on an H200; with custody before its fix, whose close also
synchronised the legacy stream right after the free, they lost their context
(CUDA_ERROR_ILLEGAL_ADDRESS). This probe makes the same driver calls without either library.

Each round is a fresh importing process (a fault ends its context), in one of three variants:

- ``free``: copy on the non-blocking stream, cuMemFreeAsync on the legacy stream, cuMemFree of
  the managed source (cuda.core's order of calls);
- ``free+sync``: the same with cuStreamSynchronize(legacy) right after the free (custody's
  close before the fix);
- ``ctxsync+free+sync``: cuCtxSynchronize before the free, then as ``free+sync`` (custody's
  close after the fix).

Then the importer synchronises the non-blocking stream and the context and reports every
status; the exporter reads its allocation back (did the copy land?) and frees it after the
importer has exited. Run on a GPU host (cuda-bindings installed):

    python3 docs/driver-probe/ipc_unmap_order.py [ROUNDS]

It needs no custody. The emulator runs it too (``LD_LIBRARY_PATH`` at a directory whose
``libcuda.so.1`` is ``libcuda_emu.so``), where every round succeeds: it runs the copy before the
free.
"""

import ctypes
import subprocess
import sys

from cuda.bindings import driver as d

N = 64
FILL = 0xAB
VARIANTS = ("free", "free+sync", "ctxsync+free+sync")
POSIX_FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def name(status):
    return d.cuGetErrorName(status)[1].decode() if status else "CUDA_SUCCESS"


def ok(result):
    """The values of a cuda.bindings call, exiting on a failure (the probe's own set-up)."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != d.CUresult.CUDA_SUCCESS:
        sys.exit(f"set-up failed: {name(status)}")
    return values[0] if len(values) == 1 else values


def status_of(result):
    return name((result if isinstance(result, tuple) else (result,))[0])


def context():
    ok(d.cuInit(0))
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))


def child(variant, fd, export_hex):
    context()
    pool = ok(d.cuMemPoolImportFromShareableHandle(fd, POSIX_FD, 0))
    data = d.CUmemPoolPtrExportData()
    data.reserved = list(bytes.fromhex(export_hex))
    ptr = ok(d.cuMemPoolImportPointer(pool, data))
    stream = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
    legacy = d.CUstream(d.CU_STREAM_LEGACY)
    source = ok(d.cuMemAllocManaged(N, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    ctypes.memset(int(source), FILL, N)  # host-written: the copy must fetch the pages
    seen = {"copy": status_of(d.cuMemcpyAsync(ptr, source, N, stream))}
    if variant == "ctxsync+free+sync":
        seen["ctxsync before free"] = status_of(d.cuCtxSynchronize())
    seen["free"] = status_of(d.cuMemFreeAsync(ptr, legacy))
    if variant != "free":
        seen["sync legacy"] = status_of(d.cuStreamSynchronize(legacy))
    seen["free managed"] = status_of(d.cuMemFree(source))
    seen["sync stream"] = status_of(d.cuStreamSynchronize(stream))
    seen["ctxsync"] = status_of(d.cuCtxSynchronize())
    print(" ".join(f"{k}={v}" for k, v in seen.items()))


def parent(rounds):
    context()
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = POSIX_FD
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = ok(d.cuMemPoolCreate(props))
    fd = ok(d.cuMemPoolExportToShareableHandle(pool, POSIX_FD, 0))
    stream = ok(d.cuStreamCreate(0))
    faults = {v: 0 for v in VARIANTS}
    lost = {v: 0 for v in VARIANTS}
    for variant in VARIANTS:
        for i in range(rounds):
            ptr = ok(d.cuMemAllocFromPoolAsync(N, pool, stream))
            ok(d.cuMemsetD8Async(ptr, 0, N, stream))
            ok(d.cuStreamSynchronize(stream))
            export = bytes(ok(d.cuMemPoolExportPointer(ptr)).reserved)
            out = subprocess.run(
                [sys.executable, __file__, "child", variant, str(int(fd)), export.hex()],
                pass_fds=[int(fd)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            back = bytearray(N)
            ok(d.cuMemcpyDtoH(back, ptr, N))
            landed = back == bytes([FILL]) * N
            line = out.stdout.strip() or out.stderr.strip().splitlines()[-1:]
            print(f"{variant:18} round {i:2}: exit {out.returncode} {line} landed={landed}")
            faults[variant] += "ILLEGAL_ADDRESS" in out.stdout or out.returncode != 0
            lost[variant] += not landed
            ok(d.cuMemFreeAsync(ptr, stream))
            ok(d.cuStreamSynchronize(stream))
    for variant in VARIANTS:
        print(
            f"summary {variant}: {faults[variant]} of {rounds} rounds faulted, "
            f"{lost[variant]} lost the copy"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        parent(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
