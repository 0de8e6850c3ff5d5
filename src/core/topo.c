/*
 * GPU-NIC affinity from the hwloc topology (see topo.h, docs/design.md).
 *
 * 1. Load the topology (this machine, or an hwloc XML file) with every PCI
 *    bridge, PCI device and OS device kept.
 * 2. GPUs: NVIDIA PCI devices of class 0x0300/0x0302. NICs: OpenFabrics OS
 *    devices with a PCI device above them. Both sorted by PCI bus id.
 * 3. Nearness of a GPU and a NIC: their nearest common ancestor, counted as
 *    steps up from the GPU (all candidates of one GPU lie on its own chain of
 *    ancestors, so fewer steps is strictly nearer). A GPU's candidates are
 *    the NICs with its nearest common ancestor; the kind of that ancestor
 *    (PCIe switch, host bridge, package/NUMA node, machine) is the distance.
 * 4. Assignment: the GPUs with the nearest candidates first (then the fewest
 *    candidates, then bus id) each take the least-loaded candidate (ties: the
 *    lowest bus id). Candidate sets are subtrees, so a GPU taken later has a
 *    superset of an earlier one's set or a disjoint one, and least-loaded
 *    picks already spread them. A final pass guarantees the rule whatever
 *    the order: while a GPU could move to an equally near NIC that serves at
 *    least two GPUs fewer than its own, it moves (each move lowers the sum of
 *    squared loads, so this ends). Hence no NIC serves two GPUs while one of
 *    the same GPU's equally near candidates serves none.
 */
#include "topo.h"

#include <errno.h>
#include <hwloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft.h"

struct pci_id {
    unsigned domain, bus, dev, func;
};

struct found {
    hwloc_obj_t   pci;        /* the PCI device (a NIC's: the one above its OS device) */
    struct pci_id id;
    const char   *name;       /* OS device name, or "" */
};

