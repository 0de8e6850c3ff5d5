/*
 * CUDA at comm create/destroy (see cuda_comm.h).
 */
#include "cuda_comm.h"

#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "cuda_ipc.h"
#include "cudawrap.h"
#include "log.h"
#include "stage.h"
#include "stream.h"

int weft_cuda_comm_card(struct weft_comm *c, struct weft_rank_card *mine)
{
    char why[512] = "";

    (void)mine;   /* filled only with the CUDA headers */
    c->cuda = weft_cuda_load(c->cfg.cuda_lib, why, sizeof(why)) == WEFT_SUCCESS;
    if (!c->cuda) {
        if (c->rank == 0)
            WEFT_INFO(c->rank, "cuda: not available, device buffers will be refused: %s", why);
        return WEFT_SUCCESS;
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = weft_cuda_get();
    int n = cu->device_count < 8 ? cu->device_count : 8;
    for (int d = 0; d < n; d++)
        if (cu->DeviceGetPCIBusId(mine->gpu_busid[d], (int)sizeof(mine->gpu_busid[d]), d) != cudaSuccess)
            mine->gpu_busid[d][0] = '\0';
    mine->gpu_count = (uint8_t)n;
    WEFT_INFO(c->rank, "cuda: %s loaded, %d device(s)", cu->path, cu->device_count);
#endif
    return WEFT_SUCCESS;
}

/* The device paths. Staging state (weft's stream; the pinned slot pools
 * come at first use) when this rank has CUDA; a failure there leaves the
 * comm host-only (device buffers refused) rather than failing create. The
 * CUDA IPC path may use MPI, so it is brought up on EVERY rank as soon as
 * any rank's card shows a GPU (a rank without CUDA takes part and offers
 * nothing), and not at all in a job without GPUs. */
int weft_cuda_comm_connect(struct weft_comm *c)
{
    int any_gpu = 0;

    if (c->cuda && weft_stage_init(c) != WEFT_SUCCESS) {
        WEFT_WARN(c->rank, "cuda: staging set-up failed, device buffers will be refused: %s", c->last_error);
        c->cuda = 0;
    }
    for (int r = 0; r < c->size && !any_gpu; r++)
        any_gpu = c->cards[r].gpu_count > 0;
    if (!any_gpu)
        return WEFT_SUCCESS;
    return weft_cuda_ipc_init(c);
}

void weft_cuda_comm_fini(struct weft_comm *c)
{
    weft_stream_comm_fini(c);   /* src/stream.c: progress thread, counters */
    weft_cuda_ipc_fini(c);      /* idempotent, also after a failed create */
    weft_stage_fini(c);         /* waits for copies still on weft's stream */
}
