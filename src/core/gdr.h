/*
 * GPUDirect RDMA capability: can the NIC read and write GPU memory here?
 *
 * Probed once per process, the first time an ib transport comes up, and
 * cached: the answer depends on the kernel and the verbs library, never on
 * the comm. The CUDA transport code asks weft_gdr_info() which registration
 * path to try for device memory and falls back to staging through pinned
 * host buffers when neither is available.
 */
#ifndef WEFT_GDR_H
#define WEFT_GDR_H

struct weft_gdr_info {
    int  probed;        /* 0 until weft_gdr_probe ran */
    int  peermem;       /* a peer-memory kernel module is loaded (ibv_reg_mr on GPU memory) */
    char peermem_how[96]; /* which one was found (path), "" when none */
    int  dmabuf;        /* the verbs library has ibv_reg_dmabuf_mr */
};

/* Probes once (later calls return the cached result). have_dmabuf_symbol:
 * whether the loaded verbs library resolved ibv_reg_dmabuf_mr. rank is for
 * the one WEFT_DEBUG=info line. Thread-safe. */
const struct weft_gdr_info *weft_gdr_probe(int have_dmabuf_symbol, int rank);

/* The cached result; probed == 0 when no probe ran yet. */
const struct weft_gdr_info *weft_gdr_info(void);

#endif
