/*
 * weft-gloo-bench: Gloo's allreduce over its TCP transport beside
 * MPI_Allreduce, float32 sum, with the columns of `weft-perf allreduce`
 * (bench/perf_reduce.c), so docs/benchmarks.md can put a Gloo column next
 * to weft and MPI. Built only where CMake finds Gloo (Debian libgloo-dev).
 *
 *   mpirun -np 4 --oversubscribe --bind-to none bench/gloo/weft-gloo-bench [-b 8] [-e 64m] [-f 2] [-r 5] [-c]
 *
 * MPI only launches the ranks, hands them a rendezvous directory and
 * times the barriers; Gloo connects its own full mesh of TCP pairs through
 * a file store in that directory (/tmp: the ranks must share it, i.e. run
 * on one host, unless WEFT_GLOO_STORE names a shared directory). Gloo binds
 * to 127.0.0.1 when every rank is on one host, else to the host's name;
 * WEFT_GLOO_IFACE=ethX picks an interface instead.
 *
 * size = count*4 bytes in and out; algbw = size/time; busbw = algbw*2(n-1)/n
 * (nccl-tests); time = the slowest rank's per call, median of the
 * repetitions, Gloo and MPI alternating. #wrong counts result elements that
 * differ from the exact sum (every value is a small integer, so float sums
 * are exact): one checked call per size and library, and every call with -c.
 */
#include <dirent.h>
#include <mpi.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

enum { LIB_GLOO = 0, LIB_MPI = 1 };

struct Opts {
    size_t min_bytes = 8, max_bytes = 64u << 20, factor = 2;
    int reps = 5;
    bool check = false;
};

double now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value rank r contributes at index i in call `iter` of library lib:
 * an integer in [-128, 127] (the same scheme as bench/perf_reduce.c). */
inline float val(uint64_t iter, int lib, int r, size_t i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) * 0x7FEB352Du;
    x ^= (uint32_t)r * 0x85EBCA77u + (uint32_t)iter * 0xC2B2AE3Du + (uint32_t)lib * 0x27D4EB2Fu;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    return (float)((int)(x & 255u) - 128);
}

bool parse_size(const char *s, size_t *out)
{
    char *end = nullptr;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return false;
    unsigned long long mult = 1;
    if (*end == 'k' || *end == 'K')
        mult = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M')
        mult = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G')
        mult = 1ull << 30, end++;
    if (*end != '\0')
        return false;
    *out = (size_t)(v * mult);
    return true;
}

class Bench {
public:
    Bench(const Opts &o, int rank, int size, std::shared_ptr<gloo::Context> ctx)
        : o_(o), rank_(rank), size_(size), ctx_(std::move(ctx))
    {
        size_t floats = std::max<size_t>(o.max_bytes / 4, 1);
        send_.assign(floats, 0.0f);
        recv_.assign(floats, 0.0f);
    }

    void fill(uint64_t iter, int lib)
    {
        for (size_t i = 0; i < count_; i++)
            send_[i] = val(iter, lib, rank_, i);
        std::fill(recv_.begin(), recv_.begin() + (ptrdiff_t)count_, std::nanf(""));
    }

    size_t verify(uint64_t iter, int lib) const
    {
        size_t wrong = 0;
        for (size_t i = 0; i < count_; i++) {
            float want = 0.0f;
            for (int r = 0; r < size_; r++)
                want += val(iter, lib, r, i);
            wrong += recv_[i] != want;
        }
        return wrong;
    }

