// Driver probe: prints what the real driver returns for the cases the emulated driver must match.
// Build and run on a GPU host: nvcc probe.c -o probe -lcuda -lpthread && ./probe
// Output of one run: h200-580.159.04.txt (NVIDIA H200, driver 580.159.04, CUDA 13.0, 2026-11-29).
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/wait.h>
#include <stdint.h>
#if CUDA_VERSION >= 13000
#define CTX_CREATE(pc, f, d) cuCtxCreate(pc, NULL, f, d)
#else
#define CTX_CREATE(pc, f, d) cuCtxCreate(pc, f, d)
#endif

static const char *nm(CUresult r){const char*s=0; if(cuGetErrorName(r,&s)!=CUDA_SUCCESS||!s) return "?"; return s;}
#define P(label, expr) do { CUresult _r = (expr); printf("%-60s %s(%d)\n", label, nm(_r), (int)_r); fflush(stdout);} while(0)
#define FORK(label, body) do { fflush(stdout); pid_t _p=fork(); if(_p==0){ body; fflush(stdout); _exit(0);} int _st; waitpid(_p,&_st,0); if(WIFSIGNALED(_st)) printf("%-60s CRASHED signal %d\n", label, WTERMSIG(_st)); fflush(stdout);} while(0)

static CUdevice dev; static CUcontext prim;
static void *thr_noctx(void *arg){ (void)arg; CUcontext c=(CUcontext)0x1234; P("fresh thread cuCtxGetCurrent", cuCtxGetCurrent(&c)); printf("  -> %p\n", (void*)c);
  CUstream s; P("fresh thread cuStreamCreate (no ctx)", cuStreamCreate(&s,0));
  CUdeviceptr d; P("fresh thread cuMemAlloc (no ctx)", cuMemAlloc(&d,64));
  P("fresh thread cuCtxPopCurrent empty", cuCtxPopCurrent(&c));
  P("fresh thread cuCtxSynchronize no ctx", cuCtxSynchronize());
  CUmemoryPool pool; P("fresh thread cuDeviceGetDefaultMemPool no ctx", cuDeviceGetDefaultMemPool(&pool, dev));
  P("fresh thread cuMemAllocAsync(stream 0) no ctx", cuMemAllocAsync(&d,64,0));
  return 0; }
static volatile int hostfn_done=0; static CUresult hf_results[8];
static void hostfn(void *u){ (void)u; CUcontext c; hf_results[0]=cuCtxGetCurrent(&c); CUdeviceptr d; hf_results[1]=cuMemAlloc(&d,64); hf_results[2]=cuStreamQuery((CUstream)0x1); CUevent e; hf_results[3]=cuEventCreate(&e,0); int v; hf_results[4]=cuDriverGetVersion(&v); hf_results[5]=cuCtxSetCurrent(prim); hostfn_done=1; }
static void sleepfn(void*u){(void)u; usleep(300000);}
static CUresult ud_results[4]; static pthread_t ud_thread; static volatile int ud_ran=0;
static void udtor(void *u){ (void)u; CUcontext c; ud_results[0]=cuCtxGetCurrent(&c); CUdeviceptr d; ud_results[1]=cuMemAlloc(&d,64); ud_results[2]=cuMemFreeAsync(0,0); ud_thread=pthread_self(); ud_ran=1; }

