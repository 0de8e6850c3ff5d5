/*
 * ib transport: device and port choice (see ib_dev.h).
 */
#ifdef WEFT_HAVE_VERBS_HEADERS

#include "ib_dev.h"
#include "ib_chunk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudawrap.h"
#include "log.h"
#include "topo.h"
#include "weft.h"

#define IB_DEV_MAX_CANDIDATES 64

/* The NIC the topology (WEFT_TOPO_XML, else this machine) matches to this
 * thread's current CUDA device. 0 with nic and desc ("cuda0 (0000:07:00.0)
 * -> mlx5_0: same PCIe switch") filled; -1 with desc saying why not. */
static int gpu_nic(const struct weft_config *cfg, char *nic, size_t niclen, char *desc, size_t desclen)
{
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = weft_cuda_get();
    struct weft_topo *t;
    char bus[32] = "", why[256] = "";
    int dev = -1, g, n;

    if (cu == NULL) {
        snprintf(desc, desclen, "CUDA not loaded");
        return -1;
    }
    if (cu->GetDevice(&dev) != cudaSuccess || dev < 0 ||
        cu->DeviceGetPCIBusId(bus, (int)sizeof(bus), dev) != cudaSuccess) {
        cu->GetLastError();
        snprintf(desc, desclen, "no current CUDA device");
        return -1;
    }
    t = malloc(sizeof(*t));
    if (t == NULL) {
        snprintf(desc, desclen, "no memory for the topology");
        return -1;
    }
    if (weft_topo_load(cfg->topo_xml, t, why, sizeof(why)) != WEFT_SUCCESS) {
        snprintf(desc, desclen, "cuda%d (%s): topology not available: %s", dev, bus, why);
        free(t);
        return -1;
    }
    g = weft_topo_find_gpu(t, bus);
    n = g >= 0 ? t->gpu_nic[g] : -1;
    if (g < 0)
        snprintf(desc, desclen, "cuda%d (%s) is not in the topology%s%s", dev, bus, cfg->topo_xml[0] ? " " : "",
                 cfg->topo_xml);
    else if (n < 0)
        snprintf(desc, desclen, "cuda%d (%s): no RDMA NIC in the topology", dev, t->gpus[g].busid);
    else {
        snprintf(nic, niclen, "%s", t->nics[n].name);
        snprintf(desc, desclen, "cuda%d (%s) -> %s: %s", dev, t->gpus[g].busid, t->nics[n].name,
                 weft_topo_distance_name(t->gpu_nic_distance[g]));
    }
    free(t);
    return n >= 0 ? 0 : -1;
#else
    (void)cfg;
    (void)nic;
    (void)niclen;
    snprintf(desc, desclen, "built without CUDA");
    return -1;
#endif
}

int ib_hca_allows(const char *list, const char *dev, unsigned port)
{
    const char *s = list;
    if (list == NULL || list[0] == '\0')
        return 1;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *colon = memchr(s, ':', n);
        size_t name_len = colon ? (size_t)(colon - s) : n;
        if (name_len == strlen(dev) && strncmp(s, dev, name_len) == 0) {
            if (colon == NULL)
                return 1;
            char num[16] = "";
            size_t nl = n - name_len - 1;
            if (nl < sizeof(num)) {
                memcpy(num, colon + 1, nl);
                char *e;
                unsigned long p = strtoul(num, &e, 10);
                if (e != num && *e == '\0' && p == port)
                    return 1;
            }
        }
        if (end == NULL)
            break;
        s = end + 1;
    }
    return 0;
}

static int gid_is_zero(const union ibv_gid *g)
{
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, 16) == 0;
}

static int gid_is_ipv4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
    return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

/* GID type of (dev, port, index): 2 = RoCE v2, 1 = RoCE v1 / IB, 0 = empty
 * or unknown. From the library when it has _ibv_query_gid_ex, else from
 * sysfs (what older libraries read themselves). */
static int gid_type(const struct weft_ibv *ibv, struct ibv_context *ctx, const char *dev, uint8_t port,
                    int index, union ibv_gid *gid)
{
    if (ibv->query_gid_ex) {
        struct ibv_gid_entry e;
        memset(&e, 0, sizeof(e));
        if (ibv->query_gid_ex(ctx, port, (uint32_t)index, &e, 0, sizeof(e)) != 0)
            return 0;
        *gid = e.gid;
        if (gid_is_zero(gid))
            return 0;
        return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
    }
    if (ibv->query_gid(ctx, port, index, gid) != 0 || gid_is_zero(gid))
        return 0;
    char path[256], type[32] = "";
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/types/%d", dev, port, index);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 1;   /* no sysfs entry: usable, type unknown */
    if (fgets(type, sizeof(type), f) == NULL)
        type[0] = '\0';
    fclose(f);
    return strstr(type, "v2") ? 2 : 1;
}

