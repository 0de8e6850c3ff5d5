/*
 * weft-perf: weft and MPI side by side, in the same run, on the same buffers.
 *
 *   mpirun -np 2 build/bench/weft-perf sendrecv [options]
 *
 * This file holds main(), option parsing and the helpers every subcommand
 * shares (perf.h). The subcommands are in perf_p2p.c (sendrecv, init),
 * perf_coll.c (allgather, bcast, gather, scatter, barrier), perf_reduce.c
 * (allreduce, reduce, reduce_scatter, alltoall) and perf_exchange.c (exchange).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "perf.h"

extern char **environ;

/* ---------------------------------------------------------------- helpers */

double perf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double perf_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int perf_reps(const struct perf_opts *o, int def)
{
    return o->reps > 0 ? o->reps : def;
}

void perf_sizes(const struct perf_opts *o, size_t def_min, size_t def_max,
                size_t *min_bytes, size_t *max_bytes)
{
    *min_bytes = o->min_bytes ? o->min_bytes : def_min;
    *max_bytes = o->max_bytes ? o->max_bytes : def_max;
    if (*max_bytes < *min_bytes)
        *max_bytes = *min_bytes;
}

size_t perf_next_size(const struct perf_opts *o, size_t bytes)
{
    if (bytes == 0)
        return 1;               /* a sweep that starts at 0 B goes on with 1 B */
    if (bytes > SIZE_MAX / o->factor)
        return 0;
    return bytes * o->factor;
}

int perf_scale_iters(const struct perf_opts *o, size_t bytes, size_t budget_bytes, int lo, int hi)
{
    if (o->iters > 0)
        return o->iters;
    size_t n = budget_bytes / (bytes ? bytes : 1);
    if (n < (size_t)lo)
        return lo;
    if (n > (size_t)hi)
        return hi;
    return (int)n;
}

uint64_t perf_seed(uint64_t iter, uint64_t bytes, uint64_t slot, uint64_t lib)
{
    /* Distinct odd multipliers keep (iter, bytes, slot, lib) tuples apart
     * after mixing; the pattern itself mixes again per word. */
    return iter * 0x9E3779B97F4A7C15ull ^ bytes * 0xC2B2AE3D27D4EB4Full ^
           slot * 0x165667B19E3779F9ull ^ (lib + 1) * 0xD6E8FEB86659FD93ull;
}

/* Word i of the pattern: cheap enough to fill tens of MiB per iteration,
 * different in every byte position for neighbouring words and seeds. */
static inline uint64_t pattern_word(uint64_t seed, uint64_t i)
{
    uint64_t x = (seed + i) * 0x9E3779B97F4A7C15ull;
    return x ^ (x >> 29);
}

void perf_fill(void *buf, size_t bytes, uint64_t seed)
{
    unsigned char *p = buf;
    size_t words = bytes / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = pattern_word(seed, i);
        memcpy(p + 8 * i, &w, 8);     /* memcpy: buffers may be unaligned */
    }
    if (bytes % 8) {
        uint64_t w = pattern_word(seed, words);
        memcpy(p + 8 * words, &w, bytes % 8);
    }
}

static size_t differing_bytes(uint64_t a, uint64_t b, size_t n)
{
    unsigned char x[8], y[8];
    size_t bad = 0;
    memcpy(x, &a, 8);
    memcpy(y, &b, 8);
    for (size_t k = 0; k < n; k++)
        bad += x[k] != y[k];
    return bad;
}

size_t perf_verify(const void *buf, size_t bytes, uint64_t seed)
{
    const unsigned char *p = buf;
    size_t words = bytes / 8, bad = 0;
    for (size_t i = 0; i < words; i++) {
        uint64_t got, want = pattern_word(seed, i);
        memcpy(&got, p + 8 * i, 8);
        if (got != want)
            bad += differing_bytes(got, want, 8);
    }
    if (bytes % 8) {
        uint64_t got = 0, want = pattern_word(seed, words);
        memcpy(&got, p + 8 * words, bytes % 8);
        bad += differing_bytes(got, want, bytes % 8);
    }
    return bad;
}

