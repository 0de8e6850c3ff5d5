/*
 * CUDA at comm create/destroy (see cuda_comm.h).
 */
#include "cuda_comm.h"

#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "cudawrap.h"
#include "log.h"

int weft_cuda_comm_card(struct weft_comm *c, struct weft_rank_card *mine)
{
    char why[512] = "";

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

int weft_cuda_comm_connect(struct weft_comm *c)
{
    (void)c;
    return WEFT_SUCCESS;
}

void weft_cuda_comm_fini(struct weft_comm *c)
{
    (void)c;
}
