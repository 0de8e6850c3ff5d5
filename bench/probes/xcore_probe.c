/*
 * xcore_probe: how fast does this machine move freshly written memory from
 * one core to another, right now? Two processes, pinned to CPUs 0 and 1:
 *
 *   ring  the producer copies 16 KiB from its own buffer into a slot of a
 *         shared ring of 64 slots and publishes a counter; the consumer
 *         copies the slot out into its own buffer and publishes its counter
 *         (weft's shm push, TCP loopback and every eager protocol do this:
 *         two copies, each line written on one core and read on the other);
 *         also the producer's copies alone ("writer"), and the same ring
 *         with the producer's copies streamed (non-temporal stores, as
 *         src/core/shmput.c's: the consumer then reads memory);
 *   tcp   a 1 MiB ping-pong over a loopback TCP socket, polled (non-blocking
 *         calls in a loop, as MPI libraries do), half round trip.
 *
 * One line per launch: ring GB/s (writer's copies, streamed ring) and tcp
 * microseconds. On the 2-core reference VM plain ring and tcp move
 * together from launch to launch, by about 5x, the streamed ring much less
 * (docs/benchmarks.md, "TCP: the bimodal 1 MiB" and "Shared memory:
 * streams below 256 KiB") -- the machine, not a library: no MPI, no weft.
 * Standalone (not built by CMake):
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE bench/probes/xcore_probe.c -o xcore_probe
 *   for i in $(seq 20); do ./xcore_probe; done
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define SLOT (16 << 10)
#define NSLOT 64
#define RING_ITERS 100000L
#define TCP_BYTES (1 << 20)
#define TCP_ITERS 200

struct ring {
    _Alignas(64) _Atomic long prod;
    _Alignas(64) _Atomic long cons;
    _Alignas(64) char data[NSLOT][SLOT];
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    (void)sched_setaffinity(0, sizeof(s), &s);
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void xfer(int fd, char *b, size_t n, int out)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = out ? send(fd, b + off, n - off, MSG_DONTWAIT) : recv(fd, b + off, n - off, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            continue;   /* polled, as MPI libraries do: no sleep, no wake-up */
        if (r <= 0) {
            perror("xcore_probe: tcp");
            exit(1);
        }
        off += (size_t)r;
    }
}

/* A copy with streaming stores (64-byte aligned dst and length here). */
static void copy_streamed(char *dst, const char *src, size_t n)
{
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += 16)
        _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
    _mm_sfence();
#else
    memcpy(dst, src, n);
#endif
}

/* GB/s of the producer -> consumer ring, measured by the producer; in
 * *writer the GB/s of the producer's copies alone. */
static double ring_probe(int streamed, double *writer)
{
    struct ring *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *buf = aligned_alloc(4096, SLOT);
    if (r == MAP_FAILED || buf == NULL)
        return 0;
    memset(r, 0, sizeof(*r));
    memset(buf, 3, SLOT);
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        for (long i = 0; i < RING_ITERS; i++) {
            while (atomic_load_explicit(&r->prod, memory_order_acquire) <= i)
                ;
            memcpy(buf, r->data[i % NSLOT], SLOT);
            atomic_store_explicit(&r->cons, i + 1, memory_order_release);
        }
        _exit(0);
    }
    pin(0);
    double t0 = now(), tw = 0;
    for (long i = 0; i < RING_ITERS; i++) {
        while (i - atomic_load_explicit(&r->cons, memory_order_acquire) >= NSLOT)
            ;
        double c0 = now();
        if (streamed)
            copy_streamed(r->data[i % NSLOT], buf, SLOT);
        else
            memcpy(r->data[i % NSLOT], buf, SLOT);
        tw += now() - c0;
        atomic_store_explicit(&r->prod, i + 1, memory_order_release);
    }
    while (atomic_load_explicit(&r->cons, memory_order_acquire) < RING_ITERS)
        ;
    double t = now() - t0;
    waitpid(pid, NULL, 0);
    munmap(r, sizeof(*r));
    free(buf);
    *writer = (double)SLOT * RING_ITERS / tw / 1e9;
    return (double)SLOT * RING_ITERS / t / 1e9;
}

/* Median half round trip (us) of a 1 MiB loopback TCP ping-pong. */
static double tcp_probe(void)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0)
        return 0;
    char *buf = aligned_alloc(4096, TCP_BYTES);
    if (buf == NULL)
        return 0;
    memset(buf, 1, TCP_BYTES);
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
            _exit(1);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        for (int i = 0; i < TCP_ITERS; i++) {
            xfer(fd, buf, TCP_BYTES, 0);
            xfer(fd, buf, TCP_BYTES, 1);
        }
        _exit(0);
    }
    pin(0);
    int fd = accept(ls, NULL, NULL);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    double t[TCP_ITERS];
    for (int i = 0; i < TCP_ITERS; i++) {
        double s = now();
        xfer(fd, buf, TCP_BYTES, 1);
        xfer(fd, buf, TCP_BYTES, 0);
        t[i] = (now() - s) / 2 * 1e6;
    }
    waitpid(pid, NULL, 0);
    close(fd);
    close(ls);
    free(buf);
    qsort(t, TCP_ITERS, sizeof(t[0]), cmp);
    return t[TCP_ITERS / 2];
}

int main(void)
{
    double w, ws;
    double ring = ring_probe(0, &w);
    double ring_s = ring_probe(1, &ws);
    double tcp = tcp_probe();
    printf("ring %.1f GB/s (writer's copies %.1f)  streamed %.1f GB/s  tcp 1MiB %.0f us\n", ring, w, ring_s, tcp);
    return 0;
}