void *perf_alloc(size_t bytes)
{
    void *p = NULL;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = posix_memalign(&p, 4096, bytes ? bytes : 1);
    if (rc != 0) {
        fprintf(stderr, "weft-perf rank %d: cannot allocate %zu bytes: %s\n", rank, bytes, strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Touch every page now so first-touch page faults never land in a timed loop. */
    memset(p, 0xA5, bytes);
    return p;
}

void perf_free(void *p)
{
    free(p);
}

const char *perf_size_str(size_t bytes, char *buf, size_t len)
{
    static const char units[] = "KMGT";
    int u = -1;
    size_t v = bytes;
    while (v >= 1024 && v % 1024 == 0 && u < 3) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, len, "%zu", v);
    else
        snprintf(buf, len, "%zu%c", v, units[u]);
    return buf;
}

void perf_print_header(const struct perf_opts *o, const char *what)
{
    if (o->rank != 0)
        return;
    if (o->csv) {
        /* One header per run, however many tables the subcommand has: the
         * output is then one CSV table, and files of several runs can be
         * concatenated after dropping their first lines. */
        static int printed;
        if (!printed)
            printf("%s\n", PERF_CSV_HEADER);
        printed = 1;
        fflush(stdout);
        return;
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    char date[64] = "?";
    if (gmtime_r(&now, &tm))
        strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", &tm);

    printf("#\n# weft-perf:");
    for (int i = 0; i < o->argc; i++)
        printf(" %s", o->argv[i]);
    /* The machine may be shared: the load says how quiet it was. */
    char load[64] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(load, sizeof load, f))
            snprintf(load, sizeof load, "?");
        load[strcspn(load, "\n")] = '\0';
        fclose(f);
    }
    printf("\n# np %d, nodes %d, host %s, %s, loadavg %s\n", o->size, o->nodes, host, date, load);
    const char *tp = getenv("WEFT_TRANSPORTS");
    printf("# weft transports: %s\n", tp ? tp : "default (self,shm,tcp: best per pair)");
    /* mpirun passes its --mca options to the ranks as OMPI_MCA_* variables,
     * so this shows which MPI transports the comparison ran over. */
    int any = 0;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "OMPI_MCA_btl", 12) == 0 || strncmp(*e, "OMPI_MCA_pml", 12) == 0 ||
            strncmp(*e, "OMPI_MCA_mpi_yield", 18) == 0 ||
            (strncmp(*e, "WEFT_", 5) == 0 && strncmp(*e, "WEFT_TRANSPORTS=", 16) != 0)) {
            printf("%s %s", any ? "" : "# environment:", *e);
            any = 1;
        }
    }
    if (any)
        printf("\n");
    printf("# MPI transports: %s\n", getenv("OMPI_MCA_btl") ? getenv("OMPI_MCA_btl") : "Open MPI default");
#ifdef WEFT_PERF_HAVE_UCX
    printf("# UCX transports (sendrecv's UCX column): %s\n", getenv("UCX_TLS") ? getenv("UCX_TLS") : "UCX default");
#endif
    perf_mem_describe(o);
    printf("%s\n", what);
    fflush(stdout);
}

/* Copies src into dst (len > 0) with ',' as '+', so a value such as
 * WEFT_TRANSPORTS=shm,tcp stays one CSV field without quoting. */
static void csv_field(char *dst, size_t len, const char *src)
{
    size_t i = 0;
    for (; src[i] && i + 1 < len; i++)
        dst[i] = src[i] == ',' ? '+' : src[i];
    dst[i] = '\0';
}

