/*
 * Settings and the routing rule of the PMPI layer.
 *
 * A call goes to weft or to PMPI on facts every rank of the call agrees on
 * (which collective, the communicator, the total size, root, op, type),
 * never on facts of one rank (alignment, contiguity of its own buffers):
 * ranks that took different paths would wait for each other forever.
 * Below a size per collective MPI's own algorithms are as fast or faster
 * (weft's fixed per-call cost is higher), so those calls go to PMPI; the
 * defaults come from bench/mpi/run.sh (docs/benchmarks.md, "PMPI drop-in").
 *
 * Variables (read once, at the first intercepted call):
 *   WEFT_MPI=0|1                 0: the layer is off, every call to PMPI
 *   WEFT_MPI_COLLS=a,b,...       only these collectives (names below, or "all")
 *   WEFT_MPI_MIN_BYTES=N         every threshold = N bytes (0: weft for any size > 0)
 *   WEFT_MPI_MIN_BYTES=coll=N,.. some thresholds
 *   WEFT_MPI_MAX_BYTES=N | coll=N,..  the largest size weft serves (same forms)
 *   WEFT_MPI_STATS=1             per-rank counts of calls served each way, at MPI_Finalize
 * A value that cannot be read turns the layer off with one WARN line
 * naming it (a typo must not silently change which code serves the job).
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "weft_mpi.h"

static const char *const names[WMPI_NCOLLS] = {
    [WMPI_ALLGATHER] = "allgather",
    [WMPI_BCAST] = "bcast",
    [WMPI_BARRIER] = "barrier",
    [WMPI_ALLREDUCE] = "allreduce",
    [WMPI_REDUCE] = "reduce",
    [WMPI_REDUCE_SCATTER_BLOCK] = "reduce_scatter_block",
    [WMPI_ALLTOALL] = "alltoall",
    [WMPI_GATHER] = "gather",
    [WMPI_SCATTER] = "scatter",
    [WMPI_ALLTOALLV] = "alltoallv",
};

/* The size each threshold compares with (colls.c): allgather, alltoall:
 * the bytes one rank contributes per peer (recvcount x recvtype); bcast:
 * the message; allreduce, reduce: the vector; reduce_scatter_block: one
 * rank's block; gather, scatter: one rank's block (the root's recvcount x
 * recvtype, resp. sendcount x sendtype; the others' own side). Barrier: 0
 * serves it with weft, SIZE_MAX leaves it to MPI.
 * The default is MPI's, everywhere: weft's own is level or ahead from 3
 * ranks on one node (0.9-1.5x back to back) and behind at 2 (0.19-0.20 us
 * MPI, 0.21-0.25 weft), but in OSU's pattern -- a timed call, then an
 * untimed barrier -- the call after weft's barrier took 3-4x longer than
 * after MPI's (an 8 B MPI_Bcast at np 4: 6.4-9.8 us against 1.8-2.5;
 * mpi-coll-perf -s 1, docs/benchmarks.md), whoever serves that call: the
 * ranks leave weft's barrier at more spread-out times on a loaded node.
 * Defaults: bench/mpi/run.sh on the 2-core development machine (shm), see
 * docs/benchmarks.md; a site overrides them with WEFT_MPI_MIN_BYTES.
 * Gather and scatter (2026-12-03, docs/data/bench/2026-12-03-pmpi-gather-
 * scatter): weft ahead from 512 B a block at np 2 (1.5-2.3x at 512 B-2 KiB,
 * below it 0.65-0.95: MPI's single eager message), at np 3, 4 and 8 from a
 * few bytes (the node-local rule below). Alltoallv has no agreed size: it
 * passes 1, as the barrier; its default is the rank rule of wmpi_serves
 * (alltoallv_takes), a threshold set for it decides instead (0: weft,
 * anything else: MPI). */
static const size_t default_min[WMPI_NCOLLS] = {
    [WMPI_ALLGATHER] = 4096,
    [WMPI_BCAST] = 4096,
    [WMPI_BARRIER] = SIZE_MAX,
    [WMPI_ALLREDUCE] = 8192,
    [WMPI_REDUCE] = 8192,
    [WMPI_REDUCE_SCATTER_BLOCK] = 4096,
    [WMPI_ALLTOALL] = 4096,
    [WMPI_GATHER] = 512,
    [WMPI_SCATTER] = 512,
    [WMPI_ALLTOALLV] = SIZE_MAX,
};
/* And the largest size weft serves: where the measurements showed Open
 * MPI's own algorithm ahead again (bcast above 8 KiB at np 4 and 8;
 * alltoall above 32 KiB per peer). The rest: no ceiling. */
