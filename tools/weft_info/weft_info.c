/*
 * weft_info: what weft finds on this machine, and why (issue 30, item 3).
 *
 *   weft_info [--json]                      this process, no MPI: version,
 *       build, each transport and rendezvous path ("usable" or why not),
 *       CUDA devices and the NIC each would use, every WEFT_* setting with
 *       its value and origin
 *   mpirun -np N weft_info --pairs [--json] a weft comm over MPI_COMM_WORLD:
 *       each rank describes itself, rank 0 prints, for every pair, the
 *       transport weft's own selection gave its pipe and why
 *
 * Nothing here decides anything of its own: the transports answer through
 * their probe (p2p/transport/transport.h: create's own steps outside a
 * comm), the pairs come from the comm's pipes (weft_p2p_describe_pair), the
 * settings from src/core/config.c. It links libweft.a, so it reaches those
 * internal entries (the library itself exports weft_* only).
 */
#include <errno.h>
#include <hwloc.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "weft.h"
#include "comm.h"
#include "config.h"
#include "core.h"
#include "cudawrap.h"
#include "log.h"
#include "p2p.h"
#include "registry.h"
#include "topo.h"
#include "transport.h"

extern char **environ;

#define MAX_TPS   16
#define MAX_NAMES 128
#define TEXT      512

/* ------------------------------------------------------------ output */

/* JSON string: quotes, backslashes and control characters escaped. */
static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* ------------------------------------------------------------ what this process finds */

struct tp_report {
    char name[16];
    int  carrier;          /* 1 carrier, 0 mover */
    int  usable;
    char what[TEXT];       /* what it would use, or why not */
};

struct path_report {
    const char *name;
    int  usable;
    char what[TEXT];
};

struct gpu_report {
    int  ordinal;
    char busid[32];
    char nic[32];          /* "" when none */
    char how[160];         /* "same PCIe switch", or why there is no NIC */
};

struct machine {
    char   host[64];
    int    pid;
    long   cpus;
    int    ntps;
    struct tp_report tps[MAX_TPS];
    int    npaths;
    struct path_report paths[3];
    int    cuda;           /* loaded, with a device */
    char   cuda_what[TEXT];
    int    ngpus;
    struct gpu_report gpus[WEFT_TOPO_MAX_GPUS];
    char   topo_what[TEXT];
};

static void probe_gpus(struct weft_core *core, struct machine *m)
{
    struct weft_topo *t = calloc(1, sizeof(*t));
    char why[256] = "";
    int topo_ok = 0;

    if (t == NULL) {
        snprintf(m->topo_what, sizeof(m->topo_what), "no memory for the topology");
        return;
    }
    if (weft_topo_load(core->cfg.topo_xml, t, why, sizeof(why)) == WEFT_SUCCESS) {
        topo_ok = 1;
        snprintf(m->topo_what, sizeof(m->topo_what), "%d GPU(s), %d RDMA NIC(s) in %s%s", t->ngpus, t->nnics,
                 core->cfg.topo_xml[0] ? "WEFT_TOPO_XML=" : "this machine's topology (hwloc)", core->cfg.topo_xml);
    } else {
        snprintf(m->topo_what, sizeof(m->topo_what), "not available: %s", why);
    }
#ifdef WEFT_HAVE_CUDA_HEADERS
    const struct weft_cuda *cu = core->cuda ? weft_cuda_get() : NULL;
    for (int d = 0; cu != NULL && d < cu->device_count && d < WEFT_TOPO_MAX_GPUS; d++) {
        struct gpu_report *g = &m->gpus[m->ngpus++];
        g->ordinal = d;
        if (cu->DeviceGetPCIBusId(g->busid, (int)sizeof(g->busid), d) != cudaSuccess) {
            cu->GetLastError();
            snprintf(g->busid, sizeof(g->busid), "?");
        }
        /* The match ib makes for a rank on this device (ib_dev.c). */
        int i = topo_ok ? weft_topo_find_gpu(t, g->busid) : -1;
        int n = i >= 0 ? t->gpu_nic[i] : -1;
        if (!topo_ok)
            snprintf(g->how, sizeof(g->how), "topology not available");
        else if (i < 0)
            snprintf(g->how, sizeof(g->how), "not in the topology");
        else if (n < 0)
            snprintf(g->how, sizeof(g->how), "no RDMA NIC in the topology");
        else {
            snprintf(g->nic, sizeof(g->nic), "%s", t->nics[n].name);
            snprintf(g->how, sizeof(g->how), "%s", weft_topo_distance_name(t->gpu_nic_distance[i]));
        }
    }
#endif
    free(t);
}

