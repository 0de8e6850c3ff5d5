/*
 * Cross-memory attach (process_vm_readv / process_vm_writev): copying
 * between this process and another on the node with one copy. Shared by
 * the shm transport's rendezvous (p2p/transport/shm/shm_cma.c) and the
 * node-local collectives' pulls (collectives/node_coll.c), which each
 * decide when a peer may be read; here only the copy and the words for a
 * refusal.
 */
#ifndef WEFT_CMA_H
#define WEFT_CMA_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Copies len bytes between local memory and pid's at remote (write 0:
 * remote -> local; 1: local -> remote), in calls of at most 1 GiB, going
 * on after a partial copy or EINTR. Returns 0 or the errno that stopped it
 * (EFAULT when a call copied nothing). */
int weft_cma_copy(pid_t pid, int write, void *local, uint64_t remote, size_t len);

/* The words for a CMA refusal: errno err of process_vm_readv (0: it read
 * back a wrong value), with Yama's ptrace scope when that is the likely
 * cause. */
void weft_cma_refusal(int err, char *why, size_t whylen);

#endif
