/*
 * weft-gloo-bench: Gloo's allreduce and allgather over its TCP transport
 * beside weft's and MPI's, in one job, with the sizes, columns and CSV of
 * `weft-perf allreduce` / `weft-perf allgather` (bench/perf_reduce.c,
 * bench/perf_coll.c), so docs/benchmarks.md and scripts/plot can put a Gloo
 * column next to weft and MPI. Built only where CMake finds Gloo (Debian
 * libgloo-dev).
 *
 *   mpirun -np 4 --oversubscribe --bind-to none bench/gloo/weft-gloo-bench \
 *       [allreduce|allgather] [-b 8] [-e 64m] [-f 2] [-r 5] [-n N] [-c] [--csv]
 *
 * MPI launches the ranks, hands them a rendezvous directory and times the
 * barriers; Gloo connects its own full mesh of TCP pairs through a file
 * store in that directory (/tmp: the ranks must share it, i.e. run on one
 * host, unless WEFT_GLOO_STORE names a shared directory). Gloo binds to
 * 127.0.0.1 when every rank is on one host, else to the host's name;
 * WEFT_GLOO_IFACE=ethX picks an interface instead. weft's column is a
 * weft_comm_create over MPI_COMM_WORLD, with WEFT_* of the environment.
 *
 * Sizes, as weft-perf:
 *   allreduce  size = count*4 bytes in and out (nccl-tests); float32 sum;
 *              algbw = size/time, busbw = algbw*2(n-1)/n
 *   allgather  size = the block of one rank (bytes; weft-perf's size
 *              column), the result n*size; algbw = n*size/time (nccl-tests'
 *              size over time), busbw = algbw*(n-1)/n
 * time = the slowest rank's per call, median of the repetitions; every
 * repetition runs the libraries in turn, a different one first each time.
 *
 * #wrong: allreduce counts result elements that differ from the exact sum
 * (every value is a small integer, so float sums are exact in any order);
 * allgather counts bytes that differ from the pattern of the rank that sent
 * them (never 0, and the result is zeroed first, so a call that writes
 * nothing fails). One checked call per size and library with fresh data,
 * and every timed call with -c (filled and checked outside the timed part).
 *
 * --csv: the CSV of weft-perf (header subcommand,np,transport,bytes,library,
 * time_us,algbw_GBps,busbw_GBps,wrong), libraries "gloo", "MPI" and "weft";
 * gloo's transport is "tcp" (or "tcp:IFACE" under WEFT_GLOO_IFACE).
 */
#include <dirent.h>
#include <mpi.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "weft.h"

