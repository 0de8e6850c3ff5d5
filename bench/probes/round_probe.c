/*
 * round_probe: the floor of one node-local shared-memory round for N
 * processes on this machine -- what no library's barrier or small
 * allreduce on one node can go below. N processes (fork, not pinned, as
 * `mpirun --bind-to none` starts them) share one page of counters, one
 * cache line each, no MPI, no weft:
 *
 *   round  every process stores its counter = k (release), then waits
 *          until every other counter is >= k (acquire): a barrier of one
 *          round -- what weft's node-local segment does for a barrier and,
 *          with 8 more bytes in the line, for an allreduce of <= 1 KiB.
 *
 * A waiter polls with a pause while the processes fit the cores, and with
 * sched_yield() after every poll when there are more processes than cores
 * (the rule of weft's src/core/backoff.h and of Open MPI's yield_when_idle:
 * spinning would only steal the time slice of the process it waits for).
 * Two other policies, to show what they cost:
 *
 *   --spin   the pause everywhere (no yield);
 *   --futex  a waiter sleeps in the kernel (FUTEX_WAIT on a round counter)
 *            and the last to arrive wakes them all (a central counter, not
 *            a line each: the cheapest way to sleep through a round).
 *
 * One line per launch: N, the policy, and the median over 9 batches of the
 * time of one round in microseconds. Compare with a library's barrier at
 * the same N (weft-perf barrier): a target below the floor is out of reach
 * on this machine (docs/benchmarks.md, "The floor of one round").
 * Standalone (not built by CMake):
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE bench/probes/round_probe.c -o round_probe
 *   for n in 2 4 8; do for i in 1 2 3; do ./round_probe $n; done; done
 */
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN    64
#define BATCHES 9

struct line { _Alignas(64) _Atomic uint64_t v; char pad[56]; };

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Rounds first+1 .. first+count as process me of n. */
static void rounds(struct line *c, int n, int me, uint64_t first, long count, int yield)
{
    for (uint64_t k = first + 1; k <= first + (uint64_t)count; k++) {
        atomic_store_explicit(&c[me].v, k, memory_order_release);
        for (int r = 0; r < n; r++)
            while (atomic_load_explicit(&c[r].v, memory_order_acquire) < k) {
                if (yield)
                    sched_yield();
                else
                    relax();
            }
    }
}

/* --futex: c[0] counts arrivals, c[1] numbers the rounds (the futex). */
static void rounds_futex(struct line *c, int n, long count)
{
    _Atomic uint32_t *arrived = (_Atomic uint32_t *)&c[0].v, *round = (_Atomic uint32_t *)&c[1].v;
    for (long k = 0; k < count; k++) {
        uint32_t g = atomic_load_explicit(round, memory_order_acquire);
        if (atomic_fetch_add_explicit(arrived, 1, memory_order_acq_rel) + 1 == (uint32_t)n) {
            atomic_store_explicit(arrived, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(round, 1, memory_order_release);
            syscall(SYS_futex, round, FUTEX_WAKE, n, NULL, NULL, 0);
            continue;
        }
        while (atomic_load_explicit(round, memory_order_acquire) == g)
            syscall(SYS_futex, round, FUTEX_WAIT, g, NULL, NULL, 0);
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    int force_spin = argc > 2 && strcmp(argv[2], "--spin") == 0, futex = argc > 2 && strcmp(argv[2], "--futex") == 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 2 || n > MAXN || (argc > 2 && !force_spin && !futex)) {
        fprintf(stderr, "usage: round_probe N [--spin | --futex]   (2 <= N <= %d)\n", MAXN);
        return 2;
    }
    int yield = !force_spin && !futex && n > cores;
    /* Fewer rounds a batch when each must wait for the scheduler (and far
     * fewer when spinning on more processes than cores: a round then takes
     * up to a time slice). */
    long per_batch = yield || futex ? 2000 * 8 / n : n > cores ? 20 : 100000;
    struct line *c = mmap(NULL, MAXN * sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(c, 0, MAXN * sizeof *c);
    pid_t kids[MAXN];
    for (int r = 1; r < n; r++) {
        kids[r] = fork();
        if (kids[r] == 0) {
            if (futex)
                rounds_futex(c, n, per_batch * (BATCHES + 1));
            else
                rounds(c, n, r, 0, per_batch * (BATCHES + 1), yield);
            _exit(0);
        }
    }
    double t[BATCHES];
    for (int b = -1; b < BATCHES; b++) {   /* b = -1: warm-up batch */
        double t0 = now_us();
        if (futex)
            rounds_futex(c, n, per_batch);
        else
            rounds(c, n, 0, (uint64_t)per_batch * (uint64_t)(b + 1), per_batch, yield);
        if (b >= 0)
            t[b] = (now_us() - t0) / (double)per_batch;
    }
    for (int r = 1; r < n; r++)
        waitpid(kids[r], NULL, 0);
    qsort(t, BATCHES, sizeof t[0], cmp);
    printf("round_probe: %d processes on %ld cores, %s: one round %.3f us (median of %d batches of %ld; "
           "min %.3f, max %.3f)\n",
           n, cores, futex ? "futex sleep" : yield ? "yield after each poll" : "spin", t[BATCHES / 2], BATCHES,
           per_batch, t[0],
           t[BATCHES - 1]);
    return 0;
}
