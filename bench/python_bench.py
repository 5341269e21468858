#!/usr/bin/env python3
"""custody against cuda.core, CuPy and raw driver calls from Python, in one process.

Every library allocates 256 bytes from device 0's *current* memory pool on *one* created stream
(made once, wrapped by each library from its handle) and frees it again; the caching allocators
(custody's `CachingMemoryResource` over that pool, CuPy's `MemoryPool`, PyTorch's caching
allocator) keep the memory between pairs and hand it out again. Repetitions are
interleaved: each repetition times every variant once, starting with a different one each
time, so a drift in the machine lands on all of them alike. Reported per variant: the median
nanoseconds per alloc+free pair over the repetitions, and ratios as medians of per-repetition
ratios (paired). Written for `cargo xtask bench` (against the emulated driver) and the GPU
bundle's `run.py --bench` (against a real one); the JSON (`--json PATH`) has the same shape as
the Rust benchmark's (format `custody-bench/1`, suite `python`).

Every custody variant is also reported as a ratio to cuda.core's same calls (custody's time over
cuda.core's, paired: the targets are stated so), and allocate+close runs on 1, 2, 4 and 8
threads at once (`--threads`), a created stream each, for every library.

Variants, each skipped with a stated reason when its package does not import:
  custody      `mr.allocate(256, stream=s)` + `buf.close()` / `buf.close(stream=s)` / drop;
               the same allocate+close through `CachingMemoryResource(mr)` (a same-stream hit)
               on a stream custody created and on the wrapped one
  cuda.core    the same calls (cuda.core 1.2 names)
  CuPy         `cupy.cuda.MemoryAsyncPool().malloc(256)` + drop, inside `with stream:`; the
               default caching `MemoryPool` (its `malloc(256)`, what `cupy.cuda.alloc` calls; dropped)
  PyTorch      `torch.cuda.caching_allocator_alloc(256, 0, ExternalStream(s))` +
               `torch.cuda.caching_allocator_delete` (its caching allocator, no tensor); the
               same with custody as its allocator (`custody.interop.use_custody_in_torch`, the
               library `CUSTODY_TORCH_ALLOCATOR` names), in a child process of its own (PyTorch
               takes another allocator only before its first CUDA allocation), paired there with
               custody's caching pair and the raw ctypes pair
  adapters     CuPy through `custody.interop.CupyAllocator(CachingMemoryResource(mr))`
  cuda-bindings  `cuMemAllocFromPoolAsync` + `cuMemFreeAsync` (`cuda.bindings.driver`)
  ctypes       the same two driver calls through ctypes (always available: the baseline
               on the emulated driver, where cuda-bindings cannot load it)

The driver is the one custody loads: `CUSTODY_CUDA_DRIVER` if set, else `libcuda.so.1`.
cuda.core, cuda-bindings and CuPy load `libcuda.so.1`, so they are measured only when that is
the same library (for the emulator or the stub driver, bench/stub_driver.c, put a folder with a
`libcuda.so.1` link to it first on LD_LIBRARY_PATH; `cargo xtask bench` does). Needs Python
3.9+ and only the standard library besides the packages it measures.

  python3 bench/python_bench.py [--pairs N] [--reps R] [--quick] [--json PATH] [--raw-c-ns X]
                                [--compare MODULE[=LABEL]] [--threads 1,2,4,8] [--only VARIANT]

--raw-c-ns X: the raw C pair (ns) measured by the Rust benchmark in the same run, so that the
summary can state custody's ratio to it (the target is 1.5x at most).
"""

import argparse
import ctypes
import gc
import json
import os
import platform
import sys
import threading
import time

SIZE = 256
DRIVER_ENV = "CUSTODY_CUDA_DRIVER"


