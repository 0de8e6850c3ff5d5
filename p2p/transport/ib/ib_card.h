/*
 * Which pairs of ranks the ib transport connects, decided from the rank
 * cards alone. comm.c (choose_transports) and ib.c (connect) both use it:
 * every rank holds every card, so every rank computes the same answer for
 * every pair, and connect can tell -- without any MPI call -- whether some
 * pair of the comm uses ib at all and the per-pair exchange is needed.
 * No verbs types here: comm.c includes it in builds without the headers.
 */
#ifndef WEFT_IB_CARD_H
#define WEFT_IB_CARD_H

#include "comm.h"
#include "transport.h"

/* The card offers ib: the rank allows it and found an ACTIVE port. */
static inline int weft_ib_card_offers(const struct weft_rank_card *k)
{
    return (k->transports_mask & (1u << WEFT_TP_IB)) && k->ib_dev[0] != '\0';
}

/* Why the pair (a, b) cannot use ib; NULL when it can. */
static inline const char *weft_ib_pair_why_not(const struct weft_rank_card *a, const struct weft_rank_card *b)
{
    if (!(a->transports_mask & (1u << WEFT_TP_IB)) || !(b->transports_mask & (1u << WEFT_TP_IB)))
        return "ib not in WEFT_TRANSPORTS (or not needed on one node)";
    if (a->ib_dev[0] == '\0')
        return "no usable RDMA port here";
    if (b->ib_dev[0] == '\0')
        return "no usable RDMA port on the peer";
    if (a->ib_link_layer != b->ib_link_layer)
        return "InfiniBand and RoCE ports cannot talk";
    return NULL;
}

/* Whether the pair (a, b) uses ib: both offer it on the same link layer and
 * shm does not serve them (shm wins on one node whenever both allow it). */
static inline int weft_ib_pair_chosen(const struct weft_rank_card *a, const struct weft_rank_card *b)
{
    unsigned both = a->transports_mask & b->transports_mask;
    if (a->node == b->node && (both & (1u << WEFT_TP_SHM)))
        return 0;
    return weft_ib_pair_why_not(a, b) == NULL;
}

#endif
