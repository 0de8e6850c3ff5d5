/*
 * flag_probe: the floor of a shared-memory half round trip on this machine
 * -- what no library can go below. Two processes, pinned to CPUs 0 and 1,
 * ping-pong through memory they share, no MPI, no weft:
 *
 *   flag  one cache line each way holding only a counter: the other side
 *         spins until it sees the new value, then answers on its own line;
 *   slot  the same with an 8-byte message in one line and the counter
 *         that publishes it in another (release store after the payload,
 *         acquire load before reading it): the two lines a ring-based
 *         eager protocol (weft's shm, vader) moves per small message.
 *
 * One line per launch: half round trip of each, in nanoseconds (median of
 * 9 batches of 100000 round trips). The library's own 8-byte half round
 * trip less this is its software path (docs/benchmarks.md, "A comm used by
 * one thread at a time"). Standalone (not built by CMake):
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE bench/probes/flag_probe.c -o flag_probe
 *   for i in $(seq 10); do ./flag_probe; done
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS  100000
#define BATCHES 9

struct line { _Alignas(64) _Atomic uint64_t v; char pad[56]; };
struct shared {
    struct line ping, pong;           /* flag: counters; slot: the counters that publish */
    struct line ping_msg, pong_msg;   /* slot: the 8-byte messages */
};

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0)
        perror("sched_setaffinity (continuing unpinned)");
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* The answering side: total round trips of both modes, then exits. */
static void answer(struct shared *s, long total, int slot_from)
{
    for (long i = 1; i <= total; i++) {
        while (atomic_load_explicit(&s->ping.v, memory_order_acquire) != (uint64_t)i) {}
        if (i > slot_from) {
            uint64_t m = atomic_load_explicit(&s->ping_msg.v, memory_order_relaxed);
            atomic_store_explicit(&s->pong_msg.v, m + 1, memory_order_relaxed);
        }
        atomic_store_explicit(&s->pong.v, (uint64_t)i, memory_order_release);
    }
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(s, 0, sizeof *s);
    const long per_mode = (long)ROUNDS * BATCHES;
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        answer(s, 2 * per_mode, per_mode);
        _exit(0);
    }
    pin(0);
    double half[2][BATCHES];
    uint64_t i = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int b = 0; b < BATCHES; b++) {
            double t0 = now_ns();
            for (int k = 0; k < ROUNDS; k++) {
                i++;
                if (mode == 1)
                    atomic_store_explicit(&s->ping_msg.v, i, memory_order_relaxed);
                atomic_store_explicit(&s->ping.v, i, memory_order_release);
                while (atomic_load_explicit(&s->pong.v, memory_order_acquire) != i) {}
                if (mode == 1 && atomic_load_explicit(&s->pong_msg.v, memory_order_relaxed) != i + 1) {
                    fprintf(stderr, "flag_probe: wrong message\n");
                    return 1;
                }
            }
            half[mode][b] = (now_ns() - t0) / ROUNDS / 2;
        }
    waitpid(pid, NULL, 0);
    qsort(half[0], BATCHES, sizeof(double), cmp);
    qsort(half[1], BATCHES, sizeof(double), cmp);
    printf("flag %.0f ns  slot %.0f ns  (half round trip, CPUs 0 and 1)\n", half[0][BATCHES / 2],
           half[1][BATCHES / 2]);
    return 0;
}