static void probe_machine(struct weft_core *core, struct machine *m)
{
    char why[TEXT] = "";

    memset(m, 0, sizeof(*m));
    if (gethostname(m->host, sizeof(m->host)) != 0)
        snprintf(m->host, sizeof(m->host), "?");
    m->host[sizeof(m->host) - 1] = '\0';
    m->pid = (int)getpid();
    m->cpus = sysconf(_SC_NPROCESSORS_ONLN);

    /* CUDA as weft_comm_create loads it (src/comm/comm.c). */
    core->cuda = weft_cuda_load(core->cfg.cuda_lib, why, sizeof(why)) == WEFT_SUCCESS;
    m->cuda = core->cuda;
#ifdef WEFT_HAVE_CUDA_HEADERS
    if (core->cuda)
        snprintf(m->cuda_what, sizeof(m->cuda_what), "%s, %d device(s)", weft_cuda_get()->path,
                 weft_cuda_get()->device_count);
    else
#endif
        snprintf(m->cuda_what, sizeof(m->cuda_what), "%s", why);

    for (int i = 0; i < weft_registry_count() && m->ntps < MAX_TPS; i++) {
        const struct weft_transport *t = weft_registry_get(i);
        struct tp_report *r = &m->tps[m->ntps++];
        snprintf(r->name, sizeof(r->name), "%s", t->name);
        r->carrier = t->ctrl;
        if (t->probe == NULL) {
            r->usable = 1;
            snprintf(r->what, sizeof(r->what), "%s", t->scope == WEFT_TP_SCOPE_SELF ? "a rank to itself" : "always");
        } else {
            r->usable = t->probe(core, r->what, sizeof(r->what));
        }
    }

    /* The rendezvous paths (p2p/rndv.h), from what the transports said. */
    const struct tp_report *ipc = NULL;
    for (int i = 0; i < m->ntps; i++)
        if (!m->tps[i].carrier)
            ipc = &m->tps[i];
    struct path_report *p = &m->paths[m->npaths++];
    p->name = "mover";
    p->usable = ipc != NULL && ipc->usable;
    snprintf(p->what, sizeof(p->what), "device to device between ranks of one node%s%s%s",
             ipc ? " by " : "", ipc ? ipc->name : "", p->usable ? "" : ": no mover usable here");
    p = &m->paths[m->npaths++];
    p->name = "native";
    p->usable = 1;
    snprintf(p->what, sizeof(p->what), "host memory by the pair's carrier; device memory only by ib with GPUDirect "
             "RDMA on both ends (see ib)");
    p = &m->paths[m->npaths++];
    p->name = "staged";
    p->usable = m->cuda;
    if (m->cuda)
        snprintf(p->what, sizeof(p->what), "device data through pinned host memory, chunks of %zu bytes, %d in "
                 "flight per side", core->cfg.cuda_stage_chunk, core->cfg.cuda_stage_slots);
    else
        snprintf(p->what, sizeof(p->what), "no CUDA: %.400s", m->cuda_what);

    probe_gpus(core, m);
}

/* ------------------------------------------------------------ settings */