def median(values):
    values = sorted(values)
    n = len(values)
    if n == 0:
        return float("nan")
    if n % 2:
        return values[n // 2]
    return (values[n // 2 - 1] + values[n // 2]) / 2


class Ctypes:
    """The driver through ctypes: the library custody loads, so both share one driver."""

    def __init__(self):
        self.path = os.environ.get(DRIVER_ENV) or "libcuda.so.1"
        lib = ctypes.CDLL(self.path)
        self.lib = lib
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(i)]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(i), i]
        lib.cuDeviceGetName.argtypes = [ctypes.c_char_p, i, i]
        lib.cuDeviceGetMemPool.argtypes = [ctypes.POINTER(vp), i]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), i]
        lib.cuCtxSetCurrent.argtypes = [vp]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_uint]
        lib.cuStreamSynchronize.argtypes = [vp]
        lib.cuMemAllocFromPoolAsync.argtypes = [ctypes.POINTER(ctypes.c_uint64), sz, vp, vp]
        lib.cuMemFreeAsync.argtypes = [ctypes.c_uint64, vp]
        self.check(lib.cuInit(0), "cuInit")
        version = i(0)
        self.check(lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        self.version = version.value
        device = i(0)
        self.check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        self.device = device.value
        name = ctypes.create_string_buffer(256)
        self.check(lib.cuDeviceGetName(name, 256, self.device), "cuDeviceGetName")
        self.device_name = name.value.decode(errors="replace")
        self.emulated = hasattr(lib, "custodyEmuVersion")
        # bench/stub_driver.c: the emulator with a few-nanosecond allocation hot path.
        self.stub = hasattr(lib, "custodyStubDriver")
        ctx = vp()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.device), "cuDevicePrimaryCtxRetain")
        self.ctx = ctx
        pool = vp()
        self.check(lib.cuDeviceGetMemPool(ctypes.byref(pool), self.device), "cuDeviceGetMemPool")
        self.pool = pool.value

    def is_libcuda(self):
        """Whether `libcuda.so.1`, as the dynamic loader finds it (cuda-bindings and so cuda.core
        load it by that name), is this driver: then every library measured shares it."""
        try:
            other = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return False
        return other._handle == self.lib._handle

    @staticmethod
    def check(status, call):
        if status != 0:
            raise RuntimeError("%s failed with CUDA error %d" % (call, status))

    def make_current(self):
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def create_stream(self):
        stream = ctypes.c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
        return stream.value

    def sync(self, stream):
        self.check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")