/* The transport configuration of a library's rows (perf.h, perf_report). */
static void csv_transport(char *buf, size_t len, const char *library)
{
    char v[128];
    if (strncmp(library, "MPI", 3) == 0) {
        const char *btl = getenv("OMPI_MCA_btl");
        csv_field(buf, len, btl && *btl ? btl : "default");
        return;
    }
    if (strcmp(library, "ucx") == 0) {
        /* UCX picks its transports from UCX_TLS (perf_ucx.c). */
        const char *tls = getenv("UCX_TLS");
        csv_field(buf, len, tls && *tls ? tls : "default");
        return;
    }
    const char *tp = getenv("WEFT_TRANSPORTS"), *vn = getenv("WEFT_VIRTUAL_NODES");
    csv_field(v, sizeof v, tp && *tp ? tp : "default");
    if (vn && *vn) {
        char n[32];
        csv_field(n, sizeof n, vn);
        snprintf(buf, len, "%s/vnodes=%s", v, n);
    } else {
        snprintf(buf, len, "%s", v);
    }
}

void perf_report(const struct perf_opts *o, const char *test, size_t bytes,
                 const struct perf_result *res, int n, const char *table_line)
{
    if (o->rank != 0)
        return;
    if (!o->csv) {
        printf("%s\n", table_line);
        fflush(stdout);
        return;
    }
    for (int i = 0; i < n; i++) {
        const struct perf_result *r = &res[i];
        char tp[192], alg[32] = "", bus[32] = "", wrong[32] = "";
        csv_transport(tp, sizeof tp, r->library);
        if (r->algbw >= 0)
            snprintf(alg, sizeof alg, "%.4f", r->algbw);
        if (r->busbw >= 0)
            snprintf(bus, sizeof bus, "%.4f", r->busbw);
        if (r->wrong >= 0)
            snprintf(wrong, sizeof wrong, "%lld", r->wrong);
        printf("%s,%d,%s,%zu,%s,%.3f,%s,%s,%s\n", test, o->size, tp, bytes, r->library, r->time_s * 1e6,
               alg, bus, wrong);
    }
    fflush(stdout);
}