namespace {

enum { LIB_GLOO = 0, LIB_MPI = 1, LIB_WEFT = 2, NLIB = 3 };
const char *const lib_name[NLIB] = {"gloo", "MPI", "weft"};

enum Kind { ALLREDUCE, ALLGATHER };

struct Opts {
    Kind kind = ALLREDUCE;
    size_t min_bytes = 8, max_bytes = 64u << 20, factor = 2;
    int reps = 5;
    int iters = 0;   /* -n: calls per repetition; 0 = by size and time */
    bool check = false;
    bool csv = false;
};

double now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint32_t mix(uint64_t iter, int lib, int r, size_t i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (uint32_t)(i >> 32) * 0x7FEB352Du;
    x ^= (uint32_t)r * 0x85EBCA77u + (uint32_t)iter * 0xC2B2AE3Du + (uint32_t)lib * 0x27D4EB2Fu;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    return x;
}

/* allreduce: the value rank r contributes at index i in call `iter` of
 * library lib, an integer in [-128, 127] (as bench/perf_reduce.c). */
inline float val(uint64_t iter, int lib, int r, size_t i)
{
    return (float)((int)(mix(iter, lib, r, i) & 255u) - 128);
}

/* allgather: byte i of rank r's block, 1..255 (never the 0 the result is
 * cleared to). */
inline uint8_t pat(uint64_t iter, int lib, int r, size_t i)
{
    return (uint8_t)(1u + mix(iter, lib, r, i) % 255u);
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

/* src with ',' written '+', so it stays one CSV field (as weft-perf). */
std::string csv_field(const char *src)
{
    std::string s(src);
    std::replace(s.begin(), s.end(), ',', '+');
    return s;
}

/* The transport configuration of a library's CSV rows, as weft-perf
 * writes them for weft and MPI. */
std::string transport_of(int lib)
{
    if (lib == LIB_GLOO) {
        const char *iface = std::getenv("WEFT_GLOO_IFACE");
        return iface && *iface ? "tcp:" + csv_field(iface) : std::string("tcp");
    }
    if (lib == LIB_MPI) {
        const char *btl = std::getenv("OMPI_MCA_btl");
        return csv_field(btl && *btl ? btl : "default");
    }
    const char *tp = std::getenv("WEFT_TRANSPORTS"), *vn = std::getenv("WEFT_VIRTUAL_NODES");
    std::string s = csv_field(tp && *tp ? tp : "default");
    if (vn && *vn)
        s += "/vnodes=" + csv_field(vn);
    return s;
}

class Bench {
public:
    Bench(const Opts &o, int rank, int size, std::shared_ptr<gloo::Context> ctx, weft_comm_t *wc)
        : o_(o), rank_(rank), size_(size), ctx_(std::move(ctx)), wc_(wc)
    {
        /* The largest buffers of the sweep: allreduce's in and out, or one
         * block in and n blocks out. */
        if (o.kind == ALLREDUCE) {
            size_t floats = std::max<size_t>(o.max_bytes / 4, 1);
            fsend_.assign(floats, 0.0f);
            frecv_.assign(floats, 0.0f);
        } else {
            bsend_.assign(std::max<size_t>(o.max_bytes, 1), 0);
            brecv_.assign(std::max<size_t>(o.max_bytes, 1) * (size_t)size, 0);
        }
    }

    void fill(uint64_t iter, int lib)
    {
        if (o_.kind == ALLREDUCE) {
            for (size_t i = 0; i < count_; i++)
                fsend_[i] = val(iter, lib, rank_, i);
            std::fill(frecv_.begin(), frecv_.begin() + (ptrdiff_t)count_, std::nanf(""));
        } else {
            for (size_t i = 0; i < bytes_; i++)
                bsend_[i] = pat(iter, lib, rank_, i);
            std::fill(brecv_.begin(), brecv_.begin() + (ptrdiff_t)(bytes_ * (size_t)size_), 0);
        }
    }

    size_t verify(uint64_t iter, int lib) const
    {
        size_t wrong = 0;
        if (o_.kind == ALLREDUCE) {
            for (size_t i = 0; i < count_; i++) {
                float want = 0.0f;
                for (int r = 0; r < size_; r++)
                    want += val(iter, lib, r, i);
                wrong += frecv_[i] != want;
            }
        } else {
            for (int r = 0; r < size_; r++)
                for (size_t i = 0; i < bytes_; i++)
                    wrong += brecv_[(size_t)r * bytes_ + i] != pat(iter, lib, r, i);
        }
        return wrong;
    }

    void call(int lib)
    {
        if (lib == LIB_MPI) {
            int err;
            if (o_.kind == ALLREDUCE)
                err = MPI_Allreduce(fsend_.data(), frecv_.data(), (int)count_, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else
                err = MPI_Allgather(bsend_.data(), (int)bytes_, MPI_BYTE, brecv_.data(), (int)bytes_, MPI_BYTE,
                                    MPI_COMM_WORLD);
            if (err != MPI_SUCCESS) {
                std::fprintf(stderr, "weft-gloo-bench rank %d: MPI_%s failed\n", rank_,
                             o_.kind == ALLREDUCE ? "Allreduce" : "Allgather");
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            return;
        }
        if (lib == LIB_WEFT) {
            int err = o_.kind == ALLREDUCE
                          ? weft_allreduce(wc_, fsend_.data(), frecv_.data(), count_, WEFT_FLOAT32, WEFT_SUM)
                          : weft_allgather(wc_, bsend_.data(), brecv_.data(), bytes_);
            if (err) {
                std::fprintf(stderr, "weft-gloo-bench rank %d: weft_%s failed: %s: %s\n", rank_,
                             o_.kind == ALLREDUCE ? "allreduce" : "allgather", weft_strerror(err),
                             weft_comm_last_error(wc_));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            return;
        }
        /* Gloo throws on failure (timeout, broken pair): the job ends. */
        if (o_.kind == ALLREDUCE) {
            gloo::AllreduceOptions opts(ctx_);
            opts.setInput(fsend_.data(), count_);
            opts.setOutput(frecv_.data(), count_);
            opts.setReduceFunction(
                static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
            opts.setTag(tag_++);
            gloo::allreduce(opts);
        } else {
            gloo::AllgatherOptions opts(ctx_);
            opts.setInput(bsend_.data(), bytes_);
            opts.setOutput(brecv_.data(), bytes_ * (size_t)size_);
            opts.setTag(tag_++);
            gloo::allgather(opts);
        }
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

    void header() const
    {
        if (rank_ != 0)
            return;
        if (o_.csv) {
            std::printf("subcommand,np,transport,bytes,library,time_us,algbw_GBps,busbw_GBps,wrong\n");
        } else {
            if (o_.kind == ALLREDUCE)
                std::printf("# allreduce: gloo::allreduce (TCP transport, default algorithm) vs MPI_Allreduce vs "
                            "weft_allreduce, float32 sum,\n# median of %d reps; size = count*4 (in and out); "
                            "algbw = size/time, busbw = algbw*2(n-1)/n\n", o_.reps);
            else
                std::printf("# allgather: gloo::allgather (TCP transport) vs MPI_Allgather vs weft_allgather, "
                            "median of %d reps;\n# size = bytes per rank; algbw = n*size/time, "
                            "busbw = algbw*(n-1)/n\n", o_.reps);
            std::printf("# ratios: gloo time / weft time and MPI time / weft time (above 1: weft faster)\n");
            std::printf("# %10s", o_.kind == ALLREDUCE ? "size(B)" : "size(B/rk)");
            for (int lib = 0; lib < NLIB; lib++)
                std::printf(" %9s(us) %8s %8s %7s", lib_name[lib], "algbw", "busbw", "#wrong");
            std::printf(" %9s %9s\n# %10s", "gloo/weft", "MPI/weft", "");
            for (int lib = 0; lib < NLIB; lib++)
                std::printf(" %13s %8s %8s %7s", "", "(GB/s)", "(GB/s)", "");
            std::printf("\n");
        }
        std::fflush(stdout);
    }

    void run()
    {
        header();
        const char *sub = o_.kind == ALLREDUCE ? "allreduce" : "allgather";
        uint64_t iter = 1;
        std::vector<double> times[NLIB];
        for (auto &v : times)
            v.assign((size_t)o_.reps, 0.0);
        for (size_t bytes = o_.min_bytes; bytes && bytes <= o_.max_bytes; bytes *= o_.factor) {
            size_t moved;   /* the size column and algbw's numerator */
            if (o_.kind == ALLREDUCE) {
                count_ = bytes / 4;
                if (count_ == 0)
                    continue;
                moved = count_ * 4;
            } else {
                bytes_ = bytes;
                moved = bytes * (size_t)size_;
            }
            size_t size_col = o_.kind == ALLREDUCE ? moved : bytes;
            size_t wrong_local[NLIB] = {0, 0, 0};
            double slowest = 0.0;
            for (int lib = 0; lib < NLIB; lib++) {
                fill(iter, lib);
                call(lib);
                wrong_local[lib] += verify(iter++, lib);
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now();
                call(lib);   /* warm-up, and a first time per call */
                slowest = std::max(slowest, now() - t0);
            }
            /* Batches of about 0.1 s for the slowest library (Gloo's small
             * calls take milliseconds on an oversubscribed node), at most
             * 64 MiB moved, 2 to 1000 calls; -n sets the count. */
            double t_call = 0.0;
            MPI_Allreduce(&slowest, &t_call, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            size_t by_bytes = std::max<size_t>(2, (64u << 20) / moved);
            size_t by_time = t_call > 0 ? (size_t)(0.1 / t_call) : 1000;
            int iters = o_.iters > 0 ? o_.iters
                                     : (int)std::max<size_t>(2, std::min<size_t>({1000, by_bytes, by_time}));
            for (int rep = 0; rep < o_.reps; rep++)
                for (int k = 0; k < NLIB; k++) {
                    int lib = (rep + k) % NLIB;   /* each library first in turn */
                    times[lib][(size_t)rep] = batch(lib, iters, iter, &wrong_local[lib]);
                    iter += (uint64_t)iters;
                }
            unsigned long long wl[NLIB], wrong[NLIB] = {0, 0, 0};
            for (int lib = 0; lib < NLIB; lib++)
                wl[lib] = wrong_local[lib];
            MPI_Reduce(wl, wrong, NLIB, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
            if (rank_ != 0)
                continue;
            double med[NLIB], alg[NLIB];
            const double f = o_.kind == ALLREDUCE ? 2.0 * (size_ - 1) / size_ : (double)(size_ - 1) / size_;
            for (int lib = 0; lib < NLIB; lib++) {
                std::vector<double> v = times[lib];
                std::sort(v.begin(), v.end());
                med[lib] = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
                alg[lib] = med[lib] > 0 ? (double)moved / med[lib] * 1e-9 : 0.0;
            }
            if (o_.csv) {
                for (int lib = 0; lib < NLIB; lib++)
                    std::printf("%s,%d,%s,%zu,%s,%.3f,%.4f,%.4f,%llu\n", sub, size_, transport_of(lib).c_str(),
                                size_col, lib_name[lib], med[lib] * 1e6, alg[lib], alg[lib] * f, wrong[lib]);
            } else {
                std::printf("%12zu", size_col);
                for (int lib = 0; lib < NLIB; lib++)
                    std::printf(" %13.2f %8.3f %8.3f %7llu", med[lib] * 1e6, alg[lib], alg[lib] * f, wrong[lib]);
                double w = med[LIB_WEFT];
                std::printf(" %9.2f %9.2f\n", w > 0 ? med[LIB_GLOO] / w : 0.0, w > 0 ? med[LIB_MPI] / w : 0.0);
            }
            for (int lib = 0; lib < NLIB; lib++)
                if (wrong[lib])   /* on stderr: under --csv it would break the CSV */
                    std::fprintf(stderr, "# WARNING: %s delivered %llu wrong %s at size %zu\n", lib_name[lib],
                                 wrong[lib], o_.kind == ALLREDUCE ? "elements" : "bytes", size_col);
            std::fflush(stdout);
        }
    }

private:
    const Opts &o_;
    int rank_, size_;
    std::shared_ptr<gloo::Context> ctx_;
    weft_comm_t *wc_;
    std::vector<float> fsend_, frecv_;
    std::vector<uint8_t> bsend_, brecv_;
    size_t count_ = 0;   /* allreduce: floats */
    size_t bytes_ = 0;   /* allgather: bytes per rank */
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

void usage()
{
    std::fprintf(stderr, "usage: mpirun -np N weft-gloo-bench [allreduce|allgather] [-b SIZE] [-e SIZE] [-f N] "
                         "[-r N] [-n N] [-c] [--csv]\n");
}

} // namespace

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    Opts o;
    bool bad = false;
    int first = 1;
    if (argc > 1 && argv[1][0] != '-') {
        if (std::strcmp(argv[1], "allreduce") == 0)
            o.kind = ALLREDUCE;
        else if (std::strcmp(argv[1], "allgather") == 0)
            o.kind = ALLGATHER;
        else
            bad = true;
        first = 2;
    }
    /* getopt has no long options; --csv is taken out of the list first. */
    std::vector<char *> args{argv[0]};
    for (int i = first; i < argc; i++) {
        if (std::strcmp(argv[i], "--csv") == 0)
            o.csv = true;
        else
            args.push_back(argv[i]);
    }
    args.push_back(nullptr);
    int opt, factor = 2, nargs = (int)args.size() - 1;
    while (!bad && (opt = getopt(nargs, args.data(), "b:e:f:r:n:ch")) != -1) {
        switch (opt) {
        case 'b': bad |= !parse_size(optarg, &o.min_bytes); break;
        case 'e': bad |= !parse_size(optarg, &o.max_bytes) || o.max_bytes == 0; break;
        case 'f': factor = std::atoi(optarg); bad |= factor < 2; break;
        case 'r': o.reps = std::atoi(optarg); bad |= o.reps < 1; break;
        case 'n': o.iters = std::atoi(optarg); bad |= o.iters < 1; break;
        case 'c': o.check = true; break;
        default: bad = true; break;
        }
    }
    if (bad || optind != nargs) {
        if (rank == 0)
            usage();
        MPI_Finalize();
        return 1;
    }
    o.factor = (size_t)factor;
    if ((o.kind == ALLREDUCE ? o.max_bytes / 4 : o.max_bytes) > (size_t)INT32_MAX) {
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
    /* Gloo's waits end after WEFT_TIMEOUT seconds too, where it is set, as
     * weft's do (Gloo's own default otherwise). */
    if (const char *to = std::getenv("WEFT_TIMEOUT")) {
        double s = std::atof(to);
        if (s > 0)
            ctx->setTimeout(std::chrono::milliseconds((long long)(s * 1000.0)));
    }
    weft_comm_t *wc = nullptr;
    int err = weft_comm_create(MPI_COMM_WORLD, &wc);
    if (err) {
        std::fprintf(stderr, "weft-gloo-bench rank %d: weft_comm_create failed: %s\n", rank, weft_strerror(err));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && !o.csv) {
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
        const char *tp = std::getenv("WEFT_TRANSPORTS"), *btl = std::getenv("OMPI_MCA_btl");
        std::printf("#\n# weft-gloo-bench:%s\n# np %d, gloo tcp on %s, weft transports %s, MPI btl %s, "
                    "loadavg %s\n", cmd, size, iface && *iface ? iface : host, tp && *tp ? tp : "default",
                    btl && *btl ? btl : "default", load);
    }
    Bench(o, rank, size, ctx, wc).run();

    err = weft_comm_destroy(wc);
    if (err)
        std::fprintf(stderr, "weft-gloo-bench rank %d: weft_comm_destroy failed: %s\n", rank, weft_strerror(err));
    ctx.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        remove_store(dir);
    MPI_Finalize();
    return err ? 1 : 0;
}