struct setting {
    const char *name;
    char value[300];
    char origin[64];
    int  agreed;           /* must be equal on every rank */
};

static int collect_settings(const struct weft_config *cfg, struct setting *out, int max, int comm_agreed)
{
    const char *names[MAX_NAMES];
    int n = weft_config_names(names, MAX_NAMES);
    if (n > MAX_NAMES)
        n = MAX_NAMES;
    if (n > max)
        n = max;
    for (int i = 0; i < n; i++) {
        struct setting *s = &out[i];
        const char *origin = weft_config_origin(names[i], NULL);
        s->name = names[i];
        weft_config_format(cfg, names[i], s->value, sizeof(s->value));
        s->agreed = weft_config_agreed_index(names[i]) >= 0;
        /* Under --pairs the comm was created: every rank had the same value. */
        if (s->agreed && comm_agreed)
            snprintf(s->origin, sizeof(s->origin), "agreed (%s)", origin);
        else
            snprintf(s->origin, sizeof(s->origin), "%s", origin);
    }
    return n;
}

/* WEFT_* variables of the environment that libweft does not read: the
 * PMPI drop-in's, the emulators' and tests', or a typo. */
static const char *other_reader(const char *name)
{
    if (strncmp(name, "WEFT_MPI", 8) == 0)
        return "read by libweft_mpi.so (docs/mpi.md), not by libweft";
    if (strncmp(name, "WEFT_EMU_", 9) == 0)
        return "read by the emulators of tests/emu, not by libweft";
    if (strncmp(name, "WEFT_TEST_", 10) == 0 || strncmp(name, "WEFT_BENCH", 10) == 0 ||
        strncmp(name, "WEFT_NETNS", 10) == 0)
        return "read by weft's tests, benchmarks or scripts, not by libweft";
    return "not a weft setting (a typo?)";
}

/* ------------------------------------------------------------ printing */

/* The MPI family and version weft was built against (mpi.h): a build is
 * for one family (docs/mpi.md, "Open MPI or MPICH"). */
#define WEFT_INFO_STR_(x) #x
#define WEFT_INFO_STR(x) WEFT_INFO_STR_(x)
#if defined(OPEN_MPI)
#define WEFT_INFO_MPI                                                                                      \
    "Open MPI " WEFT_INFO_STR(OMPI_MAJOR_VERSION) "." WEFT_INFO_STR(OMPI_MINOR_VERSION) "." WEFT_INFO_STR( \
        OMPI_RELEASE_VERSION)
#elif defined(MPICH_VERSION)
#define WEFT_INFO_MPI "MPICH " MPICH_VERSION
#else
#define WEFT_INFO_MPI "MPI " WEFT_INFO_STR(MPI_VERSION) "." WEFT_INFO_STR(MPI_SUBVERSION)
#endif

/* "RelWithDebInfo, GNU 12.2.0, MPI Open MPI 4.1.4, CUDA headers yes, ..." */
static void build_line(char *b, size_t len)
{
    snprintf(b, len, "%s, %s, MPI %s, CUDA headers %s, reduction kernels %s, verbs headers %s, hwloc %u.%u (run time "
             "%u.%u)%s", WEFT_INFO_BUILD_TYPE, WEFT_INFO_COMPILER, WEFT_INFO_MPI,
#ifdef WEFT_HAVE_CUDA_HEADERS
             "yes",
#else
             "no",
#endif
#ifdef WEFT_HAVE_REDUCE_FATBIN
             "yes",
#else
             "no",
#endif
#ifdef WEFT_HAVE_VERBS_HEADERS
             "yes",
#else
             "no",
#endif
             HWLOC_API_VERSION >> 16, (HWLOC_API_VERSION >> 8) & 0xff, hwloc_get_api_version() >> 16,
             (hwloc_get_api_version() >> 8) & 0xff, WEFT_INFO_SANITIZERS);
}