static int topo_fail(char *why, size_t whylen, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int topo_fail(char *why, size_t whylen, int err, const char *fmt, ...)
{
    if (why != NULL && whylen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return err;
}

static struct pci_id pci_id_of(hwloc_obj_t pci)
{
    struct pci_id id = { (unsigned)pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                         pci->attr->pcidev.dev, pci->attr->pcidev.func };
    return id;
}

static int pci_id_cmp(const struct pci_id *a, const struct pci_id *b)
{
    if (a->domain != b->domain) return a->domain < b->domain ? -1 : 1;
    if (a->bus != b->bus)       return a->bus < b->bus ? -1 : 1;
    if (a->dev != b->dev)       return a->dev < b->dev ? -1 : 1;
    if (a->func != b->func)     return a->func < b->func ? -1 : 1;
    return 0;
}

static int found_cmp(const void *pa, const void *pb)
{
    const struct found *a = pa, *b = pb;
    int c = pci_id_cmp(&a->id, &b->id);
    return c != 0 ? c : strcmp(a->name, b->name);
}

static void format_busid(const struct pci_id *id, char *buf, size_t len)
{
    snprintf(buf, len, "%04x:%02x:%02x.%x", id->domain, id->bus, id->dev, id->func);
}

/* The name a GPU is known by: its CUDA OS device ("cuda0") first, then an
 * "nvidia*" one, then NVML's ("nvml0"); DRM cards, OpenCL devices and the
 * like are not names CUDA users recognise, so "" rather than those. */
static const char *gpu_name(hwloc_obj_t pci)
{
    static const char *const prefixes[] = { "cuda", "nvidia", "nvml" };
    for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
        size_t n = strlen(prefixes[p]);
        for (hwloc_obj_t c = pci->io_first_child; c != NULL; c = c->next_sibling)
            if (c->type == HWLOC_OBJ_OS_DEVICE && c->name != NULL && strncmp(c->name, prefixes[p], n) == 0)
                return c->name;
    }
    return "";
}

static int is_nvidia_gpu(hwloc_obj_t pci)
{
    unsigned cls = pci->attr->pcidev.class_id;
    return pci->attr->pcidev.vendor_id == 0x10de && (cls == 0x0300 || cls == 0x0302);
}

/* Steps from a up to its nearest common ancestor with b (0: a is an
 * ancestor of b, or b itself); *anc gets that ancestor. */
static int common_ancestor(hwloc_obj_t a, hwloc_obj_t b, hwloc_obj_t *anc)
{
    int steps = 0;
    for (hwloc_obj_t p = a; p != NULL; p = p->parent, steps++) {
        for (hwloc_obj_t q = b; q != NULL; q = q->parent) {
            if (q == p) {
                *anc = p;
                return steps;
            }
        }
    }
    *anc = NULL;    /* not reached: both descend from the root */
    return steps;
}

/* WEFT_TOPO_* of a nearest common ancestor. */
static int distance_of(hwloc_topology_t topo, hwloc_obj_t anc)
{
    if (anc == NULL)
        return WEFT_TOPO_SYSTEM;
    if (anc->type == HWLOC_OBJ_BRIDGE)
        return anc->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST ? WEFT_TOPO_SAME_HOSTBRIDGE
                                                                         : WEFT_TOPO_SAME_SWITCH;
    if (anc->type == HWLOC_OBJ_PCI_DEVICE)      /* functions of one device: same link */
        return WEFT_TOPO_SAME_SWITCH;
    while (anc != NULL && (hwloc_obj_type_is_io(anc->type) || anc->type == HWLOC_OBJ_MISC))
        anc = anc->parent;
    if (anc == NULL)
        return WEFT_TOPO_SYSTEM;
    /* A CPU-side object: same NUMA/package when it is a package or inside
     * one, spans at most one NUMA node, or covers the CPUs of one package. */
    if (anc->type == HWLOC_OBJ_PACKAGE || hwloc_get_ancestor_obj_by_type(topo, HWLOC_OBJ_PACKAGE, anc) != NULL)
        return WEFT_TOPO_SAME_NUMA;
    if (anc->nodeset != NULL) {
        int w = hwloc_bitmap_weight(anc->nodeset);
        if (w == 0 || w == 1)
            return WEFT_TOPO_SAME_NUMA;
    }
    if (anc->cpuset != NULL && hwloc_get_nbobjs_inside_cpuset_by_type(topo, anc->cpuset, HWLOC_OBJ_PACKAGE) == 1)
        return WEFT_TOPO_SAME_NUMA;
    return WEFT_TOPO_SYSTEM;
}

/* Fills t->gpu_nic / gpu_nic_distance from the found GPUs and NICs. */
static void match(hwloc_topology_t topo, const struct found *gpus, const struct found *nics,
                  struct weft_topo *t)
{
    int ng = t->ngpus, nn = t->nnics;
    int steps[WEFT_TOPO_MAX_GPUS][WEFT_TOPO_MAX_NICS];
    int best[WEFT_TOPO_MAX_GPUS], dist[WEFT_TOPO_MAX_GPUS], ncand[WEFT_TOPO_MAX_GPUS];
    int order[WEFT_TOPO_MAX_GPUS], load[WEFT_TOPO_MAX_NICS];

    for (int g = 0; g < ng; g++) {
        t->gpu_nic[g] = -1;
        t->gpu_nic_distance[g] = 0;
        best[g] = -1;
        dist[g] = 0;
        ncand[g] = 0;
        hwloc_obj_t best_anc = NULL;
        for (int n = 0; n < nn; n++) {
            hwloc_obj_t anc;
            steps[g][n] = common_ancestor(gpus[g].pci, nics[n].pci, &anc);
            if (best[g] < 0 || steps[g][n] < best[g]) {
                best[g] = steps[g][n];
                best_anc = anc;
            }
        }
        if (nn > 0) {
            dist[g] = distance_of(topo, best_anc);
            for (int n = 0; n < nn; n++)
                ncand[g] += steps[g][n] == best[g];
        }
        order[g] = g;
    }
    if (nn == 0)
        return;
    for (int n = 0; n < nn; n++)
        load[n] = 0;

    /* GPUs in order of (distance, number of candidates, bus id); an
     * insertion sort, as there are at most 64 and qsort has no context. */
    for (int i = 1; i < ng; i++) {
        int v = order[i], j = i;
        while (j > 0) {
            int u = order[j - 1];
            int before = dist[v] != dist[u] ? dist[v] < dist[u]
                       : ncand[v] != ncand[u] ? ncand[v] < ncand[u] : v < u;
            if (!before)
                break;
            order[j] = u;
            j--;
        }
        order[j] = v;
    }

    for (int i = 0; i < ng; i++) {
        int g = order[i], pick = -1;
        for (int n = 0; n < nn; n++)
            if (steps[g][n] == best[g] && (pick < 0 || load[n] < load[pick]))
                pick = n;
        t->gpu_nic[g] = pick;
        t->gpu_nic_distance[g] = dist[g];
        load[pick]++;
    }

    for (int moved = 1; moved;) {
        moved = 0;
        for (int g = 0; g < ng; g++) {
            int cur = t->gpu_nic[g], pick = -1;
            for (int n = 0; n < nn; n++)
                if (steps[g][n] == best[g] && load[n] + 2 <= load[cur] && (pick < 0 || load[n] < load[pick]))
                    pick = n;
            if (pick >= 0) {
                load[cur]--;
                load[pick]++;
                t->gpu_nic[g] = pick;
                moved = 1;
            }
        }
    }
}

int weft_topo_load(const char *xml_path, struct weft_topo *out, char *why, size_t whylen)
{
    if (why != NULL && whylen > 0)
        why[0] = '\0';
    if (out == NULL)
        return topo_fail(why, whylen, WEFT_ERR_INVALID_ARG, "weft_topo_load: out is NULL");

    int use_xml = xml_path != NULL && xml_path[0] != '\0';
    if (use_xml) {
        /* hwloc's own message for a missing file is only "Invalid argument"
         * (or libxml2 noise on stderr): check the file first. */
        FILE *f = fopen(xml_path, "r");
        if (f == NULL)
            return topo_fail(why, whylen, WEFT_ERR_INVALID_ARG, "cannot open hwloc XML topology %s: %s",
                             xml_path, strerror(errno));
        fclose(f);
    }

    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return topo_fail(why, whylen, WEFT_ERR_NO_MEMORY, "hwloc_topology_init failed: %s", strerror(errno));

    int rc = WEFT_SUCCESS;
    struct weft_topo *t = NULL;
    struct found *gpus = NULL, *nics = NULL;

    if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL) != 0) {
        rc = topo_fail(why, whylen, WEFT_ERR_INTERNAL, "hwloc: cannot keep I/O objects: %s", strerror(errno));
        goto done;
    }
    /* This machine: not the OpenCL plugin (it would start the GPU driver's
     * OpenCL platform in every rank) nor the GL one (it probes X displays);
     * neither names GPUs the way CUDA does. */
    if (!use_xml) {
        hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
        hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
    }
    if (use_xml && hwloc_topology_set_xml(topo, xml_path) != 0) {
        rc = topo_fail(why, whylen, WEFT_ERR_INVALID_ARG, "%s is not a readable hwloc XML topology (%s)",
                       xml_path, strerror(errno));
        goto done;
    }
    if (hwloc_topology_load(topo) != 0) {
        if (use_xml)
            rc = topo_fail(why, whylen, WEFT_ERR_INVALID_ARG, "hwloc could not load the XML topology %s: %s",
                           xml_path, strerror(errno));
        else
            rc = topo_fail(why, whylen, WEFT_ERR_UNSUPPORTED, "hwloc could not discover this machine's topology: %s",
                           strerror(errno));
        goto done;
    }

    t = calloc(1, sizeof(*t));
    gpus = calloc(WEFT_TOPO_MAX_GPUS, sizeof(*gpus));
    nics = calloc(WEFT_TOPO_MAX_NICS, sizeof(*nics));
    if (t == NULL || gpus == NULL || nics == NULL) {
        rc = topo_fail(why, whylen, WEFT_ERR_NO_MEMORY, "weft_topo_load: out of memory");
        goto done;
    }

    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o != NULL; o = hwloc_get_next_pcidev(topo, o)) {
        if (!is_nvidia_gpu(o))
            continue;
        if (t->ngpus == WEFT_TOPO_MAX_GPUS) {
            rc = topo_fail(why, whylen, WEFT_ERR_UNSUPPORTED, "more than %d NVIDIA GPUs in the topology",
                           WEFT_TOPO_MAX_GPUS);
            goto done;
        }
        gpus[t->ngpus].pci = o;
        gpus[t->ngpus].id = pci_id_of(o);
        gpus[t->ngpus].name = gpu_name(o);
        t->ngpus++;
    }
    for (hwloc_obj_t o = hwloc_get_next_osdev(topo, NULL); o != NULL; o = hwloc_get_next_osdev(topo, o)) {
        if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || o->name == NULL)
            continue;
        hwloc_obj_t pci = o->parent;
        while (pci != NULL && pci->type != HWLOC_OBJ_PCI_DEVICE)
            pci = pci->parent;
        if (pci == NULL)
            continue;   /* software RDMA (rxe, siw): no place in the PCIe tree */
        if (t->nnics == WEFT_TOPO_MAX_NICS) {
            rc = topo_fail(why, whylen, WEFT_ERR_UNSUPPORTED, "more than %d RDMA NICs in the topology",
                           WEFT_TOPO_MAX_NICS);
            goto done;
        }
        nics[t->nnics].pci = pci;
        nics[t->nnics].id = pci_id_of(pci);
        nics[t->nnics].name = o->name;
        t->nnics++;
    }
    qsort(gpus, (size_t)t->ngpus, sizeof(*gpus), found_cmp);
    qsort(nics, (size_t)t->nnics, sizeof(*nics), found_cmp);

    for (int g = 0; g < t->ngpus; g++) {
        snprintf(t->gpus[g].name, sizeof(t->gpus[g].name), "%s", gpus[g].name);
        format_busid(&gpus[g].id, t->gpus[g].busid, sizeof(t->gpus[g].busid));
    }
    for (int n = 0; n < t->nnics; n++) {
        snprintf(t->nics[n].name, sizeof(t->nics[n].name), "%s", nics[n].name);
        format_busid(&nics[n].id, t->nics[n].busid, sizeof(t->nics[n].busid));
    }
    match(topo, gpus, nics, t);
    *out = *t;

