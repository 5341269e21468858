//! The benchmarks' stub driver: a `libcuda.so.1` whose stream-ordered allocation hot path costs a
//! few nanoseconds, so that a profile or a side-by-side timing shows the bindings' own cost
//! instead of the emulated driver's (each emulated call takes the emulator's global lock and
//! logs itself, hundreds of nanoseconds).
//!
//! It answers seven calls itself and hands every other one to the emulated driver
//! (`libcuda_emu.so`), which it is linked against, so that initialisation, devices, contexts,
//! streams and pools are the emulator's, real enough for custody, cuda.core and cuda-bindings:
//!
//! - `cuMemAllocFromPoolAsync`, `cuMemAllocAsync`: a new address from a per-thread range far
//!   from the emulator's (no memory behind it: nothing may read or write it);
//! - `cuMemFreeAsync`: nothing for such an address, the emulator's free for any other;
//! - `cuStreamIsCapturing`: "not capturing" until a capture was begun (then the emulator's);
//! - `cuEventRecord`, `cuStreamWaitEvent`: nothing, until a capture was begun (then the
//!   emulator's): no work the stub runs needs ordering (its allocations have no memory behind
//!   them), and an event never recorded reads as complete to the emulator's queries and waits;
//! - `cuCtxGetCurrent`: the thread's current context, cached after one emulator call; the calls
//!   that change it (`cuCtxSetCurrent`, push and pop, create and destroy, a primary context's
//!   release and reset) go to the emulator and drop the cache. A program that changes the
//!   current context in another way (green contexts) must not run on this stub.
//!
//! A symbol the stub defines is found first by `dlsym` on the stub's handle (custody's loader,
//! ctypes); every other symbol comes from the emulator, a dependency of the stub. For
//! `cuGetProcAddress` / `cuGetProcAddress_v2` (cuda-bindings resolves every entry point so) the
//! emulator's answer is swapped for the stub's function when it is one of those above, whatever
//! version suffix it asked for. `custodyStubDriver` tells a program it runs on the stub.
//!
//! Figures measured on it are the bindings' overhead over a free driver: never GPU figures.
//! Built by `cargo xtask bench --stub` (`xtask/src/bench.rs`, `cc -O2 -shared`).

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3

#ifndef STUB_EMULATOR
#error "build with -DSTUB_EMULATOR=\"/path/to/libcuda_emu.so\""
#endif

/* Stub addresses: thread k allocates from [STUB_BASE + k * STUB_RANGE, ...), 256-byte aligned. */
#define STUB_BASE 0x7e00000000000000ULL
#define STUB_RANGE (1ULL << 40)

static unsigned next_thread_range;

static __thread CUdeviceptr stub_next;
static __thread CUdeviceptr stub_end;
static __thread int ctx_cached;
static __thread CUcontext ctx_current;

static void *emulator;

static void *emulated(const char *name) {
    if (!emulator) {
        emulator = dlopen(STUB_EMULATOR, RTLD_NOW | RTLD_NOLOAD);
        if (!emulator) {
            emulator = dlopen(STUB_EMULATOR, RTLD_NOW | RTLD_LOCAL);
        }
        if (!emulator) {
            fprintf(stderr, "stub driver: cannot open %s: %s\n", STUB_EMULATOR, dlerror());
            abort();
        }
    }
    return dlsym(emulator, name);
}

/* The emulator's function `name` with signature `type`, looked up once. */
#define FORWARD(type, name)                                                               \
    static type real;                                                                     \
    if (!real) {                                                                          \
        real = (type)emulated(name);                                                      \
        if (!real) {                                                                      \
            return CUDA_ERROR_NOT_INITIALIZED;                                            \
        }                                                                                 \
    }

int custodyStubDriver(void) { return 1; }

static int is_stub_address(CUdeviceptr ptr) { return ptr >= STUB_BASE; }