static const size_t default_max[WMPI_NCOLLS] = {
    [WMPI_ALLGATHER] = SIZE_MAX,
    [WMPI_BCAST] = 8192,
    [WMPI_BARRIER] = SIZE_MAX,
    [WMPI_ALLREDUCE] = SIZE_MAX,
    [WMPI_REDUCE] = SIZE_MAX,
    [WMPI_REDUCE_SCATTER_BLOCK] = SIZE_MAX,
    [WMPI_ALLTOALL] = 32768,
    [WMPI_GATHER] = SIZE_MAX,
    [WMPI_SCATTER] = SIZE_MAX,
    [WMPI_ALLTOALLV] = SIZE_MAX,
};

static struct {
    int    on[WMPI_NCOLLS];
    size_t min[WMPI_NCOLLS];
    size_t max[WMPI_NCOLLS];
    int    sized[WMPI_NCOLLS];   /* WEFT_MPI_MIN_BYTES or _MAX_BYTES names it: the node rule is off */
    int    stats;
} S;

static atomic_ulong served[WMPI_NCOLLS][2];

const char *wmpi_coll_name(enum wmpi_coll coll)
{
    return (unsigned)coll < WMPI_NCOLLS ? names[coll] : "?";
}

static int coll_by_name(const char *s, size_t len)
{
    for (int i = 0; i < WMPI_NCOLLS; i++)
        if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0)
            return i;
    return -1;
}

/* A size: decimal digits only (no sign, no suffix). */
static int read_size(const char *s, size_t len, size_t *out)
{
    char buf[32];
    char *end;

    if (len == 0 || len >= sizeof(buf))
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    for (size_t i = 0; i < len; i++)
        if (buf[i] < '0' || buf[i] > '9')
            return -1;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno != 0 || *end != '\0' || v > SIZE_MAX)
        return -1;
    *out = (size_t)v;
    return 0;
}

static int refuse(const char *var, const char *value, const char *why)
{
    wmpi_warn("%s=\"%s\": %s; the weft MPI layer is off for this run (every call goes to MPI)", var, value, why);
    for (int i = 0; i < WMPI_NCOLLS; i++)
        S.on[i] = 0;
    return -1;
}

static int load_colls(const char *v)
{
    if (strcmp(v, "all") == 0)
        return 0;
    for (int i = 0; i < WMPI_NCOLLS; i++)
        S.on[i] = 0;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        int c = coll_by_name(p, len);
        if (c < 0)
            return refuse("WEFT_MPI_COLLS", v,
                          "unknown collective (known: allgather, bcast, barrier, allreduce, reduce, "
                          "reduce_scatter_block, alltoall, gather, scatter, alltoallv, or all)");
        S.on[c] = 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* WEFT_MPI_MIN_BYTES / WEFT_MPI_MAX_BYTES into table. */
static int load_sizes(const char *var, const char *v, size_t *table)
{
    size_t n;

    if (read_size(v, strlen(v), &n) == 0) {
        for (int i = 0; i < WMPI_NCOLLS; i++) {
            table[i] = n;
            S.sized[i] = 1;
        }
        return 0;
    }
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ","), eq = strcspn(p, "=");
        int c = eq < len ? coll_by_name(p, eq) : -1;
        if (c < 0 || read_size(p + eq + 1, len - eq - 1, &n) != 0)
            return refuse(var, v, "expected a byte count, or coll=bytes[,coll=bytes...]");
        table[c] = n;
        S.sized[c] = 1;
        p += len;
        if (*p == ',')
            p++;
    }
    return 0;
}

void wmpi_settings_load(void)
{
    const char *v;

    for (int i = 0; i < WMPI_NCOLLS; i++) {
        S.on[i] = 1;
        S.min[i] = default_min[i];
        S.max[i] = default_max[i];
        S.sized[i] = 0;
    }
    if ((v = getenv("WEFT_MPI_STATS")) != NULL && *v) {
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
            refuse("WEFT_MPI_STATS", v, "expected 0 or 1");
            return;
        }
        S.stats = v[0] == '1';
    }
    if ((v = getenv("WEFT_MPI")) != NULL && *v) {
        if (strcmp(v, "0") == 0) {
            for (int i = 0; i < WMPI_NCOLLS; i++)
                S.on[i] = 0;
            return;
        }
        if (strcmp(v, "1") != 0) {
            refuse("WEFT_MPI", v, "expected 0 or 1");
            return;
        }
    }
    if ((v = getenv("WEFT_MPI_COLLS")) != NULL && *v && load_colls(v) != 0)
        return;
    /* Either variable set: the defaults of the other no longer apply to
     * the collectives named (a site that sets MIN_BYTES=0 means "weft for
     * every size" unless it also sets a ceiling). */
    const char *min = getenv("WEFT_MPI_MIN_BYTES"), *max = getenv("WEFT_MPI_MAX_BYTES");
    if ((min && *min) || (max && *max))
        for (int i = 0; i < WMPI_NCOLLS; i++)
            S.max[i] = SIZE_MAX;
    if (min && *min && load_sizes("WEFT_MPI_MIN_BYTES", min, S.min) != 0)
        return;
    if (max && *max)
        load_sizes("WEFT_MPI_MAX_BYTES", max, S.max);
}

