/*
 * GPUDirect RDMA over the ib transport (p2p/ib_gdr.c): whether a pipe moves
 * CUDA device data by RDMA straight from and to GPU memory. No verbs types:
 * p2p/pipe.c includes it in every build.
 */
#ifndef WEFT_IB_GDR_H
#define WEFT_IB_GDR_H

struct weft_pipe;

/* Nonzero when p is an ib pipe and both ranks' cards say GPUDirect RDMA
 * (each registers device memory with its NIC; WEFT_IB_GDR not 0): its
 * rendezvous device messages take the ordinary ib rendezvous (RDMA WRITE
 * WITH IMM from/to the device buffers) instead of host staging. */
int weft_ib_gdr_usable(const struct weft_pipe *p);

#endif
