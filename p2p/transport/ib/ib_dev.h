/*
 * ib transport: finding the RDMA port this rank uses (ib_dev.c).
 *
 * Every ACTIVE port of every device the verbs library lists is a candidate,
 * restricted by WEFT_IB_HCA ("dev[:port],..."); ranks are spread over the
 * candidates by rank so that several NICs of a node share the load. An
 * InfiniBand port is addressed by its LID, a RoCE port by a GID: the one
 * WEFT_IB_GID_INDEX names, else the first RoCE v2 GID holding an IPv4-mapped
 * address (what routes across IP subnets and what RoCE switches expect).
 */
#ifndef WEFT_IB_DEV_H
#define WEFT_IB_DEV_H

#ifdef WEFT_HAVE_VERBS_HEADERS
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "ibvwrap.h"

struct ib_port_choice {
    char            dev[32];
    uint8_t         port;
    uint8_t         link_layer;   /* IBV_LINK_LAYER_INFINIBAND / _ETHERNET */
    uint8_t         active_mtu;   /* enum ibv_mtu */
    int             gid_index;    /* RoCE: the GID used; IB: -1 */
    union ibv_gid   gid;
    uint16_t        lid;
    uint64_t        max_msg_sz;
    char            gid_how[64];  /* how the GID was picked (for the info line) */
};

/* Opens the device of the port this rank uses. On success: *ctx is open,
 * *dattr and *out describe it, returns WEFT_SUCCESS. When nothing is usable
 * (no device, no ACTIVE port, WEFT_IB_HCA matches nothing, no usable GID)
 * returns WEFT_ERR_UNSUPPORTED and writes why; *ctx is untouched. */
int ib_dev_open(const struct weft_ibv *ibv, const struct weft_config *cfg, int rank, struct ibv_context **ctx,
                struct ibv_device_attr *dattr, struct ib_port_choice *out, char *why, size_t whylen);

/* "dev[:port]" entries of WEFT_IB_HCA: whether (dev, port) is allowed.
 * An empty list allows everything. */
int ib_hca_allows(const char *list, const char *dev, unsigned port);

#endif
#endif
