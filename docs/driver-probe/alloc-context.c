// Which allocation/ops calls need a current context? Run on a thread that never had one.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static CUcontext primary, other;
static CUstream created, created_nb;
static CUmemoryPool pool;
static CUdevice dev;

static const char *name(CUresult r) { const char *s = 0; cuGetErrorName(r, &s); return s ? s : "?"; }
#define SHOW(label, call) do { CUresult r_ = (call); printf("%-70s -> %s (%d)\n", label, name(r_), (int)r_); } while (0)

static void current(const char *when) { CUcontext c = 0; cuCtxGetCurrent(&c); printf("  [%s current=%s]\n", when, c == 0 ? "none" : (c == primary ? "primary" : (c == other ? "other" : "?"))); }

static void *noctx(void *arg) {
    const char *tag = (const char *)arg;
    printf("== thread with %s\n", tag);
    if (strcmp(tag, "other context current") == 0) cuCtxSetCurrent(other);
    current("start");
    CUdeviceptr p = 0; void *h = 0; CUresult r;
    r = cuMemAllocFromPoolAsync(&p, 256, pool, created); printf("%-70s -> %s\n", "cuMemAllocFromPoolAsync(256, default pool, created stream)", name(r));
    if (r == CUDA_SUCCESS) { SHOW("  cuMemFreeAsync(p, created stream)", cuMemFreeAsync(p, created)); }
    p = 0; r = cuMemAllocFromPoolAsync(&p, 256, pool, created_nb); printf("%-70s -> %s\n", "cuMemAllocFromPoolAsync(256, default pool, created non-blocking)", name(r));
    if (r == CUDA_SUCCESS) { SHOW("  cuMemsetD8Async(p, created nb)", cuMemsetD8Async(p, 7, 256, created_nb));
        CUdeviceptr q2 = 0; if (cuMemAllocFromPoolAsync(&q2, 256, pool, created_nb) == 0) {
        SHOW("  cuMemcpyAsync(q, p, created nb)", cuMemcpyAsync(q2, p, 256, created_nb));
        SHOW("  cuMemcpyDtoHAsync(host, p, created nb) (pageable)", cuMemcpyDtoHAsync((char[256]){0}, p, 256, created_nb));
        SHOW("  cuMemFreeAsync(q, created nb)", cuMemFreeAsync(q2, created_nb)); }
        SHOW("  cuStreamSynchronize(created nb)", cuStreamSynchronize(created_nb));
        SHOW("  cuMemFreeAsync(p, created nb)", cuMemFreeAsync(p, created_nb)); }
    p = 0; r = cuMemAllocAsync(&p, 256, created); printf("%-70s -> %s\n", "cuMemAllocAsync(256, created stream)", name(r));
    if (r == CUDA_SUCCESS) SHOW("  cuMemFreeAsync(p, created)", cuMemFreeAsync(p, created));
    p = 0; r = cuMemAllocFromPoolAsync(&p, 256, pool, CU_STREAM_LEGACY); printf("%-70s -> %s\n", "cuMemAllocFromPoolAsync(256, pool, CU_STREAM_LEGACY)", name(r));
    if (r == CUDA_SUCCESS) SHOW("  cuMemFreeAsync(p, created)", cuMemFreeAsync(p, created));
    p = 0; r = cuMemAlloc(&p, 256); printf("%-70s -> %s\n", "cuMemAlloc(256)", name(r));
    if (r == CUDA_SUCCESS) SHOW("  cuMemFree(p)", cuMemFree(p));
    h = 0; r = cuMemAllocHost(&h, 256); printf("%-70s -> %s\n", "cuMemAllocHost(256)", name(r));
    if (r == CUDA_SUCCESS) SHOW("  cuMemFreeHost(h)", cuMemFreeHost(h));
    p = 0; r = cuMemAllocManaged(&p, 256, CU_MEM_ATTACH_GLOBAL); printf("%-70s -> %s\n", "cuMemAllocManaged(256, GLOBAL)", name(r));
    if (r == CUDA_SUCCESS) SHOW("  cuMemFree(managed)", cuMemFree(p));
    CUevent ev = 0; r = cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING); printf("%-70s -> %s\n", "cuEventCreate", name(r));
    if (r == CUDA_SUCCESS) { SHOW("  cuEventRecord(ev, created)", cuEventRecord(ev, created)); SHOW("  cuEventDestroy(ev)", cuEventDestroy(ev)); }
    current("end");
    return 0;
}

static void *alloc_then_free_elsewhere(void *arg) {
    // Memory allocated with the primary current; freed with no context (cuMemFree / cuMemFreeHost / managed).
    (void)arg; return 0;
}

int main(void) {
    cuInit(0); cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&primary, dev); cuCtxSetCurrent(primary);
    cuCtxCreate(&other, NULL, 0, dev); cuCtxSetCurrent(primary);
    cuStreamCreate(&created, 0); cuStreamCreate(&created_nb, CU_STREAM_NON_BLOCKING);
    cuDeviceGetDefaultMemPool(&pool, dev);
    int v = 0; cuDriverGetVersion(&v); printf("driver version %d\n", v);
    pthread_t t; pthread_create(&t, 0, noctx, "no context"); pthread_join(t, 0);
    pthread_create(&t, 0, noctx, "other context current"); pthread_join(t, 0);
    // Synchronous frees of memory allocated under primary, from a context-less thread (F5 and friends).
    CUdeviceptr d = 0, m = 0; void *h = 0;
    cuMemAlloc(&d, 256); cuMemAllocHost(&h, 256); cuMemAllocManaged(&m, 256, CU_MEM_ATTACH_GLOBAL);
    cuCtxSetCurrent(0);
    printf("== main thread, no context, freeing memory allocated under the primary\n");
    SHOW("cuMemFree(cuMemAlloc memory)", cuMemFree(d));
    SHOW("cuMemFreeHost(cuMemAllocHost memory)", cuMemFreeHost(h));
    SHOW("cuMemFree(cuMemAllocManaged memory)", cuMemFree(m));
    (void)alloc_then_free_elsewhere;
    return 0;
}