int wmpi_enabled(enum wmpi_coll coll)
{
    return S.on[coll];
}

/* The node-local rule: on a communicator whose weft comm serves calls in
 * the node's shared segment (weft_comm_node_coll_bytes > 0: one node, shm),
 * from 3 ranks on, weft serves the calls of these collectives from
 * node_min up to what the segment takes, whatever the thresholds say: one
 * round in shared memory against MPI's log p or p-1 messages. Measured with
 * bench/mpi/run.sh at np 2, 3, 4 and 8, 8 B-64 KiB (docs/benchmarks.md,
 * "PMPI drop-in"): weft ahead or level from these sizes at np 3, 4 and 8;
 * below them (bcast < 128 B at np 8, allgather < 128 B a peer at np 4 and
 * 8, reduce < 64 B at np 3) MPI's own. Alltoall (2026-12-03, bench/mpi/
 * run.sh -c alltoall, 3 jobs a mode, docs/data/bench/2026-12-03-node-pulls):
 * from 512 B a peer up to the segment's slot a peer -- 1.5-4x Open MPI's
 * speed at np 3, 4 and 8 from 1 KiB a peer, 2.1x at np 3 and 1.8x at np 4
 * at 512 B; below that MPI's p-1 eager sends of a few bytes are its
 * cheapest case (np 4: 0.68-0.73 at 4-32 B a peer). Above the slot weft
 * pulls the blocks by CMA, about level with Open MPI's single-copy
 * messages (0.86-1.18 over np 3-8): the thresholds decide there (MPI's
 * above 32 KiB a peer by default). At 2 ranks
 * MPI's calls are single eager messages (0.1-0.25 us) that the segment's
 * round does not beat: the thresholds decide there, as on several nodes.
 * reduce_scatter_block was not measured: the thresholds decide; the
 * barrier stays MPI's (above, default_min). Gather and scatter (2026-12-03,
 * np 3, 4 and 8): ahead from 16 B a block (gather at np 4 with 8 B: 0.77;
 * at np 3 from 256 B, node_takes). SIZE_MAX: not taken. Units as
 * the thresholds' (colls.c). */
static const size_t node_min[WMPI_NCOLLS] = {
    [WMPI_ALLGATHER] = 128,
    [WMPI_BCAST] = 128,
    [WMPI_BARRIER] = SIZE_MAX,
    [WMPI_ALLREDUCE] = 0,
    [WMPI_REDUCE] = 64,
    [WMPI_REDUCE_SCATTER_BLOCK] = SIZE_MAX,
    [WMPI_ALLTOALL] = 512,
    [WMPI_GATHER] = 16,
    [WMPI_SCATTER] = 16,
    [WMPI_ALLTOALLV] = SIZE_MAX,   /* alltoallv_takes */
};

/* Whether the node-local rule takes a call of coll with size bytes on a
 * comm of nranks ranks whose segment takes node_bytes a rank. A collective
 * named in WEFT_MPI_MIN_BYTES / WEFT_MPI_MAX_BYTES is the site's: only
 * its thresholds decide. */
static int node_takes(enum wmpi_coll coll, size_t bytes, int nranks, size_t node_bytes)
{
    if (node_bytes == 0 || S.sized[coll] || nranks < 3 || bytes < node_min[coll])
        return 0;
    /* bcast at 3 ranks from 8 KiB: 0.55-0.88 in one campaign, 0.98-1.9 in
     * two others (at 4 and 8 ranks 1.3-2.9 in all three): left to the
     * thresholds there, which give MPI everything above 8 KiB. */
    if (coll == WMPI_BCAST && nranks == 3 && bytes > 4096)
        return 0;
    /* gather and scatter at 3 ranks: MPI's two eager messages level or
     * ahead up to 84 B a block (scatter 0.67-0.91 in one run; gather
     * 1.4-2.3x in one run, 0.59-0.95 in the next), weft from 168 B (1.19-3.1,
     * then 12-15x at 340 B in every run). */
    if ((coll == WMPI_SCATTER || coll == WMPI_GATHER) && nranks == 3 && bytes < 256)
        return 0;
    /* What weft's own rule (collectives/node_coll.c) sends to the segment:
     * an allgather's block and a reduction's vector up to node_bytes, a
     * bcast's message at any size (up to a whole big buffer, nranks x
     * node_bytes, in one call, above it in pieces of that: at 4 ranks
     * 128-256 KiB took 20-45 us there against 30-87 in Open MPI, 512 KiB-8
     * MiB about half Open MPI's time, docs/benchmarks.md). */
    if (coll == WMPI_BCAST)
        return 1;
    return bytes <= node_bytes;
}