int main(void){
  P("cuInit", cuInit(0)); int v; cuDriverGetVersion(&v); printf("driver version %d\n", v);
  int n; cuDeviceGetCount(&n); printf("device count %d\n", n);
  P("cuDeviceGet(99)", cuDeviceGet(&dev, 99)); P("cuDeviceGet(-1)", cuDeviceGet(&dev, -1));
  P("cuDeviceGet(NULL out)", cuDeviceGet(NULL, 0));
  cuDeviceGet(&dev,0);
  unsigned fl; int act; P("PrimaryCtxGetState before retain", cuDevicePrimaryCtxGetState(dev,&fl,&act)); printf("  active=%d flags=%u\n",act,fl);
  P("PrimaryCtxRelease with refcount 0", cuDevicePrimaryCtxRelease(dev));
  P("PrimaryCtxRetain", cuDevicePrimaryCtxRetain(&prim, dev));
  cuDevicePrimaryCtxGetState(dev,&fl,&act); printf("  after retain active=%d\n",act);
  CUcontext prim2; cuDevicePrimaryCtxRetain(&prim2, dev); printf("  same primary twice: %d\n", prim==prim2);
  cuDevicePrimaryCtxRelease(dev);
  { pthread_t t; pthread_create(&t,0,thr_noctx,0); pthread_join(t,0); }
  P("cuCtxDestroy(primary)", cuCtxDestroy(prim));
  CUcontext a,b,c;
  P("cuCtxSetCurrent(prim)", cuCtxSetCurrent(prim));
  P("cuCtxCreate a", CTX_CREATE(&a,0,dev)); cuCtxGetCurrent(&c); printf("  current==a %d\n", c==a);
  P("cuCtxCreate b", CTX_CREATE(&b,0,dev));
  P("cuCtxSetCurrent(NULL) with stack prim,a,b", cuCtxSetCurrent(NULL)); cuCtxGetCurrent(&c); printf("  current after set NULL: %s\n", c==NULL?"NULL":c==a?"a":c==b?"b":c==prim?"prim":"other");
  P("cuCtxPopCurrent after set NULL", cuCtxPopCurrent(&c)); printf("  popped %s\n", c==NULL?"NULL":c==a?"a":c==b?"b":c==prim?"prim":"other");
  cuCtxGetCurrent(&c); printf("  current now: %s\n", c==NULL?"NULL":c==a?"a":c==b?"b":c==prim?"prim":"other");
  P("cuCtxPopCurrent again", cuCtxPopCurrent(&c)); printf("  popped %s\n", c==NULL?"NULL":c==a?"a":c==b?"b":c==prim?"prim":"other");
  cuCtxGetCurrent(&c); printf("  current now: %s\n", c==NULL?"NULL":c==a?"a":c==b?"b":c==prim?"prim":"other");
  P("cuCtxPopCurrent NULL out", cuCtxPopCurrent(NULL));
  while (cuCtxPopCurrent(&c)==CUDA_SUCCESS) {}
  P("cuCtxPushCurrent(NULL)", cuCtxPushCurrent(NULL));
  P("cuCtxSetCurrent(prim)", cuCtxSetCurrent(prim));
  P("cuCtxPushCurrent(prim) twice", cuCtxPushCurrent(prim));
  P("cuCtxDestroy(b) not current", cuCtxDestroy(b));
  FORK("cuCtxSetCurrent(destroyed b)", P("cuCtxSetCurrent(destroyed b)", cuCtxSetCurrent(b)));
  FORK("cuCtxPushCurrent(destroyed b)", P("cuCtxPushCurrent(destroyed b)", cuCtxPushCurrent(b)));
  P("cuCtxDestroy(a)", cuCtxDestroy(a));
  while (cuCtxPopCurrent(&c)==CUDA_SUCCESS) {}
  cuCtxSetCurrent(prim);
  // streams
  CUstream s; int pr;
  P("cuStreamCreateWithPriority(-10)", cuStreamCreateWithPriority(&s,0,-10)); cuStreamGetPriority(s,&pr); printf("  priority -> %d\n",pr); cuStreamDestroy(s);
  P("cuStreamCreateWithPriority(5)", cuStreamCreateWithPriority(&s,0,5)); cuStreamGetPriority(s,&pr); printf("  priority -> %d\n",pr); cuStreamDestroy(s);
  {CUstream s7; P("cuStreamCreate flags 7", cuStreamCreate(&s7,7));} cuStreamCreate(&s,0);
  P("cuStreamCreate NULL out", cuStreamCreate(NULL,0));
  unsigned sf; P("cuStreamGetFlags(legacy)", cuStreamGetFlags(CU_STREAM_LEGACY,&sf)); printf("  flags %u\n", sf);
  P("cuStreamGetPriority(NULL stream)", cuStreamGetPriority(0,&pr)); printf("  prio %d\n", pr);
  CUcontext sc; P("cuStreamGetCtx(legacy)", cuStreamGetCtx(CU_STREAM_LEGACY,&sc)); printf("  ==prim %d\n", sc==prim);
  P("cuStreamGetCtx(per-thread)", cuStreamGetCtx(CU_STREAM_PER_THREAD,&sc)); printf("  ==prim %d\n", sc==prim);
  P("cuStreamDestroy(legacy token)", cuStreamDestroy(CU_STREAM_LEGACY));
  P("cuStreamDestroy(NULL)", cuStreamDestroy(NULL));
  CUstream s2; cuStreamCreate(&s2,0); cuStreamDestroy(s2);
  FORK("cuStreamQuery(destroyed)", P("cuStreamQuery(destroyed)", cuStreamQuery(s2)));
  FORK("cuStreamDestroy(destroyed)", P("cuStreamDestroy(destroyed)", cuStreamDestroy(s2)));
  FORK("cuStreamGetCtx(destroyed)", P("cuStreamGetCtx(destroyed)", cuStreamGetCtx(s2,&sc)));
  FORK("cuStreamQuery(garbage 0x1000)", P("cuStreamQuery(garbage 0x1000)", cuStreamQuery((CUstream)0x1000)));
  CUevent e; cuEventCreate(&e,0);
  P("cuEventQuery(never recorded)", cuEventQuery(e));
  P("cuEventSynchronize(never recorded)", cuEventSynchronize(e));
  P("cuEventCreate flags 0xff", cuEventCreate(&e, 0xff));
  CUevent e2; cuEventCreate(&e2,0); cuEventDestroy(e2);
  FORK("cuEventQuery(destroyed)", P("cuEventQuery(destroyed)", cuEventQuery(e2)));
  FORK("cuEventRecord(destroyed)", P("cuEventRecord(destroyed)", cuEventRecord(e2, s)));
  FORK("cuStreamWaitEvent(destroyed ev)", P("cuStreamWaitEvent(destroyed ev)", cuStreamWaitEvent(s, e2, 0)));
  // memory
  CUdeviceptr d;
  P("cuMemAlloc(0)", cuMemAlloc(&d,0));
  P("cuMemAlloc NULL out", cuMemAlloc(NULL,64));
  P("cuMemAlloc(huge 1<<50)", cuMemAlloc(&d,(size_t)1<<50));
  P("cuMemFree(0)", cuMemFree(0));
  P("cuMemFree(0x1000 never allocated)", cuMemFree(0x1000));
  cuMemAlloc(&d,256);
  P("cuMemFree(interior ptr)", cuMemFree(d+16));
  P("cuMemFree ok", cuMemFree(d));
  P("cuMemFree double", cuMemFree(d));
  void *h; P("cuMemAllocHost(0)", cuMemAllocHost(&h,0));
  P("cuMemFreeHost(malloc ptr)", cuMemFreeHost(malloc(16)));
  P("cuMemFreeHost(NULL)", cuMemFreeHost(NULL));
  P("cuMemAllocManaged(flags 0)", cuMemAllocManaged(&d,64,0));
  P("cuMemAllocManaged(GLOBAL)", cuMemAllocManaged(&d,64,CU_MEM_ATTACH_GLOBAL)); cuMemFree(d);
  P("cuMemAllocAsync(0 bytes)", cuMemAllocAsync(&d,0,s));
  P("cuMemFreeAsync(0,s)", cuMemFreeAsync(0,s));
  P("cuMemFreeAsync(0x1000,s) never allocated", cuMemFreeAsync(0x1000,s));
  cuMemAllocAsync(&d,64,s);
  P("cuMemFreeAsync ok", cuMemFreeAsync(d,s));
  P("cuMemFreeAsync double (same stream)", cuMemFreeAsync(d,s));
  cuStreamSynchronize(s);
  P("cuMemFreeAsync double after sync", cuMemFreeAsync(d,s));
  cuMemAlloc(&d,256);
  P("cuMemFreeAsync of cuMemAlloc memory", cuMemFreeAsync(d,s)); cuStreamSynchronize(s);
  P("cuMemsetD8 out of range", cuMemAlloc(&d,256)); P("  memset 512 on 256", cuMemsetD8(d,1,512));
  P("cuMemsetD32 unaligned", cuMemsetD32(d+1,1,4));
  P("cuMemsetD16 unaligned", cuMemsetD16(d+1,1,4));
  P("cuMemsetD8 count 0", cuMemsetD8(d,1,0));
  char hb[512]; P("cuMemcpyDtoH out of range", cuMemcpyDtoH(hb,d,512));
  P("cuMemcpy 0 bytes", cuMemcpy(d,d,0));
  unsigned long long attr; CUcontext actx;
  P("cuPointerGetAttribute(CONTEXT, dev ptr)", cuPointerGetAttribute(&actx, CU_POINTER_ATTRIBUTE_CONTEXT, d)); printf("  ==prim %d\n", actx==prim);
  unsigned mt; P("cuPointerGetAttribute(MEMORY_TYPE, stack ptr)", cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)hb));
  int ord; P("cuPointerGetAttribute(DEVICE_ORDINAL, stack ptr)", cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)hb));
  P("cuPointerGetAttribute(RANGE_SIZE, interior)", cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d+8)); printf("  size %llu\n", attr);
  CUmemoryPool mp; P("cuPointerGetAttribute(MEMPOOL_HANDLE, cuMemAlloc ptr)", cuPointerGetAttribute(&mp, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d)); printf("  pool %p\n", (void*)mp);
  cuMemFree(d);
  // pools
  CUmemoryPool defp, cur; cuDeviceGetDefaultMemPool(&defp, dev); cuDeviceGetMemPool(&cur, dev); printf("default==current %d\n", defp==cur);
  P("cuMemPoolDestroy(default pool)", cuMemPoolDestroy(defp));
  CUmemPoolProps pp; memset(&pp,0,sizeof pp); pp.allocType=CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type=CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id=0;
  CUmemoryPool op; P("cuMemPoolCreate", cuMemPoolCreate(&op,&pp));
  cuMemAllocFromPoolAsync(&d, 1000, op, s); cuStreamSynchronize(s);
  cuuint64_t u=0,r=0; cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,&u); cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&r); printf("pool 1000B alloc: used %llu reserved %llu\n",(unsigned long long)u,(unsigned long long)r);
  P("cuMemPoolDestroy with live alloc", cuMemPoolDestroy(op));
  FORK("cuMemFreeAsync after pool destroyed", P("cuMemFreeAsync after pool destroyed", cuMemFreeAsync(d,s)); P("  sync", cuStreamSynchronize(s)));
  cuMemPoolCreate(&op,&pp);
  cuMemAllocFromPoolAsync(&d, 1000, op, s); cuMemFreeAsync(d,s);
  cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,&u); cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&r); printf("pool after free no sync: used %llu reserved %llu\n",(unsigned long long)u,(unsigned long long)r);
  cuStreamSynchronize(s);
  cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,&u); cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&r); printf("pool after free+sync: used %llu reserved %llu\n",(unsigned long long)u,(unsigned long long)r);
  cuuint64_t hi; cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_USED_MEM_HIGH,&hi); printf("used high %llu\n",(unsigned long long)hi);
  cuuint64_t thr; cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,&thr); printf("release threshold %llu\n",(unsigned long long)thr);
  cuMemPoolTrimTo(op,0); cuMemPoolGetAttribute(op, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,&r); printf("after trim reserved %llu\n",(unsigned long long)r);
  P("cuMemAllocFromPoolAsync(0 bytes)", cuMemAllocFromPoolAsync(&d,0,op,s));
  pp.maxSize = 1<<21; CUmemoryPool lim; P("cuMemPoolCreate maxSize 2MiB", cuMemPoolCreate(&lim,&pp));
  P("alloc 4MiB from 2MiB pool", cuMemAllocFromPoolAsync(&d,1<<22,lim,s));
  pp.maxSize=0; pp.location.type=CU_MEM_LOCATION_TYPE_HOST; pp.location.id=0; CUmemoryPool hp; P("cuMemPoolCreate host-located", cuMemPoolCreate(&hp,&pp));
  pp.location.type=CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id=7; P("cuMemPoolCreate bad device", cuMemPoolCreate(&hp,&pp));
  // host function G4
  cuLaunchHostFunc(s, hostfn, 0); cuStreamSynchronize(s);
  printf("G4 hostfn: cuCtxGetCurrent %s, cuMemAlloc %s, cuStreamQuery %s, cuEventCreate %s, cuDriverGetVersion %s, cuCtxSetCurrent %s\n", nm(hf_results[0]),nm(hf_results[1]),nm(hf_results[2]),nm(hf_results[3]),nm(hf_results[4]),nm(hf_results[5]));
  // user objects
  CUuserObject uo; P("cuUserObjectCreate flags 0", cuUserObjectCreate(&uo,0,udtor,1,0));
  P("cuUserObjectCreate NO_DESTRUCTOR_SYNC", cuUserObjectCreate(&uo,0,udtor,1,CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  P("cuUserObjectRelease -> destructor", cuUserObjectRelease(uo,1)); printf("  ran synchronously inside release: %d (same thread %d)\n", ud_ran, ud_ran && pthread_equal(ud_thread,pthread_self()));
  usleep(100000); printf("  ran after 100ms: %d\n", ud_ran);
  printf("G4 udtor: cuCtxGetCurrent %s, cuMemAlloc %s, cuMemFreeAsync %s\n", nm(ud_results[0]),nm(ud_results[1]),nm(ud_results[2]));
  // graph with user object, exec destroy with pending launch
  CUgraph g; cuGraphCreate(&g,0); CUgraphNode nd; CUDA_HOST_NODE_PARAMS hpn={sleepfn,0}; cuGraphAddHostNode(&nd,g,0,0,&hpn);
  ud_ran=0; cuUserObjectCreate(&uo,0,udtor,1,CU_USER_OBJECT_NO_DESTRUCTOR_SYNC); P("cuGraphRetainUserObject MOVE", cuGraphRetainUserObject(g,uo,1,CU_GRAPH_USER_OBJECT_MOVE));
  CUgraphExec ge; P("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags(&ge,g,0));
  P("cuGraphDestroy", cuGraphDestroy(g)); printf("  ran after graph destroy: %d\n", ud_ran);
  P("cuGraphLaunch", cuGraphLaunch(ge,s)); P("cuGraphExecDestroy (pending)", cuGraphExecDestroy(ge)); printf("  ran right after exec destroy: %d\n", ud_ran);
  cuStreamSynchronize(s); usleep(50000); printf("  ran after sync: %d other thread %d\n", ud_ran, !pthread_equal(ud_thread,pthread_self()));
  FORK("cuGraphLaunch(destroyed exec)", P("cuGraphLaunch(destroyed exec)", cuGraphLaunch(ge,s)));
  CUgraph g2; cuGraphCreate(&g2,0); CUgraphNode mn; CUDA_MEMSET_NODE_PARAMS msp; memset(&msp,0,sizeof msp); CUdeviceptr md; cuMemAlloc(&md,256); msp.dst=md; msp.elementSize=3; msp.width=4; msp.height=1; msp.value=1;
  P("cuGraphAddMemsetNode elementSize 3", cuGraphAddMemsetNode(&mn,g2,0,0,&msp,prim));
  msp.elementSize=4; msp.width=128; P("cuGraphAddMemsetNode out of range (512B on 256)", cuGraphAddMemsetNode(&mn,g2,0,0,&msp,prim));
  msp.width=4; P("cuGraphAddMemsetNode ok", cuGraphAddMemsetNode(&mn,g2,0,0,&msp,prim));
  P("cuGraphAddMemsetNode ctx NULL", cuGraphAddMemsetNode(&mn,g2,0,0,&msp,NULL));
  CUgraphExec ge2; cuGraphInstantiateWithFlags(&ge2,g2,0); cuMemFree(md);
  FORK("cuGraphLaunch memset on freed memory", P("cuGraphLaunch memset on freed memory", cuGraphLaunch(ge2,s)); P("  sync", cuStreamSynchronize(s)));
  // capture
  P("cuStreamBeginCapture(legacy)", cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstream cs; cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING); P("cuStreamBeginCapture", cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  P("cuMemAlloc during global capture", cuMemAlloc(&d,64));
  P("cuMemAllocAsync on capturing stream", cuMemAllocAsync(&d,64,cs));
  P("cuMemsetD8Async on capturing stream", cuMemsetD8Async(d,1,64,cs));
  P("cuStreamSynchronize capturing", cuStreamSynchronize(cs));
  CUgraph cg; P("cuStreamEndCapture (after illegal sync)", cuStreamEndCapture(cs,&cg));
  P("cuStreamBeginCapture again", cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  P("cuMemAllocAsync", cuMemAllocAsync(&d,64,cs)); P("cuMemFreeAsync", cuMemFreeAsync(d,cs));
  P("cuStreamEndCapture", cuStreamEndCapture(cs,&cg));
  P("cuStreamEndCapture not capturing", cuStreamEndCapture(cs,&cg));
  void *pfn; CUdriverProcAddressQueryResult qr;
  P("cuGetProcAddress(cuMemFree,12000)", cuGetProcAddress("cuMemFree",&pfn,12000,0,&qr)); printf("  status %d same as cuMemFree_v2 %d\n", (int)qr, pfn==(void*)&cuMemFree);
  P("cuGetProcAddress(nonexistent)", cuGetProcAddress("cuNoSuchThing",&pfn,12000,0,&qr)); printf("  status %d\n",(int)qr);
  // G1/G2 synchronous
  ud_ran=0; cuGraphCreate(&g,0); cuUserObjectCreate(&uo,0,udtor,1,CU_USER_OBJECT_NO_DESTRUCTOR_SYNC); cuGraphRetainUserObject(g,uo,1,CU_GRAPH_USER_OBJECT_MOVE);
  CUgraph gc; P("cuGraphClone", cuGraphClone(&gc,g)); cuGraphDestroy(g); printf("  ran after destroying original (clone alive): %d\n", ud_ran);
  cuGraphDestroy(gc); printf("  ran after destroying clone: %d same thread %d\n", ud_ran, ud_ran&&pthread_equal(ud_thread,pthread_self()));
  printf("done\n");
  return 0;
}