static void print_build(FILE *f)
{
    char b[512];
    build_line(b, sizeof(b));
    fprintf(f, "weft %d.%d.%d\nbuild: %s\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH, b);
}

static void print_machine_text(FILE *f, const struct machine *m)
{
    fprintf(f, "host: %s (pid %d, %ld CPUs online)\n", m->host, m->pid, m->cpus);
    fprintf(f, "\ntransports (in the order weft prefers them):\n");
    for (int i = 0; i < m->ntps; i++)
        fprintf(f, "  %-9s %-8s %s: %s\n", m->tps[i].name, m->tps[i].carrier ? "carrier" : "mover",
                m->tps[i].usable ? "usable" : "not usable", m->tps[i].what);
    fprintf(f, "\nrendezvous paths:\n");
    for (int i = 0; i < m->npaths; i++)
        fprintf(f, "  %-9s %s: %s\n", m->paths[i].name, m->paths[i].usable ? "usable" : "not usable",
                m->paths[i].what);
    fprintf(f, "\ncuda: %s: %s\n", m->cuda ? "usable" : "not usable", m->cuda_what);
    for (int i = 0; i < m->ngpus; i++) {
        const struct gpu_report *g = &m->gpus[i];
        if (g->nic[0])
            fprintf(f, "  cuda%d %s -> NIC %s (%s)\n", g->ordinal, g->busid, g->nic, g->how);
        else
            fprintf(f, "  cuda%d %s -> no NIC (%s)\n", g->ordinal, g->busid, g->how);
    }
    fprintf(f, "topology: %s\n", m->topo_what);
}

/* The next WEFT_* variable of the environment that libweft does not read,
 * from *pos on (a typo, or another program's): its "NAME=value" entry,
 * with NAME in name; NULL after the last. */
static const char *next_unread_variable(char ***pos, char *name, size_t n)
{
    for (; **pos != NULL; (*pos)++) {
        const char *e = **pos;
        size_t l = strcspn(e, "=");
        if (strncmp(e, "WEFT_", 5) != 0 || l >= n || e[l] != '=')
            continue;
        memcpy(name, e, l);
        name[l] = '\0';
        if (weft_config_reads(name))
            continue;
        (*pos)++;
        return e;
    }
    return NULL;
}

static void print_settings_text(FILE *f, const struct setting *s, int n)
{
    fprintf(f, "\nsettings (value, origin; * = must be equal on every rank):\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-26s %-20s %s%s\n", s[i].name, s[i].value[0] ? s[i].value : "\"\"", s[i].origin,
                s[i].agreed ? " *" : "");
    int header = 0;
    char **pos = environ, name[128];
    const char *e;
    while ((e = next_unread_variable(&pos, name, sizeof name)) != NULL) {
        if (!header++)
            fprintf(f, "other WEFT_* variables in the environment:\n");
        fprintf(f, "  %s: %s\n", e, other_reader(name));
    }
}

static void json_machine(FILE *f, const struct machine *m)
{
    fprintf(f, "\"host\": ");
    json_str(f, m->host);
    fprintf(f, ", \"pid\": %d, \"cpus\": %ld,\n  \"transports\": [", m->pid, m->cpus);
    for (int i = 0; i < m->ntps; i++) {
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_str(f, m->tps[i].name);
        fprintf(f, ", \"kind\": \"%s\", \"usable\": %s, \"detail\": ", m->tps[i].carrier ? "carrier" : "mover",
                m->tps[i].usable ? "true" : "false");
        json_str(f, m->tps[i].what);
        fputc('}', f);
    }
    fprintf(f, "],\n  \"paths\": [");
    for (int i = 0; i < m->npaths; i++) {
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_str(f, m->paths[i].name);
        fprintf(f, ", \"usable\": %s, \"detail\": ", m->paths[i].usable ? "true" : "false");
        json_str(f, m->paths[i].what);
        fputc('}', f);
    }
    fprintf(f, "],\n  \"cuda\": {\"usable\": %s, \"detail\": ", m->cuda ? "true" : "false");
    json_str(f, m->cuda_what);
    fprintf(f, ", \"devices\": [");
    for (int i = 0; i < m->ngpus; i++) {
        fprintf(f, "%s{\"ordinal\": %d, \"busid\": ", i ? ", " : "", m->gpus[i].ordinal);
        json_str(f, m->gpus[i].busid);
        fprintf(f, ", \"nic\": ");
        if (m->gpus[i].nic[0])
            json_str(f, m->gpus[i].nic);
        else
            fputs("null", f);
        fprintf(f, ", \"affinity\": ");
        json_str(f, m->gpus[i].how);
        fputc('}', f);
    }
    fprintf(f, "]},\n  \"topology\": ");
    json_str(f, m->topo_what);
}

static void json_settings(FILE *f, const struct setting *s, int n)
{
    fprintf(f, "  \"settings\": [");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        json_str(f, s[i].name);
        fprintf(f, ", \"value\": ");
        json_str(f, s[i].value);
        fprintf(f, ", \"origin\": ");
        json_str(f, s[i].origin);
        fprintf(f, ", \"must_agree\": %s}", s[i].agreed ? "true" : "false");
    }
    fprintf(f, "],\n  \"other_environment\": [");
    int k = 0;
    char **pos = environ, name[128];
    const char *e;
    while ((e = next_unread_variable(&pos, name, sizeof name)) != NULL) {
        fprintf(f, "%s{\"name\": ", k++ ? ", " : "");
        json_str(f, name);
        fprintf(f, ", \"value\": ");
        json_str(f, e + strlen(name) + 1);
        fprintf(f, ", \"note\": ");
        json_str(f, other_reader(name));
        fputc('}', f);
    }
    fprintf(f, "]");
}