def variants_for(args, raw, stream_handle, skipped, versions):
    """Returns [(name, what, run(n))] for every importable library, and records the others."""
    variants = []

    # custody and cuda.core share cuda.core 1.2's names, so one function builds both.
    def core_like(label, module):
        dev = module.Device(0)
        dev.set_current()
        stream = module.Stream.from_handle(stream_handle)
        mr = module.DeviceMemoryResource(dev.device_id)

        def close(n):
            allocate = mr.allocate
            for _ in range(n):
                allocate(SIZE, stream=stream).close()

        def close_on(n):
            allocate = mr.allocate
            for _ in range(n):
                allocate(SIZE, stream=stream).close(stream=stream)

        def drop(n):
            allocate = mr.allocate
            for _ in range(n):
                allocate(SIZE, stream=stream)

        variants.append(("%s: allocate+close" % label, "mr.allocate(256, stream=s); buf.close()", close))
        variants.append(("%s: allocate+close(stream)" % label, "mr.allocate(256, stream=s); buf.close(stream=s)", close_on))
        variants.append(("%s: allocate+drop" % label, "mr.allocate(256, stream=s), dropped (refcount)", drop))

        caching = getattr(module, "CachingMemoryResource", None) if label == "custody" else None
        if caching is not None:
            # custody's opt-in cache over the same pool: after the first pair every allocation
            # is served from the stream's bin and every close gives the block back. On a stream
            # custody created, no driver call; on the wrapped one (the bench's stream, wrapped
            # from its int handle, as every PyTorch, CuPy or JAX stream reaches custody) the
            # close records an event on the stream, which the cache cannot keep alive.
            cache = caching(mr)
            custody_cache.append(cache)
            created = dev.create_stream()
            keep.append(created)

            def caching_on(on):
                def run(n):
                    allocate = cache.allocate
                    for _ in range(n):
                        allocate(SIZE, stream=on).close()
                return run

            variants.append(("%s (caching, created stream): allocate+close" % label,
                             "CachingMemoryResource(mr).allocate(256, stream=dev.create_stream()); buf.close()",
                             caching_on(created)))
            variants.append(("%s (caching, wrapped stream): allocate+close" % label,
                             "CachingMemoryResource(mr).allocate(256, stream=Stream.from_handle(int)); buf.close()",
                             caching_on(stream)))

        def worker():
            # On the worker thread: the device current there, a stream of its own.
            dev.set_current()
            own = dev.create_stream()

            def run(n):
                allocate = mr.allocate
                for _ in range(n):
                    allocate(SIZE, stream=own).close()
                own.sync()
            return run

        thread_workers.append((label, "mr.allocate(256, stream=s); buf.close(), a stream per thread", worker))
        return mr, stream

    set_stream_variants = []
    thread_workers = []
    keep = []  # objects the variants use, alive until the process ends
    custody_cache = []  # custody's caching resource, for the adapters' variants

    def set_stream_variant(label, module, mr, stream):
        other = module.Device(0).create_stream()
        buf = mr.allocate(SIZE, stream=stream)

        def run(n):
            setter = buf.set_deallocation_stream
            for i in range(n // 2):
                setter(other)
                setter(stream)

        set_stream_variants.append(("%s: set_deallocation_stream" % label,
                                    "buf.set_deallocation_stream(s), alternating two streams", run,
                                    (buf, other)))

    try:
        import custody
        versions["custody"] = getattr(custody, "__version__", "unknown")
        mr, stream = core_like("custody", custody)
        set_stream_variant("custody", custody, mr, stream)
    except Exception as error:  # noqa: BLE001 - any failure to import or set up is a skip reason
        skipped.append({"name": "custody", "reason": "%s: %s" % (type(error).__name__, error)})

    # cuda-bindings, and so cuda.core, load `libcuda.so.1`: measured only when that is the driver
    # custody uses (for the emulator or the stub, a folder with a `libcuda.so.1` link to it first
    # on LD_LIBRARY_PATH, as `cargo xtask bench` sets up).
    other_driver = None if raw.is_libcuda() else (
        "libcuda.so.1 is not %s, the driver custody uses (put a folder with a libcuda.so.1 link "
        "to it first on LD_LIBRARY_PATH)" % raw.path)

    try:
        if other_driver:
            raise RuntimeError(other_driver)
        try:
            import cuda.core as core
            core.Device  # cuda.core >= 0.4 / 1.x
        except (ImportError, AttributeError):
            import cuda.core.experimental as core
        import cuda.core
        versions["cuda.core"] = getattr(cuda.core, "__version__", "unknown")
        mr, stream = core_like("cuda.core", core)
        set_stream_variant("cuda.core", core, mr, stream)
    except Exception as error:  # noqa: BLE001
        skipped.append({"name": "cuda.core", "reason": "%s: %s" % (type(error).__name__, error)})

    for spec in args.compare or ():
        # Another build of custody (or any package with cuda.core's names), measured side by
        # side: `--compare custody_before=custody-before` imports package `custody_before`.
        module_name, _, label = spec.partition("=")
        label = label or module_name
        try:
            import importlib
            other = importlib.import_module(module_name)
            versions[label] = getattr(other, "__version__", "unknown")
            mr, stream = core_like(label, other)
            set_stream_variant(label, other, mr, stream)
        except Exception as error:  # noqa: BLE001
            skipped.append({"name": label, "reason": "%s: %s" % (type(error).__name__, error)})

    try:
        if other_driver:
            raise RuntimeError(other_driver)
        import cupy
        versions["cupy"] = cupy.__version__
        pool = cupy.cuda.MemoryAsyncPool()  # device's current pool, cudaMallocFromPoolAsync
        cupy_stream = cupy.cuda.ExternalStream(stream_handle)

        def cupy_run(n):
            malloc = pool.malloc
            with cupy_stream:
                for _ in range(n):
                    malloc(SIZE)

        variants.append(("CuPy: MemoryAsyncPool malloc+drop",
                         "MemoryAsyncPool().malloc(256) in `with ExternalStream(s)`, dropped", cupy_run))
    except Exception as error:  # noqa: BLE001
        skipped.append({"name": "CuPy", "reason": "%s: %s" % (type(error).__name__, error)})

    try:
        if other_driver:
            raise RuntimeError(other_driver)
        import cupy
        versions["cupy"] = cupy.__version__
        # CuPy's default allocator, what `cupy.cuda.alloc` calls unless changed: the default
        # caching MemoryPool, binned per stream (the current one, `with stream:`); a block goes
        # back to the pool when its MemoryPointer goes.
        cupy_stream = cupy.cuda.ExternalStream(stream_handle)
        cupy_alloc = cupy.get_default_memory_pool().malloc

        def cupy_pool_run(n):
            with cupy_stream:
                for _ in range(n):
                    cupy_alloc(SIZE)

        variants.append(("CuPy: MemoryPool alloc+release",
                         "cupy.get_default_memory_pool().malloc(256) (what cupy.cuda.alloc calls) in `with ExternalStream(s)`, dropped",
                         cupy_pool_run))
        if custody_cache:
            # custody's adapter (custody.interop.CupyAllocator) over the same caching resource,
            # called as CuPy calls its allocator (set_allocator would change it for the
            # MemoryPool variant too).
            from custody.interop import CupyAllocator
            through = CupyAllocator(custody_cache[0])

            def cupy_custody_run(n):
                with cupy_stream:
                    for _ in range(n):
                        through(SIZE)

            variants.append(("CuPy through custody: CupyAllocator(CachingMemoryResource) alloc+release",
                             "custody.interop.CupyAllocator(CachingMemoryResource(mr))(256) in `with ExternalStream(s)`, dropped",
                             cupy_custody_run))
    except Exception as error:  # noqa: BLE001
        skipped.append({"name": "CuPy MemoryPool", "reason": "%s: %s" % (type(error).__name__, error)})

    try:
        if other_driver:
            raise RuntimeError(other_driver)
        import torch
        versions["torch"] = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.cuda.set_device(0)
        torch_stream = torch.cuda.ExternalStream(stream_handle, device=0)
        torch_alloc, torch_delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

        def torch_run(n):
            for _ in range(n):
                torch_delete(torch_alloc(SIZE, 0, torch_stream))

        variants.append(("PyTorch: caching_allocator_alloc+delete",
                         "torch.cuda.caching_allocator_alloc(256, 0, ExternalStream(s)) + torch.cuda.caching_allocator_delete",
                         torch_run))
    except Exception as error:  # noqa: BLE001
        skipped.append({"name": "PyTorch", "reason": "%s: %s" % (type(error).__name__, error)})

    try:
        from cuda.bindings import driver as cb
        import cuda.bindings
        versions["cuda-bindings"] = getattr(cuda.bindings, "__version__", "unknown")
        if other_driver:
            raise RuntimeError(other_driver)
        success = cb.CUresult.CUDA_SUCCESS
        err, cb_pool = cb.cuDeviceGetMemPool(cb.CUdevice(0))
        if err != success:
            raise RuntimeError("cuDeviceGetMemPool: %s" % err)
        cb_stream = cb.CUstream(stream_handle)

        def bindings_run(n):
            alloc, free = cb.cuMemAllocFromPoolAsync, cb.cuMemFreeAsync
            for _ in range(n):
                err, ptr = alloc(SIZE, cb_pool, cb_stream)
                if err != success:
                    raise RuntimeError("cuMemAllocFromPoolAsync: %s" % err)
                (err,) = free(ptr, cb_stream)
                if err != success:
                    raise RuntimeError("cuMemFreeAsync: %s" % err)

        variants.append(("raw cuda-bindings", "cuMemAllocFromPoolAsync + cuMemFreeAsync (cuda.bindings.driver)",
                         bindings_run))

        def bindings_worker():
            raw.make_current()
            own = cb.CUstream(raw.create_stream())

            def run(n):
                alloc, free = cb.cuMemAllocFromPoolAsync, cb.cuMemFreeAsync
                for _ in range(n):
                    err, ptr = alloc(SIZE, cb_pool, own)
                    if err != success:
                        raise RuntimeError("cuMemAllocFromPoolAsync: %s" % err)
                    (err,) = free(ptr, own)
                    if err != success:
                        raise RuntimeError("cuMemFreeAsync: %s" % err)
                raw.sync(int(own))
            return run

        thread_workers.append(("raw cuda-bindings", "cuMemAllocFromPoolAsync + cuMemFreeAsync, a stream per thread",
                               bindings_worker))
    except Exception as error:  # noqa: BLE001
        skipped.append({"name": "cuda-bindings", "reason": "%s: %s" % (type(error).__name__, error)})

    lib, pool_value = raw.lib, raw.pool

    def ctypes_run(n):
        alloc, free = lib.cuMemAllocFromPoolAsync, lib.cuMemFreeAsync
        ptr = ctypes.c_uint64(0)
        ref = ctypes.byref(ptr)
        for _ in range(n):
            if alloc(ref, SIZE, pool_value, stream_handle) != 0:
                raise RuntimeError("cuMemAllocFromPoolAsync failed")
            if free(ptr.value, stream_handle) != 0:
                raise RuntimeError("cuMemFreeAsync failed")

    variants.append(("raw ctypes", "cuMemAllocFromPoolAsync + cuMemFreeAsync through ctypes", ctypes_run))
    return variants, set_stream_variants, thread_workers


class Threaded:
    """`threads` worker threads, each running `make()`'s function on a share of the pairs of
    one call: a callable like a single-thread variant's, timed by the caller from the start
    barrier to the end barrier. The threads start at construction, so that starting them is
    never timed."""

    def __init__(self, threads, make):
        self.threads = threads
        self.n = 0
        self.error = None
        self.start = threading.Barrier(threads + 1)
        self.end = threading.Barrier(threads + 1)
        self.workers = [threading.Thread(target=self._loop, args=(make,), daemon=True)
                        for _ in range(threads)]
        for worker in self.workers:
            worker.start()

    def _loop(self, make):
        try:
            run = make()
        except Exception as error:  # noqa: BLE001 - reported by the caller
            self.error = error
            run = None
        while True:
            self.start.wait()
            try:
                if run is not None:
                    run(self.n // self.threads)
            except Exception as error:  # noqa: BLE001
                self.error = error
            self.end.wait()

    def __call__(self, n):
        self.n = n
        self.start.wait()
        self.end.wait()
        if self.error is not None:
            raise self.error

    def close(self):
        """Leaves the threads parked (daemons, until the process exits): a thread that ended
        would run its thread-local destructors, and cuda.core's release the primary context
        there, which the emulated driver does not survive (its thread-local state is gone
        by then)."""
        self.workers = []


def warm_up(variants, n, sync, skipped):
    """Runs each variant briefly, untimed; drops (and records) the ones that fail."""
    kept = []
    for variant in variants:
        try:
            variant[2](max(n // 10, 10))
            sync()
            kept.append(variant)
        except Exception as error:  # noqa: BLE001 - a failing library is reported, not fatal
            skipped.append({"name": variant[0], "reason": "failed during warm-up: %s: %s"
                            % (type(error).__name__, error)})
            print("  dropped %s: failed during warm-up: %s" % (variant[0], error))
    return kept


def interleaved(variants, n, reps, sync):
    """samples[k][v]: ns per operation of variant v in repetition k."""
    samples = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for k in range(reps):
            row = [0.0] * len(variants)
            for j in range(len(variants)):
                v = (k + j) % len(variants)
                run = variants[v][2]
                start = time.perf_counter_ns()
                run(n)
                row[v] = (time.perf_counter_ns() - start) / n
                sync()
            samples.append(row)
    finally:
        if enabled:
            gc.enable()
    return samples


def summarize(title, variants, samples, baseline):
    names = [v[0] for v in variants]
    base = names.index(baseline) if baseline in names else None
    print("\n%s" % title)
    print("  %-40s %12s %12s" % ("variant", "median ns", "x " + (baseline or "-")))
    medians = {}
    for v, name in enumerate(names):
        med = median([row[v] for row in samples])
        medians[name] = med
        ratio = ""
        if base is not None and base != v:
            ratio = "%.3f" % median([row[v] / row[base] for row in samples])
        print("  %-40s %12.1f %12s" % (name, med, ratio))
    return medians


def paired(samples, names, a, b):
    """Median over repetitions of a/b (None if either is missing)."""
    if a not in names or b not in names:
        return None
    ia, ib = names.index(a), names.index(b)
    return median([row[ia] / row[ib] for row in samples])


TORCH_THROUGH = "PyTorch through custody: caching_allocator_alloc+delete (use_custody_in_torch)"


def torch_through_custody(args):
    """`--torch-custody`: PyTorch's `caching_allocator_alloc` + `_delete` with custody as its
    allocator (`custody.interop.use_custody_in_torch`, which PyTorch accepts only before its first
    CUDA allocation, so in a process of its own), interleaved with custody's caching pair on the
    same wrapped stream and the raw ctypes pair, for paired ratios inside this process; writes
    the samples as one line of JSON on stdout."""
    raw = Ctypes()
    raw.make_current()
    stream_handle = raw.create_stream()
    import custody
    import custody.interop
    custody.interop.use_custody_in_torch()
    import torch
    torch.cuda.set_device(0)
    torch_stream = torch.cuda.ExternalStream(stream_handle, device=0)
    torch_alloc, torch_delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    dev = custody.Device(0)
    dev.set_current()
    stream = custody.Stream.from_handle(stream_handle)
    cache = custody.CachingMemoryResource(custody.DeviceMemoryResource(0))
    lib, pool_value = raw.lib, raw.pool

    def through(n):
        for _ in range(n):
            torch_delete(torch_alloc(SIZE, 0, torch_stream))

    def caching(n):
        allocate = cache.allocate
        for _ in range(n):
            allocate(SIZE, stream=stream).close()

    def ctypes_run(n):
        alloc, free = lib.cuMemAllocFromPoolAsync, lib.cuMemFreeAsync
        ptr = ctypes.c_uint64(0)
        ref = ctypes.byref(ptr)
        for _ in range(n):
            if alloc(ref, SIZE, pool_value, stream_handle) != 0 or free(ptr.value, stream_handle) != 0:
                raise RuntimeError("the raw pair failed")

    variants = [
        (TORCH_THROUGH, "torch.cuda.caching_allocator_alloc(256, 0, ExternalStream(s)) + _delete, "
                        "custody's CUDAPluggableAllocator (a custody buffer of the device's pool each)", through),
        ("custody (caching, wrapped stream): allocate+close",
         "CachingMemoryResource(mr).allocate(256, stream=Stream.from_handle(int)); buf.close()", caching),
        ("raw ctypes", "cuMemAllocFromPoolAsync + cuMemFreeAsync through ctypes", ctypes_run),
    ]

    def sync():
        raw.sync(stream_handle)

    skipped = []
    variants = warm_up(variants, args.pairs, sync, skipped)
    samples = interleaved(variants, args.pairs, args.reps, sync)
    print(json.dumps({"torch": torch.__version__, "skipped": skipped, "variants": [
        {"name": n, "what": w, "ns_per_op": [round(row[i], 3) for row in samples]}
        for i, (n, w, _) in enumerate(variants)]}))
    return 0


def run_torch_through_custody(args, skipped, versions):
    """Runs `--torch-custody` in a child process; returns its comparison, or None (a skip
    recorded) when PyTorch or custody's allocator library is not there."""
    import subprocess
    library = os.environ.get("CUSTODY_TORCH_ALLOCATOR")
    if not library or not os.path.isfile(library):
        skipped.append({"name": "PyTorch through custody",
                        "reason": "CUSTODY_TORCH_ALLOCATOR names no libcustody_torch.so (%r)" % library})
        return None
    command = [sys.executable, os.path.abspath(__file__), "--torch-custody",
               "--pairs", str(args.pairs), "--reps", str(args.reps)]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        skipped.append({"name": "PyTorch through custody", "reason": "the child process failed (%d): %s"
                        % (done.returncode, (done.stderr or done.stdout)[-800:])})
        return None
    result = json.loads(lines[-1])
    for skip in result["skipped"]:
        skipped.append(skip)
    versions.setdefault("torch", result["torch"])
    names = [v["name"] for v in result["variants"]]
    rows = list(zip(*[v["ns_per_op"] for v in result["variants"]]))
    summarize("PyTorch with custody as its allocator (a process of its own)",
              [(n, None, None) for n in names], [list(r) for r in rows], "raw ctypes")
    return {
        "group": "py-torch-custody", "param": None,
        "title": "PyTorch's caching_allocator_alloc+delete with custody as its allocator, 256 B, "
                 "one wrapped stream (a process of its own, paired there)",
        "op": "pair", "baseline": "raw ctypes", "subject": TORCH_THROUGH,
        "variants": result["variants"],
        "iters": [args.pairs] * len(rows),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20000, help="pairs per variant per repetition (default 20000)")
    parser.add_argument("--reps", type=int, default=21, help="interleaved repetitions (default 21)")
    parser.add_argument("--quick", action="store_true", help="5000 pairs x 9 repetitions")
    parser.add_argument("--json", help="write the samples and summary here")
    parser.add_argument("--compare", action="append", metavar="MODULE[=LABEL]",
                        help="also measure another package with cuda.core's names (e.g. a copy of "
                             "an older custody build, imported as MODULE), interleaved with the rest")
    parser.add_argument("--raw-c-ns", type=float, help="the raw C pair from the Rust benchmark, for the ratio")
    parser.add_argument("--threads", default="1,2,4,8",
                        help="thread counts for the threaded allocate+close comparison (default 1,2,4,8; "
                             "'' for none)")
    parser.add_argument("--only", metavar="VARIANT",
                        help="run this one variant (its full name) --pairs times after a short warm-up, "
                             "untimed, and exit: for an instruction count under callgrind "
                             "(bench/callgrind.py)")
    parser.add_argument("--torch-custody", action="store_true",
                        help="measure PyTorch with custody as its allocator (use_custody_in_torch) in "
                             "this process and print the samples as JSON (run by the main process)")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.reps = 5000, 9
    if args.torch_custody:
        return torch_through_custody(args)
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]

    raw = Ctypes()
    raw.make_current()
    stream_handle = raw.create_stream()
    print("python_bench: Python %s, driver %s (version %d, %s), device 0: %s; %d pairs x %d repetitions"
          % (platform.python_version(), raw.path, raw.version,
             "STUB" if raw.stub else "EMULATED" if raw.emulated else "real",
             raw.device_name, args.pairs, args.reps))

    skipped, versions = [], {}
    variants, set_stream, thread_workers = variants_for(args, raw, stream_handle, skipped, versions)
    for skip in skipped:
        print("  skipped %s: %s" % (skip["name"], skip["reason"]))

    def sync():
        raw.sync(stream_handle)

    if args.only:
        chosen = [v for v in variants + set_stream if v[0] == args.only]
        if not chosen:
            print("python_bench: no variant %r; there are: %s"
                  % (args.only, ", ".join(v[0] for v in variants + set_stream)))
            return 2
        run = chosen[0][2]
        run(100)
        sync()
        gc.disable()
        run(args.pairs)
        sync()
        return 0

    variants = warm_up(variants, args.pairs, sync, skipped)
    set_stream = warm_up(set_stream, args.pairs, sync, skipped)
    names = [v[0] for v in variants]
    baseline = "raw cuda-bindings" if "raw cuda-bindings" in names else "raw ctypes"
    samples = interleaved(variants, args.pairs, args.reps, sync)
    summarize("alloc+free pair, 256 B, device 0's current pool, one created stream", variants, samples, baseline)
    comparisons = [{
        "group": "py-pair", "param": None,
        "title": "alloc+free pair from Python, 256 B, one created stream",
        "op": "pair", "baseline": baseline, "subject": "custody: allocate+close",
        "variants": [{"name": n, "what": w, "ns_per_op": [round(row[i], 3) for row in samples]}
                     for i, (n, w, _) in enumerate(variants)],
        "iters": [args.pairs] * len(samples),
    }]
    findings = {}
    # custody's time over cuda.core's for the same calls (paired): what the targets are stated in.
    for what in ("allocate+close", "allocate+close(stream)", "allocate+drop"):
        ratio = paired(samples, names, "custody: " + what, "cuda.core: " + what)
        if ratio is not None:
            findings["custody / cuda.core, %s" % what] = ratio
            print("  custody %s takes %.2fx cuda.core's time%s" % (
                what, ratio, " (target <= 0.75)" if what == "allocate+close" else ""))
    for where in ("created stream", "wrapped stream"):
        caching = "custody (caching, %s): allocate+close" % where
        ratio = paired(samples, names, caching, "cuda.core: allocate+close")
        if ratio is not None:
            findings["custody (caching, %s) / cuda.core, allocate+close" % where] = ratio
            print("  custody's caching resource allocate+close on a %s takes %.2fx cuda.core's time "
                  "(target <= 0.35)" % (where, ratio))
        ratio = paired(samples, names, caching, "PyTorch: caching_allocator_alloc+delete")
        if ratio is not None:
            findings["custody (caching, %s) / PyTorch caching_allocator" % where] = ratio
            print("  custody's caching resource allocate+close on a %s takes %.2fx PyTorch's "
                  "caching_allocator_alloc+delete (target <= 1)" % (where, ratio))
    if args.raw_c_ns and "custody: allocate+close" in names:
        custody_med = median([row[names.index("custody: allocate+close")] for row in samples])
        findings["custody allocate+close / raw C pair"] = custody_med / args.raw_c_ns
        print("  custody allocate+close is %.2fx the raw C pair of %.1f ns (target <= 1.5)"
              % (custody_med / args.raw_c_ns, args.raw_c_ns))

    if "PyTorch: caching_allocator_alloc+delete" in names:
        through = run_torch_through_custody(args, skipped, versions)
        if through is not None:
            comparisons.append(through)
    else:
        skipped.append({"name": "PyTorch through custody", "reason": "PyTorch was not measured"})

    if set_stream:
        s_samples = interleaved(set_stream, args.pairs, args.reps, sync)
        summarize("set_deallocation_stream, alternating two created streams", set_stream, s_samples, None)
        comparisons.append({
            "group": "py-set_deallocation_stream", "param": None,
            "title": "set_deallocation_stream from Python, alternating two created streams",
            "op": "call", "baseline": None, "subject": set_stream[0][0],
            "variants": [{"name": n, "what": w, "ns_per_op": [round(row[i], 3) for row in s_samples]}
                         for i, (n, w, _, _) in enumerate(set_stream)],
            "iters": [args.pairs] * len(s_samples),
        })
        s_names = [v[0] for v in set_stream]
        ratio = paired(s_samples, s_names, "custody: set_deallocation_stream", "cuda.core: set_deallocation_stream")
        if ratio is not None:
            findings["custody / cuda.core, set_deallocation_stream"] = ratio
            print("  custody set_deallocation_stream takes %.2fx cuda.core's time (target <= 0.4)" % ratio)
        for _, _, _, (buf, _) in set_stream:
            buf.close()

    for threads in args.threads:
        if not thread_workers:
            break
        threaded = [("%s" % label, what, Threaded(threads, make)) for label, what, make in thread_workers]
        kept = warm_up(threaded, args.pairs, sync, skipped)
        for variant in threaded:
            if variant not in kept:
                variant[2].close()
        if not kept:
            continue
        t_samples = interleaved(kept, args.pairs, args.reps, sync)
        t_names = [v[0] for v in kept]
        t_base = "cuda.core" if "cuda.core" in t_names else t_names[0]
        summarize("%d thread(s) allocating and closing, a created stream each" % threads, kept, t_samples, t_base)
        comparisons.append({
            "group": "py-threads", "param": threads,
            "title": "threads allocating and closing from Python, a created stream each",
            "op": "pair", "baseline": t_base, "subject": "custody",
            "variants": [{"name": n, "what": w, "ns_per_op": [round(row[i], 3) for row in t_samples]}
                         for i, (n, w, _) in enumerate(kept)],
            "iters": [args.pairs] * len(t_samples),
        })
        ratio = paired(t_samples, t_names, "custody", "cuda.core")
        if ratio is not None:
            findings["custody / cuda.core, allocate+close on %d thread(s)" % threads] = ratio
        for _, _, runner in kept:
            runner.close()
    sync()

    if args.json:
        result = {
            "format": "custody-bench/1",
            "suite": "python",
            "unix_time": int(time.time()),
            "driver": {"path": raw.path, "version": raw.version, "emulated": raw.emulated,
                       "stub": raw.stub, "device": raw.device_name},
            "host": {"os": platform.system().lower(), "arch": platform.machine(), "cpus": os.cpu_count(),
                     "python": platform.python_version()},
            "settings": {"quick": args.quick, "samples": args.reps, "pairs": args.pairs},
            "versions": versions,
            "skipped": skipped,
            "raw_c_pair_ns": args.raw_c_ns,
            "findings": findings,
            "comparisons": comparisons,
        }
        directory = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(directory, exist_ok=True)
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
            out.write("\n")
        print("python_bench: results written to %s" % args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
