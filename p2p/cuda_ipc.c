/*
 * CUDA IPC path (see cuda_ipc.h). Placeholder until the path is written:
 * nothing is eligible, so device messages between ranks of a node are staged.
 */
#include "cuda_ipc.h"

#include "weft.h"

int weft_cuda_ipc_init(struct weft_comm *c) { (void)c; return WEFT_SUCCESS; }
void weft_cuda_ipc_fini(struct weft_comm *c) { (void)c; }
int weft_cuda_ipc_eligible(struct weft_pipe *p, const struct weft_ctrl *rts, const struct weft_request *r)
{
    (void)p; (void)rts; (void)r;
    return 0;
}
int weft_cuda_ipc_export(struct weft_pipe *p, struct weft_request *r, void *payload, size_t *len)
{
    (void)p; (void)r; (void)payload; (void)len;
    return WEFT_ERR_UNSUPPORTED;
}
int weft_cuda_ipc_push(struct weft_pipe *p, struct weft_request *s, const struct weft_ctrl *cts,
                       const void *payload, size_t len)
{
    (void)p; (void)s; (void)cts; (void)payload; (void)len;
    return WEFT_ERR_UNSUPPORTED;
}
int weft_cuda_ipc_progress(struct weft_comm *c) { (void)c; return 0; }
void weft_cuda_ipc_abort_pipe(struct weft_pipe *p) { (void)p; }
