/*
 * CUDA at comm create/destroy: loads CUDA once per process (WEFT_CUDA_LIB),
 * describes this rank's devices in its rank card, and brings up the device
 * paths (staging pool, CUDA IPC) once the cards are exchanged.
 */
#ifndef WEFT_CUDA_COMM_H
#define WEFT_CUDA_COMM_H

struct weft_comm;
struct weft_rank_card;

/* Before the card exchange: load CUDA (failure is not an error: host only,
 * one WEFT_DEBUG=info line says why), set c->cuda, fill mine->gpu_*. */
int  weft_cuda_comm_card(struct weft_comm *c, struct weft_rank_card *mine);
/* After the exchange and transport connect, on every rank (collective:
 * fixed number of MPI calls whatever happens). */
int  weft_cuda_comm_connect(struct weft_comm *c);
/* Destroy (after the final barrier) and failed create: idempotent. */
void weft_cuda_comm_fini(struct weft_comm *c);

#endif