/* Whether the node-local rule leaves to MPI a call that it or the
 * thresholds would give weft (a collective named in WEFT_MPI_MIN_BYTES /
 * WEFT_MPI_MAX_BYTES: never). A scatter on one node of 8 ranks or more
 * with blocks from 64 KiB to 512 KiB was never measured ahead of Open
 * MPI's: 0.79-0.93 of its speed through the drop-in in two runs of 3-4
 * jobs, level (0.97-1.04) in weft-perf's same-job A/B of weft_scatter
 * (2026-12-03 campaign) -- the root alone copies n-1 blocks into the
 * segment, or sends n-1 rendezvous messages above it, where Open MPI's
 * n-1 receivers pull at once. At 32 KiB weft is 1.2-1.6x ahead, from 1 MiB
 * 1.35-1.8x; at 4 ranks ahead throughout in weft-perf (1.04-1.5x). The cut
 * between 32 and 64 KiB was not measured finer. Since the receivers pull
 * their blocks out of the root's buffer (2026-12-04, node_scatter_pull)
 * weft is level there, not ahead: through the drop-in with
 * WEFT_MPI_MIN_BYTES=0, Open MPI time / weft time 1.01-1.15 at 64-256 KiB
 * and 0.98-1.03 at 512 KiB in two runs of 3 and 6 jobs, where the same
 * calls left to Open MPI in both jobs spread 0.95-1.06
 * (docs/data/bench/2026-12-04-scatter-pulls/pmpi-np8-run*.md): still
 * MPI's. */
static int node_refuses(enum wmpi_coll coll, size_t bytes, int nranks, size_t node_bytes)
{
    if (node_bytes == 0 || S.sized[coll])
        return 0;
    return coll == WMPI_SCATTER && nranks >= 8 && bytes > ((size_t)32 << 10) && bytes <= ((size_t)512 << 10);
}

/* Alltoallv's default, from the rank count alone (no size is agreed,
 * colls.c): weft from 3 ranks on a communicator of one node that shares
 * memory (node_bytes > 0), MPI otherwise. bench/mpi/run.sh -c alltoallv,
 * uneven blocks (1/2, 1 and 3/2 of the mean), 8 B-4 MiB, 3 jobs a mode
 * (docs/benchmarks.md, "The PMPI drop-in: alltoallv", run4: weft's
 * node-local alltoallv up to a slot, messages above): Open MPI time /
 * weft time at 3 ranks 1.9-4.8x to 32 KiB, 0.98-1.17 above; at 4 ranks
 * 1.1-3.1x to 128 KiB, 0.91-0.94 at 512 KiB-2 MiB; at 8 ranks 1.55-2.8x to
 * 128 KiB, 0.66-0.85 at 512 KiB-2 MiB (weft's pairwise messages against
 * Open MPI's) -- no size can pick those out, and below them weft is ahead
 * by more. At 2 ranks weft's is behind below 512 B (0.66-0.68: one eager
 * message each way is MPI's cheapest case): MPI's. Across nodes it was
 * not measured: MPI's. */
static int alltoallv_takes(int nranks, size_t node_bytes)
{
    return nranks >= 3 && node_bytes > 0;
}

int wmpi_serves(enum wmpi_coll coll, size_t bytes, int nranks, size_t node_bytes)
{
    if (coll == WMPI_ALLTOALLV && !S.sized[coll])
        return bytes > 0 && alltoallv_takes(nranks, node_bytes);
    if (bytes == 0 || node_refuses(coll, bytes, nranks, node_bytes))
        return 0;
    return node_takes(coll, bytes, nranks, node_bytes) || (bytes >= S.min[coll] && bytes <= S.max[coll]);
}

void wmpi_count(enum wmpi_coll coll, int by_weft)
{
    if (S.stats)
        atomic_fetch_add_explicit(&served[coll][by_weft ? 1 : 0], 1, memory_order_relaxed);
}

void wmpi_stats_print(void)
{
    char line[512];
    int rank = -1, n;

    if (!S.stats)
        return;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    n = snprintf(line, sizeof(line), "weft_mpi: rank %d:", rank);
    for (int i = 0; i < WMPI_NCOLLS && n > 0 && (size_t)n < sizeof(line); i++)
        n += snprintf(line + n, sizeof(line) - (size_t)n, " %s weft=%lu pmpi=%lu", names[i],
                      atomic_load(&served[i][1]), atomic_load(&served[i][0]));
    fprintf(stderr, "%s\n", line);
}