static void json_build(FILE *f)
{
    char b[512];
    build_line(b, sizeof(b));
    fprintf(f, "  \"version\": \"%d.%d.%d\",\n  \"build\": ", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
            WEFT_VERSION_PATCH);
    json_str(f, b);
}

/* ------------------------------------------------------------ modes */

static int load_config(struct weft_core *core)
{
    char err[512];
    weft_core_init(core, 0, 1);
    if (weft_config_load(&core->cfg, NULL, NULL, err, sizeof(err)) != WEFT_SUCCESS) {
        fprintf(stderr, "weft_info: bad configuration: %s\n", err);
        return -1;
    }
    /* The probes record errors (the reason a transport is not usable):
     * they are shown here, not as WARN lines, unless WEFT_DEBUG asks. */
    if (strcmp(weft_config_origin("WEFT_DEBUG", NULL), "default") == 0)
        weft_log_set_level(WEFT_LOG_NONE);
    return 0;
}

static int run_local(int json)
{
    static struct machine m;
    static struct setting s[MAX_NAMES];
    struct weft_core core;

    if (load_config(&core) != 0)
        return 1;
    probe_machine(&core, &m);
    int n = collect_settings(&core.cfg, s, MAX_NAMES, 0);
    if (json) {
        printf("{\n");
        json_build(stdout);
        printf(",\n  ");
        json_machine(stdout, &m);
        printf(",\n");
        json_settings(stdout, s, n);
        printf("\n}\n");
    } else {
        print_build(stdout);
        print_machine_text(stdout, &m);
        print_settings_text(stdout, s, n);
    }
    weft_core_fini(&core);
    return 0;
}

/* What each rank tells rank 0 about itself and its pairs. */
struct rank_rec {
    char host[64];
    int  node;
    int  pid;
    int  cuda_devices;
    char usable[128];      /* "self,shm,tcp" */
    char nic[32];          /* the NIC of its first CUDA device, "" none */
};

struct pair_rec {
    char carrier[16];
    char mover[16];
    char why[480];
};