    void call(int lib)
    {
        if (lib == LIB_MPI) {
            if (MPI_Allreduce(send_.data(), recv_.data(), (int)count_, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
                MPI_SUCCESS) {
                std::fprintf(stderr, "weft-gloo-bench rank %d: MPI_Allreduce failed\n", rank_);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            return;
        }
        gloo::AllreduceOptions opts(ctx_);
        opts.setInput(send_.data(), count_);
        opts.setOutput(recv_.data(), count_);
        opts.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        opts.setTag(tag_++);
        gloo::allreduce(opts);   /* throws on failure: the job ends */
    }

    /* Seconds per call, the slowest rank's. */
    double batch(int lib, int iters, uint64_t iter0, size_t *wrong)
    {
        double t = 0.0;
        MPI_Barrier(MPI_COMM_WORLD);
        if (o_.check) {
            for (int i = 0; i < iters; i++) {
                fill(iter0 + (uint64_t)i, lib);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now();
                call(lib);
                t += now() - t0;
                *wrong += verify(iter0 + (uint64_t)i, lib);
            }
        } else {
            double t0 = now();
            for (int i = 0; i < iters; i++)
                call(lib);
            t = now() - t0;
        }
        double per = t / iters, worst = 0.0;
        MPI_Allreduce(&per, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return worst;
    }

    void run()
    {
        if (rank_ == 0) {
            std::printf("# allreduce: gloo::allreduce (TCP transport, %s) vs MPI_Allreduce, float32 sum, median of "
                        "%d reps;\n# size = count*4 (in and out); algbw = size/time, busbw = algbw*2(n-1)/n; "
                        "ratio = MPI time / Gloo time\n",
                        "default algorithm", o_.reps);
            std::printf("# %10s %10s %11s %8s %8s %7s %11s %8s %8s %7s %7s\n", "size(B)", "count(f32)", "gloo(us)",
                        "algbw", "busbw", "#wrong", "MPI(us)", "algbw", "busbw", "#wrong", "ratio");
            std::printf("# %10s %10s %11s %8s %8s %7s %11s %8s %8s %7s %7s\n", "", "", "", "(GB/s)", "(GB/s)", "",
                        "", "(GB/s)", "(GB/s)", "", "MPI/gloo");
            std::fflush(stdout);
        }
        uint64_t iter = 1;
        std::vector<double> times[2] = {std::vector<double>((size_t)o_.reps), std::vector<double>((size_t)o_.reps)};
        for (size_t bytes = o_.min_bytes; bytes && bytes <= o_.max_bytes; bytes *= o_.factor) {
            count_ = bytes / 4;
            if (count_ == 0)
                continue;
            size_t size = count_ * 4;
            size_t wrong_local[2] = {0, 0};
            double slowest = 0.0;
            for (int lib = 0; lib < 2; lib++) {
                fill(iter, lib);
                call(lib);
                wrong_local[lib] += verify(iter++, lib);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now();
                call(lib);   /* warm-up, and a first time per call */
                slowest = std::max(slowest, now() - t0);
            }
            /* Batches of about 0.1 s for the slower library (Gloo's small
             * calls take milliseconds on an oversubscribed node), at most
             * 64 MiB moved, 2 to 1000 calls. */
            double t_call = 0.0;
            MPI_Allreduce(&slowest, &t_call, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            size_t by_bytes = std::max<size_t>(2, (64u << 20) / size);
            size_t by_time = t_call > 0 ? (size_t)(0.1 / t_call) : 1000;
            int iters = (int)std::max<size_t>(2, std::min<size_t>({1000, by_bytes, by_time}));
            for (int rep = 0; rep < o_.reps; rep++)
                for (int k = 0; k < 2; k++) {
                    int lib = (rep + k) % 2;
                    times[lib][(size_t)rep] = batch(lib, iters, iter, &wrong_local[lib]);
                    iter += (uint64_t)iters;
                }
            unsigned long long wl[2] = {wrong_local[0], wrong_local[1]}, wrong[2] = {0, 0};
            MPI_Reduce(wl, wrong, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
            if (rank_ == 0) {
                double med[2];
                for (int lib = 0; lib < 2; lib++) {
                    std::vector<double> v = times[lib];
                    std::sort(v.begin(), v.end());
                    med[lib] = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
                }
                double f = 2.0 * (size_ - 1) / size_;
                double ag = (double)size / med[0] * 1e-9, am = (double)size / med[1] * 1e-9;
                std::printf("%12zu %10zu %11.2f %8.3f %8.3f %7llu %11.2f %8.3f %8.3f %7llu %7.2f\n", size, count_,
                            med[0] * 1e6, ag, ag * f, wrong[0], med[1] * 1e6, am, am * f, wrong[1], med[1] / med[0]);
                std::fflush(stdout);
            }
        }
    }

private:
    const Opts &o_;
    int rank_, size_;
    std::shared_ptr<gloo::Context> ctx_;
    std::vector<float> send_, recv_;
    size_t count_ = 0;
    uint32_t tag_ = 0;
};

/* Removes the file store's directory: one file per key, nothing below. */
void remove_store(const char *dir)
{
    if (DIR *d = opendir(dir)) {
        while (struct dirent *e = readdir(d)) {
            if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0)
                continue;
            std::string f = std::string(dir) + "/" + e->d_name;
            unlink(f.c_str());
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        std::fprintf(stderr, "weft-gloo-bench: could not remove %s: %s\n", dir, std::strerror(errno));
}

/* Every rank on one host (MPI's shared-memory split covers the world). */
bool one_host()
{
    MPI_Comm local;
    int n = 0, world = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &n);
    MPI_Comm_free(&local);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int mine = n == world, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all != 0;
}

} // namespace

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    Opts o;
    int opt, factor = 2;
    bool bad = false;
    while ((opt = getopt(argc, argv, "b:e:f:r:ch")) != -1) {
        switch (opt) {
        case 'b': bad |= !parse_size(optarg, &o.min_bytes); break;
        case 'e': bad |= !parse_size(optarg, &o.max_bytes) || o.max_bytes == 0; break;
        case 'f': factor = std::atoi(optarg); bad |= factor < 2; break;
        case 'r': o.reps = std::atoi(optarg); bad |= o.reps < 1; break;
        case 'c': o.check = true; break;
        default: bad = true; break;
        }
    }
    if (bad || optind != argc) {
        if (rank == 0)
            std::fprintf(stderr, "usage: mpirun -np N weft-gloo-bench [-b SIZE] [-e SIZE] [-f N] [-r N] [-c]\n");
        MPI_Finalize();
        return 1;
    }
    o.factor = (size_t)factor;
    if (o.max_bytes / 4 > (size_t)INT32_MAX) {
        if (rank == 0)
            std::fprintf(stderr, "weft-gloo-bench: -e: MPI counts are int\n");
        MPI_Finalize();
        return 1;
    }

    /* The rendezvous directory: made by rank 0, its name sent to all. */
    char dir[256] = {0};
    if (rank == 0) {
        const char *base = std::getenv("WEFT_GLOO_STORE");
        std::snprintf(dir, sizeof dir, "%s/weft-gloo-XXXXXX", base && *base ? base : "/tmp");
        if (mkdtemp(dir) == nullptr) {
            std::fprintf(stderr, "weft-gloo-bench: mkdtemp %s: %s\n", dir, std::strerror(errno));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);

    gloo::transport::tcp::attr attr;
    const char *iface = std::getenv("WEFT_GLOO_IFACE");
    char host[256] = "127.0.0.1";
    if (iface && *iface)
        attr.iface = iface;
    else {
        if (!one_host())
            gethostname(host, sizeof host - 1);
        attr.hostname = host;
    }
    std::shared_ptr<gloo::Context> ctx;
    {
        gloo::rendezvous::FileStore files(dir);
        gloo::rendezvous::PrefixStore store("weft-gloo-bench", files);
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto c = std::make_shared<gloo::rendezvous::Context>(rank, size);
        c->connectFullMesh(store, dev);
        ctx = c;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char cmd[512] = "";
        for (int i = 0; i < argc; i++)
            std::snprintf(cmd + std::strlen(cmd), sizeof cmd - std::strlen(cmd), " %s", argv[i]);
        char load[64] = "?";
        if (FILE *f = std::fopen("/proc/loadavg", "r")) {
            if (!std::fgets(load, sizeof load, f))
                std::snprintf(load, sizeof load, "?");
            load[std::strcspn(load, "\n")] = '\0';
            std::fclose(f);
        }
        std::printf("#\n# weft-gloo-bench:%s\n# np %d, gloo tcp on %s, loadavg %s\n", cmd, size,
                    iface && *iface ? iface : host, load);
    }
    Bench(o, rank, size, ctx).run();

    ctx.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        remove_store(dir);
    MPI_Finalize();
    return 0;
}
