/* Emulator-only entry points of libweft_emu_cuda.so (the emulated CUDA
 * runtime used by weft's tests; see tests/emu/cuda/README.md). Programs that
 * run on real GPUs must not call these. */
#ifndef WEFT_EMU_CUDA_H
#define WEFT_EMU_CUDA_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Queues a step on `stream` that sleeps `usec` microseconds on the stream's
 * worker thread: a slow "kernel" for ordering tests. Returns at once. */
cudaError_t weft_emu_cuda_stream_delay(cudaStream_t stream, unsigned int usec);

/* Process-wide counters of the emulator, by name: "malloc", "free",
 * "ipc_get", "ipc_open", "ipc_close", "ipc_imports" (blocks of other
 * processes mapped now), "memcpy", "memset", "wait_value", "write_value",
 * "streams" (streams alive now, default streams included), "blocks" (device
 * memory blocks alive now), "free_imported" (cudaFree of memory another
 * process had open: undefined behaviour on a GPU), "device_syncs" (calls
 * that synchronised the device), "sync_refused" (such calls refused on a
 * thread that wakes streams while a stream was parked), "module_loads",
 * "launches", "late_h2d" (cudaMemcpy H2D from pageable memory applied
 * late), "wait_value_device" (stream waits on device memory),
 * "event_record_refused" (cudaEventRecord of an event of another device
 * than the stream's), and "node" (the emulated node id this process is on). Unknown
 * names give (unsigned long long)-1. */
unsigned long long weft_emu_cuda_counter(const char *name);

/* The calling thread wakes streams: it writes words that streams wait on
 * (cuStreamWaitValue32) -- weft's progress threads. A call of this thread
 * that synchronises the device (cudaMalloc, cudaMallocHost, cudaFree,
 * cudaHostRegister, cudaIpcOpenMemHandle, cuModuleLoadData, ...) while a
 * stream is parked on a wait that is not satisfied then fails at once with
 * cudaErrorNotPermitted (CUDA_ERROR_NOT_PERMITTED) and a message on stderr,
 * instead of waiting for that stream forever as a GPU would. weft finds it
 * with dlsym; it does not exist in real CUDA. */
void weft_emu_cuda_thread_wakes_streams(void);

/* The "peer-memory module" hook of libweft_emu_verbs.so
 * (WEFT_EMU_VERBS_PEERMEM=1 lets ibv_reg_mr take device pointers, as
 * nvidia-peermem does): a new emulated dma-buf descriptor (see
 * cuMemGetHandleForAddressRange in README.md) for the pages covering
 * [ptr, ptr+size), which must lie inside one device allocation or IPC import
 * of this process; -1 otherwise. The caller closes it. Independent of
 * WEFT_EMU_CUDA_GDR. */
int weft_emu_cuda_peermem_fd(const void *ptr, size_t size);

#ifdef __cplusplus
}
#endif
#endif