static CUresult stub_alloc(CUdeviceptr *dptr, size_t size) {
    if (!dptr || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t rounded = (size + 255) & ~(size_t)255;
    if (stub_next + rounded > stub_end || stub_next == 0) {
        unsigned k = __atomic_fetch_add(&next_thread_range, 1, __ATOMIC_RELAXED);
        stub_next = STUB_BASE + (CUdeviceptr)k * STUB_RANGE;
        stub_end = stub_next + STUB_RANGE;
    }
    *dptr = stub_next;
    stub_next += rounded;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    (void)pool;
    (void)s;
    return stub_alloc(dptr, size);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    (void)s;
    return stub_alloc(dptr, size);
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s) {
    if (is_stub_address(ptr)) {
        return CUDA_SUCCESS;
    }
    typedef CUresult (*fn)(CUdeviceptr, CUstream);
    FORWARD(fn, "cuMemFreeAsync");
    return real(ptr, s);
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (ctx_cached && pctx) {
        *pctx = ctx_current;
        return CUDA_SUCCESS;
    }
    typedef CUresult (*fn)(CUcontext *);
    FORWARD(fn, "cuCtxGetCurrent");
    CUresult status = real(pctx);
    if (status == CUDA_SUCCESS && pctx) {
        ctx_current = *pctx;
        ctx_cached = 1;
    }
    return status;
}

/* Whether a capture was ever begun: until then no stream is capturing, and
 * cuStreamIsCapturing answers without the emulator (cuda.core asks before every allocation). */
static int capture_begun;

CUresult cuStreamIsCapturing(CUstream s, int *status) {
    if (!__atomic_load_n(&capture_begun, __ATOMIC_ACQUIRE) && status) {
        *status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
        return CUDA_SUCCESS;
    }
    typedef CUresult (*fn)(CUstream, int *);
    FORWARD(fn, "cuStreamIsCapturing");
    return real(s, status);
}

typedef void *CUevent;

CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!__atomic_load_n(&capture_begun, __ATOMIC_ACQUIRE) && e) {
        return CUDA_SUCCESS;
    }
    typedef CUresult (*fn)(CUevent, CUstream);
    FORWARD(fn, "cuEventRecord");
    return real(e, s);
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags) {
    if (!__atomic_load_n(&capture_begun, __ATOMIC_ACQUIRE) && e) {
        return CUDA_SUCCESS;
    }
    typedef CUresult (*fn)(CUstream, CUevent, unsigned);
    FORWARD(fn, "cuStreamWaitEvent");
    return real(s, e, flags);
}

