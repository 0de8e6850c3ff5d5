/*
 * Machine topology (hwloc): which NIC serves which GPU.
 *
 * A GPU should use the NIC nearest to it in the PCIe tree: the one with the
 * nearest common ancestor -- under the same PCIe switch first, then the same
 * host bridge, then the same NUMA node / package, then anything. Among
 * equally near NICs, GPUs are spread so no NIC serves two GPUs while another
 * equally near NIC serves none; a GPU whose switch holds no NIC takes the
 * least-loaded of its nearest others. The result depends only on the
 * topology (GPUs and NICs are ordered by PCI bus id). docs/design.md,
 * "GPU-NIC affinity", has the rule with a picture; src/core/topo.c the algorithm.
 *
 * The topology comes from the running machine, or from an hwloc XML file
 * (unit tests: the files of tests/topo/; users: WEFT_TOPO_XML) -- hwloc keeps
 * PCI and OS devices (I/O filter KEEP_ALL).
 */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include <stddef.h>

#define WEFT_TOPO_MAX_GPUS 64
#define WEFT_TOPO_MAX_NICS 64

struct weft_topo_gpu {
    char     name[32];      /* hwloc OS device name: "cuda*" first, else "nvidia*",
                               else "nvml*"; "" when it has none of those */
    char     busid[16];     /* PCI bus id "0000:07:00.0" (lowercase hex) */
};

struct weft_topo_nic {
    char     name[32];      /* verbs device name ("mlx5_0") */
    char     busid[16];     /* of the PCI device above it; OpenFabrics devices
                               with none (rxe, siw) are not listed */
};

struct weft_topo {
    int                  ngpus, nnics;
    struct weft_topo_gpu gpus[WEFT_TOPO_MAX_GPUS];   /* ordered by PCI bus id */
    struct weft_topo_nic nics[WEFT_TOPO_MAX_NICS];   /* ordered by PCI bus id */
    int                  gpu_nic[WEFT_TOPO_MAX_GPUS];   /* index into nics, -1 = none */
    int                  gpu_nic_distance[WEFT_TOPO_MAX_GPUS]; /* WEFT_TOPO_* below; 0 = none */
};

/* How near a GPU's NIC is. */
enum {
    WEFT_TOPO_SAME_SWITCH = 1,   /* common ancestor is a PCIe bridge below the host bridge */
    WEFT_TOPO_SAME_HOSTBRIDGE,   /* common ancestor is the host bridge (root complex) */
    WEFT_TOPO_SAME_NUMA,         /* same NUMA node / package */
    WEFT_TOPO_SYSTEM             /* across the inter-socket link */
};

/* Loads the topology (xml_path NULL or "": this machine), lists GPUs
 * (NVIDIA PCI VGA/3D controllers: vendor 0x10de, class 0x0300 or 0x0302)
 * and RDMA NICs (OpenFabrics OS devices), and matches them. A machine
 * without GPUs or NICs is a success (ngpus/nnics 0, gpu_nic -1). On failure
 * returns WEFT_ERR_* with why filled (WEFT_ERR_INVALID_ARG: out NULL, or the
 * XML file missing or not an hwloc topology; WEFT_ERR_UNSUPPORTED: hwloc
 * cannot read this machine, or more than WEFT_TOPO_MAX_* GPUs/NICs;
 * WEFT_ERR_NO_MEMORY); *out set only on success. */
int  weft_topo_load(const char *xml_path, struct weft_topo *out, char *why, size_t whylen);

/* Index of the GPU with this PCI bus id (any case, with or without domain,
 * "0000:07:00.0", "00000000:07:00.0" as CUDA writes it, "07:00.0"), -1 if
 * none or malformed. */
int  weft_topo_find_gpu(const struct weft_topo *t, const char *busid);

/* "same PCIe switch", "same host bridge", "same NUMA node", "across
 * sockets" for a WEFT_TOPO_* distance; "no path" otherwise. */
const char *weft_topo_distance_name(int d);

/* Human-readable lines, each ending in '\n', for WEFT_DEBUG=info:
 * "cuda0 -> mlx5_0 (same PCIe switch)" (host bridge / NUMA node / across
 * sockets); "cuda0 -> no RDMA NIC"; a GPU without OS device name is shown
 * by bus id; no GPUs: "no GPUs (2 RDMA NICs)". Truncated to fit len,
 * always NUL-terminated (len > 0). */
void weft_topo_describe(const struct weft_topo *t, char *buf, size_t len);

#endif
