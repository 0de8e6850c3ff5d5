/*
 * libibverbs, loaded at run time.
 *
 * weft never links libibverbs: one build runs on machines with and without
 * RDMA. weft_ibv_load() dlopens the library named by WEFT_IBVERBS_LIB
 * (default "libibverbs.so.1"; tests point it at the emulated device,
 * tests/emu/verbs/) and resolves every control-path call weft makes into one
 * table. The data path (ibv_post_send, ibv_post_recv, ibv_poll_cq) needs no
 * symbol: verbs.h implements it inline through ctx->ops, which the loaded
 * library filled in, so ib.c calls those inline functions directly.
 *
 * Types and signatures are the real ones from <infiniband/verbs.h>; this file
 * is compiled only when the headers were found (WEFT_HAVE_VERBS_HEADERS).
 */
#ifndef WEFT_IBVWRAP_H
#define WEFT_IBVWRAP_H

#ifdef WEFT_HAVE_VERBS_HEADERS
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct weft_ibv {
    void *handle;                 /* dlopen handle */
    char  path[256];              /* what was loaded */

    struct ibv_device **(*get_device_list)(int *num_devices);
    void                (*free_device_list)(struct ibv_device **list);
    const char         *(*get_device_name)(struct ibv_device *device);
    struct ibv_context *(*open_device)(struct ibv_device *device);
    int                 (*close_device)(struct ibv_context *context);
    int                 (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int                 (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
    int                 (*query_gid)(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
    /* Optional (NULL when the library lacks it): GID type (RoCE v1/v2) */
    int                 (*query_gid_ex)(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                                        struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
    struct ibv_pd      *(*alloc_pd)(struct ibv_context *context);
    int                 (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr      *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
    /* Optional: dma-buf registration (GPUDirect without the peer-memory module) */
    struct ibv_mr      *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
                                         int fd, int access);
    int                 (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_cq      *(*create_cq)(struct ibv_context *context, int cqe, void *cq_context,
                                     struct ibv_comp_channel *channel, int comp_vector);
    int                 (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp      *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int                 (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int                 (*destroy_qp)(struct ibv_qp *qp);
    const char         *(*wc_status_str)(enum ibv_wc_status status);
};

/* Loads path and resolves the table. On failure returns nonzero, leaves *ibv
 * untouched and writes why (dlerror text or the missing symbol) into why. */
int  weft_ibv_load(const char *path, struct weft_ibv *ibv, char *why, size_t whylen);
void weft_ibv_unload(struct weft_ibv *ibv);

#endif /* WEFT_HAVE_VERBS_HEADERS */
#endif