#define BEGINS_CAPTURE(name, params, args, types)                                          \
    CUresult name params {                                                                 \
        typedef CUresult(*fn) types;                                                       \
        FORWARD(fn, #name);                                                                \
        __atomic_store_n(&capture_begun, 1, __ATOMIC_RELEASE);                             \
        return real args;                                                                  \
    }

BEGINS_CAPTURE(cuStreamBeginCapture, (CUstream s), (s), (CUstream))
BEGINS_CAPTURE(cuStreamBeginCapture_v2, (CUstream s, int mode), (s, mode), (CUstream, int))
BEGINS_CAPTURE(cuStreamBeginCaptureToGraph,
               (CUstream s, void *g, void *deps, void *data, size_t n, int mode),
               (s, g, deps, data, n, mode), (CUstream, void *, void *, void *, size_t, int))

/* The calls that change the current context: the emulator's, then the cache is dropped. */
#define CHANGES_CONTEXT(name, params, args, types)                                         \
    CUresult name params {                                                                 \
        typedef CUresult(*fn) types;                                                       \
        FORWARD(fn, #name);                                                                \
        ctx_cached = 0;                                                                    \
        CUresult status = real args;                                                       \
        ctx_cached = 0;                                                                    \
        return status;                                                                     \
    }

CHANGES_CONTEXT(cuCtxSetCurrent, (CUcontext c), (c), (CUcontext))
CHANGES_CONTEXT(cuCtxPushCurrent, (CUcontext c), (c), (CUcontext))
CHANGES_CONTEXT(cuCtxPushCurrent_v2, (CUcontext c), (c), (CUcontext))
CHANGES_CONTEXT(cuCtxPopCurrent, (CUcontext *c), (c), (CUcontext *))
CHANGES_CONTEXT(cuCtxPopCurrent_v2, (CUcontext *c), (c), (CUcontext *))
CHANGES_CONTEXT(cuCtxCreate, (CUcontext *c, unsigned f, CUdevice d), (c, f, d),
                (CUcontext *, unsigned, CUdevice))
CHANGES_CONTEXT(cuCtxCreate_v2, (CUcontext *c, unsigned f, CUdevice d), (c, f, d),
                (CUcontext *, unsigned, CUdevice))
CHANGES_CONTEXT(cuCtxCreate_v3, (CUcontext *c, void *p, int n, unsigned f, CUdevice d),
                (c, p, n, f, d), (CUcontext *, void *, int, unsigned, CUdevice))
CHANGES_CONTEXT(cuCtxCreate_v4, (CUcontext *c, void *p, unsigned f, CUdevice d), (c, p, f, d),
                (CUcontext *, void *, unsigned, CUdevice))
CHANGES_CONTEXT(cuCtxDestroy, (CUcontext c), (c), (CUcontext))
CHANGES_CONTEXT(cuCtxDestroy_v2, (CUcontext c), (c), (CUcontext))
CHANGES_CONTEXT(cuDevicePrimaryCtxRelease, (CUdevice d), (d), (CUdevice))
CHANGES_CONTEXT(cuDevicePrimaryCtxRelease_v2, (CUdevice d), (d), (CUdevice))
CHANGES_CONTEXT(cuDevicePrimaryCtxReset, (CUdevice d), (d), (CUdevice))
CHANGES_CONTEXT(cuDevicePrimaryCtxReset_v2, (CUdevice d), (d), (CUdevice))

/* Every symbol above, by the name the emulator exports it under. */
static const struct {
    const char *name;
    void *stub;
} STUBBED[] = {
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuStreamIsCapturing", (void *)cuStreamIsCapturing},
    {"cuEventRecord", (void *)cuEventRecord},
    {"cuStreamWaitEvent", (void *)cuStreamWaitEvent},
    {"cuStreamBeginCapture", (void *)cuStreamBeginCapture},
    {"cuStreamBeginCapture_v2", (void *)cuStreamBeginCapture_v2},
    {"cuStreamBeginCaptureToGraph", (void *)cuStreamBeginCaptureToGraph},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxPushCurrent", (void *)cuCtxPushCurrent},
    {"cuCtxPushCurrent_v2", (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", (void *)cuCtxPopCurrent},
    {"cuCtxPopCurrent_v2", (void *)cuCtxPopCurrent_v2},
    {"cuCtxCreate", (void *)cuCtxCreate},
    {"cuCtxCreate_v2", (void *)cuCtxCreate_v2},
    {"cuCtxCreate_v3", (void *)cuCtxCreate_v3},
    {"cuCtxCreate_v4", (void *)cuCtxCreate_v4},
    {"cuCtxDestroy", (void *)cuCtxDestroy},
    {"cuCtxDestroy_v2", (void *)cuCtxDestroy_v2},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease},
    {"cuDevicePrimaryCtxRelease_v2", (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset},
    {"cuDevicePrimaryCtxReset_v2", (void *)cuDevicePrimaryCtxReset_v2},
};

/* The stub's function for an emulator function pointer the emulator handed out, if any. */
static void *stub_for(void *pfn) {
    for (size_t i = 0; i < sizeof STUBBED / sizeof STUBBED[0]; i++) {
        void *own = emulated(STUBBED[i].name);
        if (own && own == pfn) {
            return STUBBED[i].stub;
        }
    }
    return NULL;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    typedef CUresult (*fn)(const char *, void **, int, cuuint64_t);
    FORWARD(fn, "cuGetProcAddress");
    CUresult status = real(symbol, pfn, version, flags);
    if (status == CUDA_SUCCESS && pfn && *pfn) {
        void *stub = stub_for(*pfn);
        if (stub) {
            *pfn = stub;
        }
    }
    return status;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             int *status_out) {
    typedef CUresult (*fn)(const char *, void **, int, cuuint64_t, int *);
    FORWARD(fn, "cuGetProcAddress_v2");
    CUresult status = real(symbol, pfn, version, flags, status_out);
    if (status == CUDA_SUCCESS && pfn && *pfn) {
        void *stub = stub_for(*pfn);
        if (stub) {
            *pfn = stub;
        }
    }
    return status;
}