done:
    free(t);
    free(gpus);
    free(nics);
    hwloc_topology_destroy(topo);
    return rc;
}

/* One hex field of at most 8 digits, value <= max. */
static int hex_field(const char **p, unsigned max, unsigned *v)
{
    unsigned long val = 0;
    int digits = 0;
    for (;; (*p)++) {
        char c = **p;
        int d;
        if (c >= '0' && c <= '9')      d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else break;
        if (++digits > 8)
            return -1;
        val = val * 16 + (unsigned long)d;
    }
    if (digits == 0 || val > max)
        return -1;
    *v = (unsigned)val;
    return 0;
}

/* "dddd:bb:dd.f" (any number of domain digits up to 8, as CUDA's
 * "00000000:07:00.0") or "bb:dd.f"; hex in any case. */
static int parse_busid(const char *s, struct pci_id *id)
{
    unsigned f1, f2;
    const char *p = s;
    if (s == NULL || hex_field(&p, 0xffffffffu, &f1) != 0 || *p++ != ':')
        return -1;
    if (hex_field(&p, 0xffffffffu, &f2) != 0)
        return -1;
    if (*p == ':') {            /* domain:bus:dev.func */
        p++;
        if (f2 > 0xff || hex_field(&p, 0x1f, &id->dev) != 0)
            return -1;
        id->domain = f1;
        id->bus = f2;
    } else {                    /* bus:dev.func */
        if (f1 > 0xff || f2 > 0x1f)
            return -1;
        id->domain = 0;
        id->bus = f1;
        id->dev = f2;
    }
    if (*p++ != '.' || hex_field(&p, 7, &id->func) != 0 || *p != '\0')
        return -1;
    return 0;
}

