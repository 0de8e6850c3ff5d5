/*
 * stream_reduce_probe: the best a reduce of two processes streamed through
 * shared memory can do on this machine, beside Open MPI's MPI_Reduce in the
 * same job -- the question behind issue 29's "reduce at np 2 from 64 KiB".
 *
 * weft's reduce of two ranks above 32 KiB goes as one message: the root
 * pulls the other's vector (CMA, the sender helping) and then reduces it,
 * the two steps one after the other (1.2-1.3x Open MPI's time). Streamed,
 * they would overlap on the two cores:
 *
 *   contributor:  copy 0 | copy 1 | copy 2 | ...      (into a ring of pieces)
 *   root:                 | red 0  | red 1  | red 2 |  (sendbuf op ring -> recvbuf)
 *
 * Here with nothing else in the way: one shared ring of K pieces, a
 * produced and a consumed counter (a cache line each), both sides
 * busy-polling with a pause, memcpy in and a plain vectorised float loop
 * out. Rounds alternate the ring and MPI_Reduce (float32 sum, root 0); each
 * prints the slowest rank's time per call. Standalone (not built by CMake):
 *
 *   mpicc -O3 -march=native bench/probes/stream_reduce_probe.c -o stream_reduce_probe
 *   mpirun -np 2 --bind-to none ./stream_reduce_probe BYTES PIECE K CALLS
 *   e.g. mpirun -np 2 --bind-to none ./stream_reduce_probe 2097152 65536 6 300
 *
 * docs/benchmarks.md, "Reduce at two ranks: streamed through the segment?",
 * has what it showed.
 */
#include <mpi.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 6

struct counters {
    _Alignas(64) _Atomic unsigned long produced;
    _Alignas(64) _Atomic unsigned long consumed;
};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static void pause_cpu(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void sum(float *d, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] + b[i];
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 5 || size != 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 %s BYTES PIECE K CALLS\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    size_t bytes = strtoul(argv[1], NULL, 10), piece = strtoul(argv[2], NULL, 10);
    int K = atoi(argv[3]);
    long calls = atol(argv[4]);
    if (bytes == 0 || bytes % 4 || piece == 0 || piece % 64 || K < 1 || calls < 1) {
        if (rank == 0)
            fprintf(stderr, "BYTES a multiple of 4, PIECE of 64, K and CALLS >= 1\n");
        MPI_Finalize();
        return 2;
    }

    /* The ring: rank 0 makes it, rank 1 maps it, then the name goes. */
    size_t seg_bytes = 4096 + piece * (size_t)K;
    char name[64];
    snprintf(name, sizeof name, "/stream_reduce_probe.%d", (int)getpid());
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, MPI_COMM_WORLD);
    int fd = rank == 0 ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : -1;
    if (rank == 0 && (fd < 0 || ftruncate(fd, (off_t)seg_bytes) != 0)) {
        perror("stream_reduce_probe: shm_open/ftruncate");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1 && (fd = shm_open(name, O_RDWR, 0600)) < 0) {
        perror("stream_reduce_probe: shm_open");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    char *seg = mmap(NULL, seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (seg == MAP_FAILED) {
        perror("stream_reduce_probe: mmap");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    close(fd);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        shm_unlink(name);
    struct counters *c = (struct counters *)seg;
    char *ring = seg + 4096;

    float *in = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes);
    for (size_t i = 0; i < bytes / 4; i++) {
        in[i] = (float)(rank + 1) * (float)(i % 7);
        out[i] = 0.0f;
    }
    size_t npieces = (bytes + piece - 1) / piece;
    unsigned long seq = 0;   /* pieces so far, over all calls: ring position seq % K */
    int bad = 0;
    for (int round = 0; round < ROUNDS; round++) {
        int mpi = round & 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_us();
        for (long it = 0; it < calls; it++) {
            if (mpi) {
                MPI_Reduce(in, out, (int)(bytes / 4), MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
                continue;
            }
            for (size_t p = 0; p < npieces; p++, seq++) {
                size_t off = p * piece, len = bytes - off < piece ? bytes - off : piece;
                char *slot = ring + (seq % (unsigned long)K) * piece;
                if (rank == 1) {
                    while (atomic_load_explicit(&c->consumed, memory_order_acquire) + (unsigned long)K <= seq)
                        pause_cpu();
                    memcpy(slot, (char *)in + off, len);
                    atomic_store_explicit(&c->produced, seq + 1, memory_order_release);
                } else {
                    while (atomic_load_explicit(&c->produced, memory_order_acquire) <= seq)
                        pause_cpu();
                    sum((float *)((char *)out + off), (float *)((char *)in + off), (float *)slot, len / 4);
                    atomic_store_explicit(&c->consumed, seq + 1, memory_order_release);
                }
            }
        }
        double t = (now_us() - t0) / (double)calls, worst;
        MPI_Reduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            /* Small integers: exact in float32. */
            for (size_t i = 0; i < bytes / 4; i++)
                bad += out[i] != 3.0f * (float)(i % 7);
            printf("%zu B, pieces of %zu B, ring of %d: %-6s %9.2f us%s\n", bytes, piece, K,
                   mpi ? "MPI" : "stream", worst, bad ? "  WRONG RESULT" : "");
        }
    }
    munmap(seg, seg_bytes);
    free(in);
    free(out);
    MPI_Finalize();
    return bad != 0;
}
