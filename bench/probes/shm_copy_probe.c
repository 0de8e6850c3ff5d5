/*
 * shm_copy_probe: how fast do two processes on one node move a buffer
 * (a) with one copy by process_vm_readv (CMA: receiver reads the sender's
 *     buffer) and (b) with a pipelined copy through a shared ring of bounce
 *     chunks (sender copies chunk k+1 in while the receiver copies chunk k
 *     out), for the sizes, chunk sizes and ring sizes the shm transport may
 *     use. Standalone (no MPI, not built by CMake):
 *
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Ip2p/transport/shm bench/probes/shm_copy_probe.c p2p/transport/shm/shm_ring.c -o shm_copy_probe
 *   ./shm_copy_probe [reps] [cold]
 *
 * Each transfer is timed at the receiver from "sender announces" to "last
 * byte in the receiver's buffer", like a rendezvous; buffers are reused
 * across repetitions as an application's would be. Prints median GB/s.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm_ring.h"

struct control {
    _Alignas(64) _Atomic uint64_t go;      /* sender: transfer number announced */
    _Alignas(64) _Atomic uint64_t done;    /* receiver: transfer number received */
    _Alignas(64) _Atomic int mode;         /* 0 = CMA, 1 = bounce, 2 = quit */
    _Atomic size_t bytes, chunk;
    _Atomic uint64_t src_addr;
    _Atomic int sender_pid;
    _Atomic size_t area;                   /* bytes of each side's buffer area */
    _Atomic int receiver_pid;
    _Atomic uint64_t dst_addr;             /* split mode: receiver's buffer of this transfer */
    _Alignas(64) _Atomic size_t claimed;   /* split mode: bytes handed out to a copier */
    _Alignas(64) _Atomic size_t copied;    /* split mode: bytes in place */
};

/* Split mode: sender and receiver both copy with CMA, each claiming the
 * next piece from a shared counter (the receiver reads, the sender writes),
 * so two cores copy at once and a descheduled side is simply outrun. */
static void split_copy(struct control *ctl, int is_sender, pid_t other, char *mine, uint64_t theirs,
                       size_t bytes, size_t piece)
{
    for (;;) {
        size_t off = atomic_fetch_add(&ctl->claimed, piece);
        if (off >= bytes)
            return;
        size_t len = bytes - off < piece ? bytes - off : piece;
        struct iovec l = { mine + off, len }, r = { (void *)(uintptr_t)(theirs + off), len };
        ssize_t got = is_sender ? process_vm_writev(other, &l, 1, &r, 1, 0)
                                : process_vm_readv(other, &l, 1, &r, 1, 0);
        if (got != (ssize_t)len) {
            perror(is_sender ? "process_vm_writev" : "process_vm_readv");
            exit(1);
        }
        atomic_fetch_add(&ctl->copied, len);
    }
}

/* Where transfer n starts in a side's area: with an area larger than the
 * caches, consecutive transfers touch cold memory, like a window of many
 * distinct messages; with area == bytes, the same buffer is reused. */