int weft_topo_find_gpu(const struct weft_topo *t, const char *busid)
{
    struct pci_id want, have;
    if (t == NULL || parse_busid(busid, &want) != 0)
        return -1;
    for (int g = 0; g < t->ngpus && g < WEFT_TOPO_MAX_GPUS; g++)
        if (parse_busid(t->gpus[g].busid, &have) == 0 && pci_id_cmp(&want, &have) == 0)
            return g;
    return -1;
}

const char *weft_topo_distance_name(int d)
{
    switch (d) {
    case WEFT_TOPO_SAME_SWITCH:     return "same PCIe switch";
    case WEFT_TOPO_SAME_HOSTBRIDGE: return "same host bridge";
    case WEFT_TOPO_SAME_NUMA:       return "same NUMA node";
    case WEFT_TOPO_SYSTEM:          return "across sockets";
    default:                        return "no path";
    }
}

/* Appends to buf[len] at *pos; once full, stays full (truncated, NUL-terminated). */
static void append(char *buf, size_t len, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *buf, size_t len, size_t *pos, const char *fmt, ...)
{
    if (*pos >= len - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *pos, len - *pos, fmt, ap);
    va_end(ap);
    if (n < 0)
        buf[*pos] = '\0';
    else
        *pos = (size_t)n < len - *pos ? *pos + (size_t)n : len - 1;
}

void weft_topo_describe(const struct weft_topo *t, char *buf, size_t len)
{
    size_t pos = 0;
    if (buf == NULL || len == 0)
        return;
    buf[0] = '\0';
    if (t == NULL)
        return;
    if (t->ngpus == 0) {
        append(buf, len, &pos, "no GPUs (%d RDMA NIC%s)\n", t->nnics, t->nnics == 1 ? "" : "s");
        return;
    }
    for (int g = 0; g < t->ngpus && g < WEFT_TOPO_MAX_GPUS; g++) {
        const char *gname = t->gpus[g].name[0] != '\0' ? t->gpus[g].name : t->gpus[g].busid;
        int n = t->gpu_nic[g];
        if (n < 0 || n >= t->nnics || n >= WEFT_TOPO_MAX_NICS) {
            append(buf, len, &pos, "%s -> no RDMA NIC\n", gname);
            continue;
        }
        const char *nname = t->nics[n].name[0] != '\0' ? t->nics[n].name : t->nics[n].busid;
        append(buf, len, &pos, "%s -> %s (%s)\n", gname, nname, weft_topo_distance_name(t->gpu_nic_distance[g]));
    }
}