int perf_weft_fail(const struct perf_opts *o, weft_comm_t *c, const char *call, int err)
{
    fprintf(stderr, "weft-perf rank %d: %s failed: %s (%d)%s%s\n", o->rank, call, weft_strerror(err), err,
            c ? ": " : "", c ? weft_comm_last_error(c) : "");
    return 1;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mpirun -np N weft-perf SUBCOMMAND [options]\n"
        "\n"
        "Runs the same operation through weft and through MPI in one job, alternating\n"
        "the two on every repetition, and prints medians side by side.\n"
        "\n"
        "subcommands:\n"
        "  sendrecv   ping-pong latency (half round trip) and streaming bandwidth\n"
        "             (window of -w messages) between pairs of ranks (r, r + np/2);\n"
        "             MPI_Send/Recv and MPI_Isend/Irecv/Waitall as reference\n"
#ifdef WEFT_PERF_HAVE_UCX
        "             (and UCP tag send/recv: a UCX column, transports from UCX_TLS)\n"
#endif
        "  init       weft_comm_create / weft_comm_destroy time vs\n"
        "             MPI_Comm_dup + MPI_Allgather of one rank card / MPI_Comm_free\n"
        "  allgather  weft_allgather vs MPI_Allgather\n"
        "  bcast      weft_bcast vs MPI_Bcast\n"
        "  gather     weft_gather vs MPI_Gather (root -R; size = one rank's block,\n"
        "             algbw = n*size/time, #wrong: the root's result)\n"
        "  scatter    weft_scatter vs MPI_Scatter (root -R; size = one rank's block,\n"
        "             algbw = n*size/time, #wrong: every rank's block)\n"
        "  barrier    weft_barrier vs MPI_Barrier (one row; -n calls a batch, default 1000)\n"
        "  allreduce  weft_allreduce vs MPI_Allreduce (float32 sum)\n"
        "  reduce     weft_reduce vs MPI_Reduce (float32 sum, root -R)\n"
        "  reduce_scatter  weft_reduce_scatter vs MPI_Reduce_scatter_block (float32 sum)\n"
        "  alltoall   weft_alltoall vs MPI_Alltoall\n"
        "             (these four: size = the collective's whole buffer per rank, as\n"
        "             nccl-tests; 8 B .. 64M by default)\n"
        "  alltoallv  weft_alltoallv vs MPI_Alltoallv: the alltoall's layout with uneven\n"
        "             blocks (rank s sends rank d c/2, c or 3c/2 floats by (s+2d) mod 3,\n"
        "             c = size/(4n)); size = n*c*4, the mean send buffer\n"
        "  exchange   every rank sends -n messages (default 10000) to random peers, sizes\n"
        "             random in -b .. -e (default 8 .. 64K), at most -w sends in flight\n"
        "             per rank; every message verified; weft_isend/irecv/waitall vs\n"
        "             MPI_Isend/Irecv/Waitall on the same pattern (seed -s); whole-run\n"
        "             time, median of -r runs (default 5)\n"
        "\n"
        "options:\n"
        "  -b SIZE    smallest size (default 8)\n"
        "  -e SIZE    largest size (sendrecv, allreduce, reduce, reduce_scatter, alltoall(v): 64M;\n"
        "             allgather, bcast, gather, scatter: 16M)\n"
        "  -f N       size factor between steps (default 2)\n"
        "  -r N       repetitions per size; the table shows medians (sendrecv 15, init 10,\n"
        "             exchange 5)\n"
        "  -n N       iterations per repetition (default: scaled down with size);\n"
        "             exchange: messages each rank sends (default 10000)\n"
        "  -W N       untimed iterations at the start of each measurement (default 1)\n"
        "  -w N       sendrecv: messages in flight in the bandwidth test (default 64);\n"
        "             exchange: sends in flight per rank (default 64)\n"
        "  -m SIZE    sendrecv: memory cap of one side's window buffers (default 256M);\n"
        "             the window shrinks for sizes where -w messages would not fit\n"
        "  -o         sendrecv: only ranks 0 and 1 exchange, the others wait\n"
        "  -t lat|bw  sendrecv: only the latency or only the bandwidth table\n"
        "  -c         fill and verify the data of every message; #wrong counts bad bytes\n"
        "             (timings then include the fill/verify work)\n"
        "  -a ALGO    collectives: force an algorithm (sets the mode's WEFT_ALLGATHER_ALGO,\n"
        "             WEFT_ALLREDUCE_ALGO, WEFT_REDUCE_SCATTER_ALGO or WEFT_ALLTOALL_ALGO)\n"
        "  -R RANK    bcast, reduce, gather and scatter root (default 0)\n"
        "  -s SEED    exchange: seed of the message pattern (default 1)\n"
        "  --csv      CSV instead of tables, from rank 0: one header line, then one line\n"
        "             per size and library (subcommand,np,transport,bytes,library,\n"
        "             time_us,algbw_GBps,busbw_GBps,wrong); scripts/plot draws them\n"
        "  -d MEM     buffers in host memory (host, default) or CUDA device memory (cuda):\n"
        "             every mode but init. The CUDA runtime is loaded at run time from\n"
        "             WEFT_CUDA_LIB (as weft does), else libcudart.so; one device per local\n"
        "             rank. MPI gets the device data staged through host buffers unless the\n"
        "             MPI library is CUDA-aware (the header says which)\n"
        "  -h         this help\n"
        "\n"
        "SIZE takes k/m/g suffixes (powers of 1024). weft's transports are chosen with\n"
        "WEFT_TRANSPORTS=..., MPI's with mpirun flags (e.g. --mca btl tcp,self).\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return -1;
    unsigned long long mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: break;
    }
    if ((*end == 'b' || *end == 'B') && end[1] == '\0')
        end++;
    if (*end != '\0' || (v && mult > SIZE_MAX / v))
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int lo, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > 1000000000L)
        return -1;
    *out = (int)v;
    return 0;
}