static size_t slot_offset(uint64_t n, size_t bytes, size_t area)
{
    size_t slots = area / bytes;
    return (size_t)(n % (slots ? slots : 1)) * bytes;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Spins on a counter; yields now and then so an oversubscribed machine
 * still makes progress. */
static void wait_for(_Atomic uint64_t *v, uint64_t want)
{
    unsigned spins = 0;
    while (atomic_load_explicit(v, memory_order_acquire) < want)
        if (++spins % 1024 == 0)
            sched_yield();
}

struct data_hdr { uint64_t offset, len; };

static void sender(struct control *ctl, struct shm_ring *ring, char *src, size_t max_bytes)
{
    atomic_store(&ctl->src_addr, (uint64_t)(uintptr_t)src);
    atomic_store(&ctl->sender_pid, getpid());
    uint64_t n = 0;
    for (;;) {
        /* the receiver announces round n by setting done to n + 1; the sender answers with go */
        wait_for(&ctl->done, n + 1);
        int mode = atomic_load(&ctl->mode);
        if (mode == 2)
            return;
        size_t bytes = atomic_load(&ctl->bytes), chunk = atomic_load(&ctl->chunk);
        if (bytes > max_bytes)
            bytes = max_bytes;
        const char *from = src + slot_offset(n, bytes, atomic_load(&ctl->area));
        atomic_store_explicit(&ctl->go, n + 1, memory_order_release);
        if (mode == 3)
            split_copy(ctl, 1, atomic_load(&ctl->receiver_pid), (char *)from, atomic_load(&ctl->dst_addr), bytes,
                       chunk);
        if (mode == 1) {
            size_t off = 0;
            unsigned spins = 0;
            while (off < bytes) {
                size_t len = bytes - off < chunk ? bytes - off : chunk;
                struct data_hdr *d = shm_ring_reserve(ring, sizeof(*d) + len);
                if (!d) {
                    if (++spins % 1024 == 0)
                        sched_yield();
                    continue;
                }
                d->offset = off;
                d->len = len;
                memcpy(d + 1, from + off, len);
                shm_ring_commit(ring, sizeof(*d) + len);
                off += len;
            }
        }
        n++;
    }
}

/* One transfer, timed at the receiver. */
static double receive_one(struct control *ctl, struct shm_ring *ring, char *dst, uint64_t n, int mode,
                          size_t bytes)
{
    dst += slot_offset(n, bytes, atomic_load(&ctl->area));
    size_t src_off = slot_offset(n, bytes, atomic_load(&ctl->area));
    if (mode == 3) {
        atomic_store(&ctl->dst_addr, (uint64_t)(uintptr_t)dst);
        atomic_store(&ctl->claimed, 0);
        atomic_store(&ctl->copied, 0);
    }
    double t0 = now();
    atomic_store_explicit(&ctl->done, n + 1, memory_order_release);   /* "ready for transfer n" */
    wait_for(&ctl->go, n + 1);
    if (mode == 3) {
        split_copy(ctl, 0, atomic_load(&ctl->sender_pid), dst, atomic_load(&ctl->src_addr) + src_off, bytes,
                   atomic_load(&ctl->chunk));
        unsigned spins = 0;
        while (atomic_load_explicit(&ctl->copied, memory_order_acquire) < bytes)
            if (++spins % 1024 == 0)
                sched_yield();
    } else if (mode == 0) {
        size_t off = 0;
        pid_t pid = atomic_load(&ctl->sender_pid);
        uint64_t src = atomic_load(&ctl->src_addr) + src_off;
        while (off < bytes) {
            struct iovec l = { dst + off, bytes - off }, r = { (void *)(uintptr_t)(src + off), bytes - off };
            ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
            if (got <= 0) {
                perror("process_vm_readv");
                exit(1);
            }
            off += (size_t)got;
        }
    } else {
        size_t got = 0, len;
        unsigned spins = 0;
        while (got < bytes) {
            const struct data_hdr *d = shm_ring_peek(ring, &len);
            if (!d) {
                if (++spins % 1024 == 0)
                    sched_yield();
                continue;
            }
            memcpy(dst + d->offset, d + 1, d->len);
            got += d->len;
            shm_ring_release(ring);
        }
    }
    return now() - t0;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 15;
    int cold = argc > 2 && strcmp(argv[2], "cold") == 0;
    const size_t max_bytes = cold ? 512u << 20 : 64u << 20;
    const size_t max_ring = 16u << 20;
    struct control *ctl = mmap(NULL, sizeof(*ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    void *ring_mem = mmap(NULL, shm_ring_footprint(max_ring), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (ctl == MAP_FAILED || ring_mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(ctl, 0, sizeof(*ctl));
    atomic_store(&ctl->area, cold ? max_bytes : 0);
    /* the ring is rebuilt per configuration; the sender attaches to the same memory */
    struct shm_ring *ring = shm_ring_init(ring_mem, 1u << 20);

    /* Buffers are allocated and touched after fork, each by its owner, so
     * no copy-on-write fault lands inside a timed copy. */
    pid_t child = fork();
    if (child == 0) {
        char *src = malloc(max_bytes);
        memset(src, 1, max_bytes);
        sender(ctl, (struct shm_ring *)ring_mem, src, max_bytes);
        _exit(0);
    }
    char *dst = malloc(max_bytes);
    memset(dst, 2, max_bytes);
    atomic_store(&ctl->receiver_pid, getpid());
    wait_for((_Atomic uint64_t *)&ctl->src_addr, 1);
    while (atomic_load(&ctl->sender_pid) == 0)
        sched_yield();

    const size_t sizes[] = { 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20 };
    struct { size_t chunk, ring; } cfgs[] = {
        { 32u << 10, 512u << 10 }, { 64u << 10, 512u << 10 }, { 64u << 10, 1u << 20 },
        { 64u << 10, 2u << 20 }, { 128u << 10, 1u << 20 },
        { 256u << 10, 2u << 20 }, { 256u << 10, 4u << 20 }, { 512u << 10, 4u << 20 },
        { 1u << 20, 4u << 20 }, { 1u << 20, 8u << 20 },
        /* ring 0: split CMA with that piece size */
        { 256u << 10, 0 }, { 1u << 20, 0 },
    };
    const int ncfg = (int)(sizeof(cfgs) / sizeof(cfgs[0]));
    double *t = malloc(sizeof(double) * (size_t)reps);
    uint64_t n = 0;

    /* Two tables: the median, and the best transfer (on a machine shared
     * with other work the best one shows the mechanism without preemption). */
    const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
    double *med = calloc(nsizes * (size_t)(ncfg + 1), sizeof(double));
    double *best = calloc(nsizes * (size_t)(ncfg + 1), sizeof(double));
    for (size_t s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int r = bytes >= (16u << 20) ? (reps + 2) / 3 : reps;
        for (int k = -1; k < ncfg; k++) {
            int mode = k < 0 ? 0 : cfgs[k].ring ? 1 : 3;
            if (mode == 3)
                atomic_store(&ctl->chunk, cfgs[k].chunk);
            if (mode == 1) {
                shm_ring_init(ring_mem, cfgs[k].ring);
                atomic_store(&ctl->chunk, cfgs[k].chunk);
            }
            atomic_store(&ctl->mode, mode);
            atomic_store(&ctl->bytes, bytes);
            receive_one(ctl, ring, dst, n++, mode, bytes);  /* warm-up */
            for (int i = 0; i < r; i++)
                t[i] = receive_one(ctl, ring, dst, n++, mode, bytes);
            qsort(t, (size_t)r, sizeof(double), cmp_double);
            med[s * (size_t)(ncfg + 1) + (size_t)(k + 1)] = (double)bytes / t[r / 2] * 1e-9;
            best[s * (size_t)(ncfg + 1) + (size_t)(k + 1)] = (double)bytes / t[0] * 1e-9;
        }
    }
    for (int table = 0; table < 2; table++) {
        printf("# %s GB/s over %d transfers (receiver-timed, %s)\n", table ? "best" : "median", reps,
               cold ? "each transfer on cold buffers in a 512 MiB area" : "buffers reused");
        printf("%10s %8s", "size", "CMA");
        for (int k = 0; k < ncfg; k++) {
            char h[48];
            if (cfgs[k].ring)
                snprintf(h, sizeof(h), "b%zuK/r%zuK", cfgs[k].chunk >> 10, cfgs[k].ring >> 10);
            else
                snprintf(h, sizeof(h), "split%zuK", cfgs[k].chunk >> 10);
            printf(" %12s", h);
        }
        printf("\n");
        for (size_t s = 0; s < nsizes; s++) {
            printf("%9zuK", sizes[s] >> 10);
            for (int k = 0; k <= ncfg; k++)
                printf(k == 0 ? " %8.2f" : " %12.2f", (table ? best : med)[s * (size_t)(ncfg + 1) + (size_t)k]);
            printf("\n");
        }
    }
    atomic_store(&ctl->mode, 2);
    atomic_store(&ctl->done, n + 1);
    waitpid(child, NULL, 0);
    return 0;
}