/* Picks the GID of a RoCE port. 0 on success. */
static int pick_gid(const struct weft_ibv *ibv, struct ibv_context *ctx, const struct weft_config *cfg,
                    const struct ibv_port_attr *pa, struct ib_port_choice *pc, char *why, size_t whylen)
{
    union ibv_gid g;
    int first_v2 = -1, first_any = -1;
    union ibv_gid g_v2, g_any;

    if (cfg->ib_gid_index >= 0) {
        if (cfg->ib_gid_index >= pa->gid_tbl_len ||
            ibv->query_gid(ctx, pc->port, cfg->ib_gid_index, &g) != 0 || gid_is_zero(&g)) {
            snprintf(why, whylen, "%s port %u: WEFT_IB_GID_INDEX=%d is not a valid GID (table of %d)", pc->dev,
                     pc->port, cfg->ib_gid_index, pa->gid_tbl_len);
            return -1;
        }
        pc->gid_index = cfg->ib_gid_index;
        pc->gid = g;
        snprintf(pc->gid_how, sizeof(pc->gid_how), "WEFT_IB_GID_INDEX=%d", cfg->ib_gid_index);
        return 0;
    }
    for (int i = 0; i < pa->gid_tbl_len; i++) {
        int t = gid_type(ibv, ctx, pc->dev, pc->port, i, &g);
        if (t == 0)
            continue;
        if (t == 2 && gid_is_ipv4_mapped(&g)) {
            pc->gid_index = i;
            pc->gid = g;
            snprintf(pc->gid_how, sizeof(pc->gid_how), "first RoCE v2 IPv4-mapped GID");
            return 0;
        }
        if (t == 2 && first_v2 < 0) {
            first_v2 = i;
            g_v2 = g;
        }
        if (first_any < 0) {
            first_any = i;
            g_any = g;
        }
    }
    if (first_v2 >= 0 || first_any >= 0) {
        pc->gid_index = first_v2 >= 0 ? first_v2 : first_any;
        pc->gid = first_v2 >= 0 ? g_v2 : g_any;
        snprintf(pc->gid_how, sizeof(pc->gid_how), "%s (no RoCE v2 IPv4-mapped GID)",
                 first_v2 >= 0 ? "first RoCE v2 GID" : "first valid GID");
        return 0;
    }
    snprintf(why, whylen, "%s port %u: RoCE port with no valid GID", pc->dev, pc->port);
    return -1;
}

struct candidate {
    int     dev;     /* index into the device list */
    uint8_t port;
};

int ib_dev_open(const struct weft_ibv *ibv, const struct weft_config *cfg, int rank, struct ibv_context **ctx_out,
                struct ibv_device_attr *dattr_out, struct ib_port_choice *out, char *why, size_t whylen)
{
    struct ibv_device **list;
    struct ibv_context **ctxs = NULL;
    struct candidate cand[IB_DEV_MAX_CANDIDATES];
    char seen[256] = "";     /* ACTIVE ports found, for the message when WEFT_IB_HCA matches none */
    int ndev = 0, ncand = 0, rc = WEFT_ERR_UNSUPPORTED;

    list = ibv->get_device_list(&ndev);
    if (list == NULL || ndev <= 0) {
        snprintf(why, whylen, "no RDMA device (%s lists none%s%s)", ibv->path, list ? "" : ": ",
                 list ? "" : strerror(errno));
        if (list)
            ibv->free_device_list(list);
        return WEFT_ERR_UNSUPPORTED;
    }
    ctxs = calloc((size_t)ndev, sizeof(*ctxs));
    if (ctxs == NULL) {
        snprintf(why, whylen, "no memory");
        ibv->free_device_list(list);
        return WEFT_ERR_NO_MEMORY;
    }