/* Returns 0 when the options are fine, 1 on a usage error (message printed
 * by rank 0), 2 for -h. */
static int parse_options(int argc, char **argv, struct perf_opts *o)
{
    /* --csv has no one-letter form: the letters are nccl-tests' and taken. */
    enum { OPT_CSV = 1000 };
    static const struct option longopts[] = {
        { "csv", no_argument, NULL, OPT_CSV },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int factor = 2, opt;
    opterr = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "b:e:f:r:n:W:w:m:ot:ca:R:d:s:h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'b': bad = parse_size(optarg, &o->min_bytes); break;
        case 'e': bad = parse_size(optarg, &o->max_bytes) || o->max_bytes == 0; break;
        case 'f': bad = parse_int(optarg, 2, &factor); break;
        case 'r': bad = parse_int(optarg, 1, &o->reps); break;
        case 'n': bad = parse_int(optarg, 1, &o->iters); break;
        case 'W': bad = parse_int(optarg, 0, &o->warmup); break;
        case 'w': bad = parse_int(optarg, 1, &o->window); break;
        case 'm': bad = parse_size(optarg, &o->window_cap) || o->window_cap == 0; break;
        case 'o': o->one_pair = 1; break;
        case 't':
            o->tests = optarg;
            bad = strcmp(optarg, "lat") != 0 && strcmp(optarg, "bw") != 0;
            break;
        case 'c': o->check = 1; break;
        case 'a': o->algo = optarg; break;
        case 'R': bad = parse_int(optarg, 0, &o->root); break;
        case 'd': bad = perf_mem_parse(optarg, &o->device); break;
        case 's': {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 0);
            bad = errno || end == optarg || *end != '\0' || optarg[0] == '-';
            o->seed = (uint64_t)v;
            break;
        }
        case OPT_CSV: o->csv = 1; break;
        case 'h': return 2;
        default:
            if (o->rank == 0) {
                if (optopt)
                    fprintf(stderr, "weft-perf: unknown option or missing value: -%c\n", optopt);
                else
                    fprintf(stderr, "weft-perf: unknown option: %s\n", argv[optind - 1]);
            }
            return 1;
        }
        if (bad) {
            if (o->rank == 0)
                fprintf(stderr, "weft-perf: bad value for -%c: '%s'\n", opt, optarg);
            return 1;
        }
    }
    if (optind != argc) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: unexpected argument '%s'\n", argv[optind]);
        return 1;
    }
    if (o->root >= o->size) {
        if (o->rank == 0)
            fprintf(stderr, "weft-perf: -R %d: root must be below np (%d)\n", o->root, o->size);
        return 1;
    }
    o->factor = (size_t)factor;
    return 0;
}