static int run_pairs(int json, int *argc, char ***argv)
{
    static struct machine m;
    static struct setting s[MAX_NAMES];
    struct weft_core core;
    weft_comm_t *comm = NULL;
    int rank = 0, size = 1, rc;

    if (MPI_Init(argc, argv) != MPI_SUCCESS) {
        fprintf(stderr, "weft_info --pairs: MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (load_config(&core) != 0) {
        MPI_Finalize();
        return 1;
    }
    core.rank = rank;
    probe_machine(&core, &m);
    weft_log_set_level(weft_config_log_level_env());
    rc = weft_comm_create(MPI_COMM_WORLD, &comm);
    int ok = rc == WEFT_SUCCESS, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (!ok)
            fprintf(stderr, "weft_info --pairs: rank %d: weft_comm_create failed: %s\n", rank, weft_last_error());
        if (ok)
            weft_comm_destroy(comm);
        weft_core_fini(&core);
        MPI_Finalize();
        return 1;
    }

    struct rank_rec me;
    memset(&me, 0, sizeof(me));
    struct pair_rec *mine = calloc((size_t)size, sizeof(*mine));
    struct rank_rec *ranks = rank == 0 ? calloc((size_t)size, sizeof(*ranks)) : NULL;
    struct pair_rec *all = rank == 0 ? calloc((size_t)size * (size_t)size, sizeof(*all)) : NULL;
    if (mine == NULL || (rank == 0 && (ranks == NULL || all == NULL))) {
        fprintf(stderr, "weft_info --pairs: rank %d: no memory for %d ranks\n", rank, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(me.host, sizeof(me.host), "%s", m.host);
    me.pid = m.pid;
    me.cuda_devices = m.ngpus;
    if (m.ngpus > 0)
        snprintf(me.nic, sizeof(me.nic), "%s", m.gpus[0].nic);
    for (int i = 0; i < m.ntps; i++)
        if (m.tps[i].usable)
            snprintf(me.usable + strlen(me.usable), sizeof(me.usable) - strlen(me.usable), "%s%s",
                     me.usable[0] ? "," : "", m.tps[i].name);
    me.node = ((const struct weft_card_hdr *)(const void *)(comm->cards + (size_t)rank * comm->card_bytes))->node;
    for (int peer = 0; peer < size; peer++) {
        struct weft_p2p_pair_info info;
        if (weft_p2p_describe_pair(comm->p2p, comm->cards, peer, &info) != WEFT_SUCCESS)
            snprintf(info.carrier, sizeof(info.carrier), "?");
        snprintf(mine[peer].carrier, sizeof(mine[peer].carrier), "%s", info.carrier);
        snprintf(mine[peer].mover, sizeof(mine[peer].mover), "%s", info.mover);
        snprintf(mine[peer].why, sizeof(mine[peer].why), "%.470s", info.why);
    }
    MPI_Gather(&me, (int)sizeof(me), MPI_BYTE, ranks, (int)sizeof(me), MPI_BYTE, 0, MPI_COMM_WORLD);
    MPI_Gather(mine, (int)(sizeof(*mine) * (size_t)size), MPI_BYTE, all, (int)(sizeof(*mine) * (size_t)size),
               MPI_BYTE, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        int n = collect_settings(&core.cfg, s, MAX_NAMES, 1);
        if (json) {
            printf("{\n");
            json_build(stdout);
            printf(",\n  \"ranks\": [");
            for (int r = 0; r < size; r++) {
                printf("%s\n    {\"rank\": %d, \"host\": ", r ? "," : "", r);
                json_str(stdout, ranks[r].host);
                printf(", \"node\": %d, \"pid\": %d, \"cuda_devices\": %d, \"nic\": ", ranks[r].node, ranks[r].pid,
                       ranks[r].cuda_devices);
                if (ranks[r].nic[0])
                    json_str(stdout, ranks[r].nic);
                else
                    printf("null");
                printf(", \"usable\": ");
                json_str(stdout, ranks[r].usable);
                printf("}");
            }
            printf("],\n  \"pairs\": [");
            int k = 0;
            for (int a = 0; a < size; a++)
                for (int b = a + 1; b < size; b++) {
                    const struct pair_rec *p = &all[(size_t)a * (size_t)size + (size_t)b];
                    const struct pair_rec *q = &all[(size_t)b * (size_t)size + (size_t)a];
                    printf("%s\n    {\"rank_a\": %d, \"rank_b\": %d, \"transport\": ", k++ ? "," : "", a, b);
                    json_str(stdout, p->carrier);
                    printf(", \"device_mover\": ");
                    if (p->mover[0])
                        json_str(stdout, p->mover);
                    else
                        printf("null");
                    printf(", \"both_ends_agree\": %s, \"why\": ", strcmp(p->carrier, q->carrier) == 0 ? "true"
                                                                                                   : "false");
                    json_str(stdout, p->why);
                    printf("}");
                }
            printf("],\n");
            json_settings(stdout, s, n);
            printf("\n}\n");
        } else {
            print_build(stdout);
            printf("comm of %d ranks (MPI_COMM_WORLD)\n\nranks:\n", size);
            for (int r = 0; r < size; r++)
                printf("  rank %d: host %s, node %d, pid %d, usable %s, %d CUDA device(s)%s%s\n", r, ranks[r].host,
                       ranks[r].node, ranks[r].pid, ranks[r].usable, ranks[r].cuda_devices,
                       ranks[r].nic[0] ? ", NIC " : "", ranks[r].nic);
            printf("\npairs:\n  %-6s %-6s %-9s %s\n", "rank_a", "rank_b", "transport", "why");
            for (int a = 0; a < size; a++)
                for (int b = a + 1; b < size; b++) {
                    const struct pair_rec *p = &all[(size_t)a * (size_t)size + (size_t)b];
                    const struct pair_rec *q = &all[(size_t)b * (size_t)size + (size_t)a];
                    printf("  %-6d %-6d %-9s %s%s%s%s\n", a, b, p->carrier, p->why, p->mover[0] ? "; device data by "
                           : "", p->mover, strcmp(p->carrier, q->carrier) == 0 ? ""
                           : "; THE OTHER END CHOSE ANOTHER TRANSPORT");
                }
            if (size == 1)
                printf("  (one rank: no pairs; run it as mpirun -np N weft_info --pairs)\n");
            print_settings_text(stdout, s, n);
        }
        fflush(stdout);
    }
    free(mine);
    free(ranks);
    free(all);
    rc = weft_comm_destroy(comm);
    weft_core_fini(&core);
    MPI_Finalize();
    return rc == WEFT_SUCCESS ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: weft_info [--json]\n"
            "       mpirun -np N weft_info --pairs [--json]\n"
            "\n"
            "What weft finds on this machine and why.\n"
            "  (no option)  version, build, each transport and rendezvous path (usable, or\n"
            "               why not), CUDA devices and the NIC each would use, every WEFT_*\n"
            "               setting with its value and origin (default / environment)\n"
            "  --pairs      under mpirun: a weft comm over all ranks; for each pair of ranks\n"
            "               the transport weft chose and why (settings that must agree are\n"
            "               shown as agreed)\n"
            "  --json       the same as one JSON object\n"
            "  --version    the version only\n"
            "  -h, --help   this text\n"
            "WEFT_* variables are read as weft_comm_create reads them (docs/configuration.md);\n"
            "docs/troubleshooting.md says what to do with the answers.\n");
}

int main(int argc, char **argv)
{
    int json = 0, pairs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "--pairs") == 0) {
            pairs = 1;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("weft %d.%d.%d\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
            return 0;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "weft_info: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    return pairs ? run_pairs(json, &argc, &argv) : run_local(json);
}