    for (int d = 0; d < ndev; d++) {
        struct ibv_device_attr da;
        const char *name = ibv->get_device_name(list[d]);
        if (name == NULL)
            continue;
        ctxs[d] = ibv->open_device(list[d]);
        if (ctxs[d] == NULL)
            continue;
        memset(&da, 0, sizeof(da));
        if (ibv->query_device(ctxs[d], &da) != 0)
            continue;
        for (unsigned p = 1; p <= da.phys_port_cnt && ncand < IB_DEV_MAX_CANDIDATES; p++) {
            struct ibv_port_attr pa;
            memset(&pa, 0, sizeof(pa));
            if (ibv->query_port(ctxs[d], (uint8_t)p, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
                continue;
            size_t sl = strlen(seen);
            if (sl + 40 < sizeof(seen))
                snprintf(seen + sl, sizeof(seen) - sl, "%s%s:%u", sl ? "," : "", name, p);
            if (!ib_hca_allows(cfg->ib_hca, name, p))
                continue;
            cand[ncand].dev = d;
            cand[ncand].port = (uint8_t)p;
            ncand++;
        }
    }

    if (ncand == 0) {
        if (seen[0] == '\0')
            snprintf(why, whylen, "no ACTIVE port on %d RDMA device(s)", ndev);
        else
            snprintf(why, whylen, "WEFT_IB_HCA=%s matches no ACTIVE port (found %s)", cfg->ib_hca, seen);
        goto out;
    }

    {
        /* A rank with a current CUDA device takes the NIC nearest its GPU
         * when that NIC has an allowed ACTIVE port; otherwise (and with one
         * candidate only: nothing to choose) ranks spread over the ports. */
        const struct candidate *k = &cand[rank % ncand];
        if (ncand > 1 && weft_cuda_available()) {
            char nic[32] = "", desc[400] = "";
            int idx[IB_DEV_MAX_CANDIDATES], nm = 0;
            if (gpu_nic(cfg, nic, sizeof(nic), desc, sizeof(desc)) == 0) {
                for (int i = 0; i < ncand; i++)
                    if (strcmp(ibv->get_device_name(list[cand[i].dev]), nic) == 0)
                        idx[nm++] = i;
                if (nm > 0) {
                    k = &cand[idx[rank % nm]];
                    WEFT_INFO(rank, "ib: GPU-NIC affinity: %s", desc);
                } else {
                    WEFT_INFO(rank, "ib: GPU-NIC affinity: %s, which has no allowed ACTIVE port: spreading ranks "
                              "over the ports", desc);
                }
            } else {
                WEFT_INFO(rank, "ib: GPU-NIC affinity: none (%s): spreading ranks over the ports", desc);
            }
        }
        struct ibv_context *ctx = ctxs[k->dev];
        struct ibv_device_attr da;
        struct ibv_port_attr pa;
        struct ib_port_choice pc;

        memset(&pc, 0, sizeof(pc));
        memset(&da, 0, sizeof(da));
        memset(&pa, 0, sizeof(pa));
        snprintf(pc.dev, sizeof(pc.dev), "%s", ibv->get_device_name(list[k->dev]));
        pc.port = k->port;
        pc.gid_index = -1;
        if (ibv->query_device(ctx, &da) != 0 || ibv->query_port(ctx, k->port, &pa) != 0) {
            snprintf(why, whylen, "%s port %u: query failed", pc.dev, pc.port);
            goto out;
        }
        pc.link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                                 : IBV_LINK_LAYER_INFINIBAND;
        pc.active_mtu = (uint8_t)pa.active_mtu;
        pc.max_msg_sz = pa.max_msg_sz;
        pc.lid = pa.lid;
        if (pc.max_msg_sz < 2 * IB_CHUNK_MIN) {
            snprintf(why, whylen, "%s port %u: max_msg_sz %llu is below %u bytes", pc.dev, pc.port,
                     (unsigned long long)pc.max_msg_sz, 2 * IB_CHUNK_MIN);
            goto out;
        }
        if (pc.link_layer == IBV_LINK_LAYER_ETHERNET) {
            if (pick_gid(ibv, ctx, cfg, &pa, &pc, why, whylen) != 0)
                goto out;
        } else if (pc.lid == 0) {
            snprintf(why, whylen, "%s port %u: InfiniBand port without a LID (no subnet manager?)", pc.dev,
                     pc.port);
            goto out;
        }
        *ctx_out = ctx;
        *dattr_out = da;
        *out = pc;
        ctxs[k->dev] = NULL;   /* kept open for the caller */
        rc = WEFT_SUCCESS;
    }
out:
    for (int d = 0; d < ndev; d++)
        if (ctxs[d])
            ibv->close_device(ctxs[d]);
    free(ctxs);
    ibv->free_device_list(list);
    return rc;
}

#else
typedef int weft_ib_dev_unused;
#endif /* WEFT_HAVE_VERBS_HEADERS */
