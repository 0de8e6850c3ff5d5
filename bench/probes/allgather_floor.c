/*
 * allgather_floor: the fewest bytes an allgather on one node must copy,
 * copied with no library around them -- the floor under weft's and Open
 * MPI's allgather (and the allreduce's allgather half) at large blocks.
 *
 * N processes (fork, not pinned, like `mpirun --bind-to none`); each owns a
 * send block of B bytes and a receive buffer of N x B. A round: every
 * process copies its own block into its slot (memcpy) and pulls each
 * other process's block straight from that process's send buffer with one
 * process_vm_readv (CMA: one copy per byte, what weft's rendezvous pull and
 * Open MPI's vader single-copy do), then all meet at a flag barrier. So
 * every byte of every receive buffer is written once -- N x N x B bytes a
 * round, on min(N, cores) cores -- and nothing else happens: no matching,
 * no handshake, no flow control. Buffers are reused round after round, as
 * in weft-perf's loops. Prints, per size, the median over batches of the
 * time of one round (us) and its algbw (N x B / time, GB/s, as weft-perf's
 * allgather rows: bytes of the receive buffer).
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE bench/probes/allgather_floor.c -o /tmp/allgather_floor
 *   /tmp/allgather_floor N [first_block [last_block]]     (blocks in bytes, x4 steps;
 *                                                          default 64 KiB .. 16 MiB)
 *
 * Not built by CMake (a probe of the machine, like round_probe.c). Needs
 * CMA between the processes: Yama ptrace_scope 0 or 1 (children of one
 * parent may read each other under 1 only with PR_SET_PTRACER, set here).
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN    16
#define BATCHES 7

struct line { _Alignas(64) _Atomic uint64_t v; char pad[56]; };
struct shared {
    struct line arrive[MAXN];     /* rounds each process finished */
    uint64_t    src[MAXN];        /* each process's send buffer, in its own address space */
    pid_t       pid[MAXN];
    struct line ready;            /* processes that published src */
    struct line fail;             /* a copy failed */
};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Waits until every process finished round k (yielding: more processes than cores is the normal case here). */
static void meet(struct shared *s, int n, int me, uint64_t k)
{
    atomic_store_explicit(&s->arrive[me].v, k, memory_order_release);
    for (int r = 0; r < n; r++)
        while (atomic_load_explicit(&s->arrive[r].v, memory_order_acquire) < k)
            sched_yield();
}

/* Rounds first+1 .. first+count of process me: its own block by memcpy, the others' by CMA. */
static int rounds(struct shared *s, int n, int me, const char *src, char *dst, size_t b, uint64_t first, long count)
{
    for (uint64_t k = first + 1; k <= first + (uint64_t)count; k++) {
        memcpy(dst + (size_t)me * b, src, b);
        for (int i = 1; i < n; i++) {
            int r = (me + i) % n;   /* everyone starts with a different peer, as a ring would */
            struct iovec l = { dst + (size_t)r * b, b }, rem = { (void *)(uintptr_t)s->src[r], b };
            if (process_vm_readv(s->pid[r], &l, 1, &rem, 1, 0) != (ssize_t)b) {
                atomic_store(&s->fail.v, 1);
                perror("process_vm_readv");
                return -1;
            }
        }
        meet(s, n, me, k);
    }
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    size_t first = argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)64 << 10;
    size_t last = argc > 3 ? strtoull(argv[3], NULL, 0) : (size_t)16 << 20;
    if (n < 2 || n > MAXN || first == 0 || last < first) {
        fprintf(stderr, "usage: allgather_floor N [first_block [last_block]]   (2 <= N <= %d)\n", MAXN);
        return 2;
    }
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    printf("# allgather_floor: %d processes, %ld cores; one round = every receive buffer filled once "
           "(own block memcpy, the others' by process_vm_readv); median of %d batches\n",
           n, sysconf(_SC_NPROCESSORS_ONLN), BATCHES);
    printf("# %10s %12s %12s %10s\n", "block", "recv bytes", "round (us)", "algbw GB/s");
    for (size_t b = first; b <= last; b *= 4) {
        struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset(s, 0, sizeof *s);
        /* about 2 ms of copying a batch, at least 4 rounds */
        long per_batch = (long)((2e-3 * 5e9) / ((double)n * n * b / 2));
        if (per_batch < 4)
            per_batch = 4;
        pid_t kids[MAXN];
        double t[BATCHES];
        int me = 0;
        for (int r = 1; r < n; r++) {
            kids[r] = fork();
            if (kids[r] == 0) {
                me = r;
                break;
            }
        }
        char *src = malloc(b), *dst = malloc((size_t)n * b);
        if (!src || !dst) {
            perror("malloc");
            _exit(1);
        }
        memset(src, me + 1, b);
        memset(dst, 0, (size_t)n * b);
        s->src[me] = (uint64_t)(uintptr_t)src;
        s->pid[me] = getpid();
        atomic_fetch_add(&s->ready.v, 1);
        while (atomic_load(&s->ready.v) < (uint64_t)n)
            sched_yield();
        if (me != 0) {
            int rc = rounds(s, n, me, src, dst, b, 0, per_batch * (BATCHES + 1));
            /* the data: every slot holds its owner's byte */
            for (int r = 0; r < n && rc == 0; r++)
                if (dst[(size_t)r * b] != r + 1 || dst[(size_t)r * b + b - 1] != r + 1)
                    rc = -1;
            _exit(rc == 0 ? 0 : 1);
        }
        int bad = 0;
        for (int k = -1; k < BATCHES && !bad; k++) {   /* k = -1: warm-up batch */
            double t0 = now_us();
            bad = rounds(s, n, 0, src, dst, b, (uint64_t)per_batch * (uint64_t)(k + 1), per_batch) != 0;
            if (k >= 0)
                t[k] = (now_us() - t0) / per_batch;
        }
        for (int r = 1; r < n; r++) {
            int st = 0;
            waitpid(kids[r], &st, 0);
            bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        if (bad || atomic_load(&s->fail.v)) {
            fprintf(stderr, "allgather_floor: a copy failed or a block arrived wrong (block %zu)\n", b);
            return 1;
        }
        qsort(t, BATCHES, sizeof t[0], cmp);
        double med = t[BATCHES / 2];
        printf("  %10zu %12zu %12.1f %10.2f\n", b, (size_t)n * b, med, (double)n * b / med / 1e3);
        free(src);
        free(dst);
        munmap(s, sizeof *s);
    }
    return 0;
}
