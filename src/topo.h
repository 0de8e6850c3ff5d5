/*
 * Machine topology (hwloc): which NIC serves which GPU.
 *
 * A GPU should use the NIC nearest to it in the PCIe tree: under the same
 * PCIe switch first, then the same host bridge / NUMA node, then anything.
 * Among equally near NICs, GPUs are spread so no NIC serves two GPUs while
 * another NIC serves none.
 *
 * The topology comes from the running machine, or from an hwloc XML file
 * (unit tests: tests/topo/*.xml; users: WEFT_TOPO_XML) -- hwloc keeps
 * PCI and OS devices (I/O filter KEEP_ALL).
 */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include <stddef.h>

#define WEFT_TOPO_MAX_GPUS 64
#define WEFT_TOPO_MAX_NICS 64

struct weft_topo_gpu {
    char     name[32];      /* hwloc OS device name ("cuda0", "nvidia0") or "" */
    char     busid[16];     /* PCI bus id "0000:07:00.0" (lowercase hex) */
};

struct weft_topo_nic {
    char     name[32];      /* verbs device name ("mlx5_0") */
    char     busid[16];
};

struct weft_topo {
    int                  ngpus, nnics;
    struct weft_topo_gpu gpus[WEFT_TOPO_MAX_GPUS];   /* ordered by PCI bus id */
    struct weft_topo_nic nics[WEFT_TOPO_MAX_NICS];   /* ordered by PCI bus id */
    int                  gpu_nic[WEFT_TOPO_MAX_GPUS];   /* index into nics, -1 = none */
    int                  gpu_nic_distance[WEFT_TOPO_MAX_GPUS]; /* WEFT_TOPO_* below */
};

/* How near a GPU's NIC is. */
enum {
    WEFT_TOPO_SAME_SWITCH = 1,   /* common ancestor is a PCIe bridge below the host bridge */
    WEFT_TOPO_SAME_HOSTBRIDGE,   /* common ancestor is the host bridge (root complex) */
    WEFT_TOPO_SAME_NUMA,         /* same NUMA node / package */
    WEFT_TOPO_SYSTEM             /* across the inter-socket link */
};

/* Loads the topology (xml_path NULL or "": this machine), lists GPUs
 * (NVIDIA PCI display/3D controllers, vendor 0x10de class 0x03xx) and
 * RDMA NICs (OpenFabrics OS devices), and matches them. On failure returns
 * WEFT_ERR_* with why filled; *out set only on success. */
int  weft_topo_load(const char *xml_path, struct weft_topo *out, char *why, size_t whylen);

/* Index of the GPU with this PCI bus id (any case, with or without domain), -1 if none. */
int  weft_topo_find_gpu(const struct weft_topo *t, const char *busid);

/* Human-readable "cuda0 -> mlx5_0 (same PCIe switch)" lines, for WEFT_DEBUG=info. */
void weft_topo_describe(const struct weft_topo *t, char *buf, size_t len);

#endif