/* Distinct hosts: one leader per MPI_COMM_TYPE_SHARED group. */
static int count_nodes(void)
{
    MPI_Comm local;
    int local_rank = 0, leaders = 0, one;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    one = local_rank == 0;
    MPI_Allreduce(&one, &leaders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_free(&local);
    return leaders;
}

typedef int (*perf_fn)(const struct perf_opts *, weft_comm_t *);

/* algo_env: what -a sets (in the configuration of every weft comm made). */
static const struct { const char *name; perf_fn fn; int needs_comm; const char *algo_env; } subcommands[] = {
    { "sendrecv",       perf_sendrecv,       1, "WEFT_ALLGATHER_ALGO" },
    { "init",           perf_init,           0, "WEFT_ALLGATHER_ALGO" },   /* creates and destroys its own comms */
    { "allgather",      perf_allgather,      1, "WEFT_ALLGATHER_ALGO" },
    { "bcast",          perf_bcast,          1, "WEFT_ALLGATHER_ALGO" },
    { "gather",         perf_gather,         1, "WEFT_ALLGATHER_ALGO" },   /* no algorithm to choose */
    { "scatter",        perf_scatter,        1, "WEFT_ALLGATHER_ALGO" },   /* no algorithm to choose */
    { "barrier",        perf_barrier,        1, "WEFT_ALLGATHER_ALGO" },
    { "allreduce",      perf_allreduce,      1, "WEFT_ALLREDUCE_ALGO" },
    { "reduce",         perf_reduce,         1, "WEFT_REDUCE_ALGO" },
    { "reduce_scatter", perf_reduce_scatter, 1, "WEFT_REDUCE_SCATTER_ALGO" },
    { "alltoall",       perf_alltoall,       1, "WEFT_ALLTOALL_ALGO" },
    { "alltoallv",      perf_alltoallv,      1, "WEFT_ALLTOALL_ALGO" },   /* pairwise only: -a is not read */
    { "exchange",       perf_exchange,       1, "WEFT_ALLGATHER_ALGO" },
};

int main(int argc, char **argv)
{
    struct perf_opts o;
    memset(&o, 0, sizeof o);
    o.factor = 2;
    o.warmup = 1;
    o.window = 64;
    o.window_cap = (size_t)256 << 20;
    o.seed = 1;
    o.argc = argc;
    o.argv = argv;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &o.size);

    perf_fn fn = NULL;
    int needs_comm = 0, rc = 1;
    const char *algo_env = NULL;
    const char *cmd = argc > 1 ? argv[1] : NULL;
    if (cmd && (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0)) {
        if (o.rank == 0)
            usage(stdout);
        MPI_Finalize();
        return 0;
    }
    for (size_t i = 0; cmd && i < sizeof subcommands / sizeof subcommands[0]; i++) {
        if (strcmp(cmd, subcommands[i].name) == 0) {
            fn = subcommands[i].fn;
            needs_comm = subcommands[i].needs_comm;
            algo_env = subcommands[i].algo_env;
        }
    }
    if (!fn) {
        if (o.rank == 0) {
            if (cmd)
                fprintf(stderr, "weft-perf: unknown subcommand '%s'\n\n", cmd);
            usage(stderr);
        }
        MPI_Finalize();
        return 1;
    }
    int prc = parse_options(argc - 1, argv + 1, &o);
    if (prc) {
        if (o.rank == 0)
            usage(prc == 2 ? stdout : stderr);
        MPI_Finalize();
        return prc == 2 ? 0 : 1;
    }
    /* -a: the algorithm's setting in every comm's configuration (a bad
     * name is refused by weft_comm_create_config, naming it). */
    weft_setting_t algo_setting = { algo_env, o.algo };
    weft_config_t config = WEFT_CONFIG_INITIALIZER;
    if (o.algo) {
        config.settings = &algo_setting;
        config.nsettings = 1;
    }
    o.config = &config;
    o.nodes = count_nodes();
    MPI_Comm_dup(MPI_COMM_WORLD, &o.mpi);
    /* Before weft_comm_create: each rank's device is current when weft looks. */
    if (perf_mem_init(&o) != 0) {
        MPI_Finalize();
        return 1;
    }

    weft_comm_t *comm = NULL;
    if (needs_comm) {
        int err = weft_comm_create_config(MPI_COMM_WORLD, o.config, &comm);
        if (err != WEFT_SUCCESS) {
            perf_weft_fail(&o, NULL, "weft_comm_create_config", err);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    rc = fn(&o, comm);
    if (rc != 0) {
        /* The other ranks may be blocked on this one: end the whole job. */
        fprintf(stderr, "weft-perf rank %d: %s failed, aborting the job\n", o.rank, cmd);
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    if (comm) {
        int err = weft_comm_destroy(comm);
        if (err != WEFT_SUCCESS) {
            perf_weft_fail(&o, NULL, "weft_comm_destroy", err);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    perf_mem_fini(&o);
    MPI_Comm_free(&o.mpi);
    MPI_Finalize();
    return 0;
}
