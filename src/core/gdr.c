/*
 * GPUDirect RDMA capability probe (see gdr.h).
 *
 * Two ways exist for a NIC to reach GPU memory:
 *  - a peer-memory kernel module (nvidia-peermem, or the older nv_peer_mem
 *    from Mellanox) lets plain ibv_reg_mr pin GPU virtual addresses;
 *  - dma-buf (Linux 5.12+, rdma-core 34+, CUDA 11.7+ open or recent
 *    proprietary driver): cuMemGetHandleForAddressRange exports a dma-buf fd
 *    that ibv_reg_dmabuf_mr registers.
 * This probe only looks at what is present: the module's sysfs traces and
 * the library symbol. Whether the GPU driver actually exports a dma-buf the
 * NIC accepts can only be known by trying it with real device memory; the
 * CUDA transport does that on first use and falls back to host staging.
 */
#include "gdr.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "log.h"

static pthread_mutex_t gdr_lock = PTHREAD_MUTEX_INITIALIZER;
static struct weft_gdr_info gdr_cached;

/* Where the peer-memory modules show up: nvidia-peermem registers a
 * "memory_peers" client (nv_mem) with the MOFED core; the in-tree module
 * and the old out-of-tree one are also visible under /sys/module. */
static const char *const peermem_paths[] = {
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/module/nvidia_peermem",
    "/sys/module/nv_peer_mem",
};

const struct weft_gdr_info *weft_gdr_probe(int have_dmabuf_symbol, int rank)
{
    pthread_mutex_lock(&gdr_lock);
    if (!gdr_cached.probed) {
        for (size_t i = 0; i < sizeof(peermem_paths) / sizeof(peermem_paths[0]); i++) {
            if (access(peermem_paths[i], F_OK) == 0) {
                gdr_cached.peermem = 1;
                snprintf(gdr_cached.peermem_how, sizeof(gdr_cached.peermem_how), "%s", peermem_paths[i]);
                break;
            }
        }
        gdr_cached.dmabuf = have_dmabuf_symbol != 0;
        gdr_cached.probed = 1;
        WEFT_INFO(rank, "GPUDirect RDMA: peer-memory module %s%s%s, dma-buf registration %s%s",
                  gdr_cached.peermem ? "yes (" : "no", gdr_cached.peermem_how, gdr_cached.peermem ? ")" : "",
                  gdr_cached.dmabuf ? "available (ibv_reg_dmabuf_mr)" : "not available",
                  gdr_cached.peermem || gdr_cached.dmabuf ? "" : "; GPU buffers will be staged through host memory");
    }
    pthread_mutex_unlock(&gdr_lock);
    return &gdr_cached;
}

const struct weft_gdr_info *weft_gdr_info(void)
{
    /* The lock orders this read after the probe's writes (the struct is
     * never written again once probed). */
    pthread_mutex_lock(&gdr_lock);
    const struct weft_gdr_info *g = &gdr_cached;
    pthread_mutex_unlock(&gdr_lock);
    return g;
}
