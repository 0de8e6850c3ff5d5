/*
 * Fault injection (issue 10): one rank dies or freezes just before a
 * collective, and the others must get an error naming it, in bounded time,
 * with their own pipes still working.
 *
 *   weft_mpi_faults <case> <mode>        (or WEFT_FAULT_CASE / WEFT_FAULT_MODE)
 *     case: ring | rd | bruck | direct | hier   weft_allgather, the algorithm
 *                                               forced with WEFT_ALLGATHER_ALGO
 *           bcast                               weft_bcast, root = the victim
 *           bcast_small                         the same at 1 KiB (node-local)
 *           allreduce                           weft_allreduce of 1 KiB (node-local)
 *           reduce_scatter                      weft_reduce_scatter of 256 B a rank (node-local)
 *           scatter_small                       weft_scatter of 256 B a rank, root = the
 *                                               victim (node-local)
 *           alltoall_small                      weft_alltoall of 256 B blocks (node-local)
 *           alltoall_pulled                     weft_alltoall of 96 KiB blocks (on one node
 *                                               each read by CMA out of its sender's buffer)
 *           scatter_pulled                      weft_scatter of 96 KiB a rank, root 0 (on one
 *                                               node each block read out of the root's buffer)
 *           barrier                             weft_barrier
 *           first                               no warm-up: the survivors'
 *                                               first message to the victim
 *                                               (a send and a receive), so
 *                                               the pipe is made after the
 *                                               fault (lazy connection)
 *     mode: kill   the victim (rank 2) raises SIGKILL on itself
 *           stop   it raises SIGSTOP (alive, silent); a survivor SIGKILLs it
 *                  once the checks are done
 *
 * Every rank creates the comm and runs the collective once with verified
 * data (every pipe the algorithm uses is up); after an MPI_Barrier the
 * victim signals itself and the survivors call the collective 0.2 s later.
 * Each survivor checks: the call fails within WEFT_TIMEOUT + 1 s; its last
 * error names the victim ("rank 2" or "peer 2") and no other rank but its
 * own; a ring of weft p2p among the survivors (small and rendezvous-size
 * messages, verified) succeeds; weft_comm_destroy returns within
 * WEFT_TIMEOUT + 2 s (any code). It then prints one line, "FAULT-OK rank N
 * ..." or "FAULT-FAIL rank N ...", and _exits: MPI_Finalize would wait for
 * the dead rank. The survivors talk MPI only on a communicator of their own
 * (split off before the fault), which keeps working with the victim gone.
 *
 * mpirun needs --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0
 * or it kills the survivors when the victim dies. Its exit code then says
 * nothing about the test (0 even with a rank killed, Open MPI 4.1), so the
 * ctest entries (contracts.cmake) judge by the FAULT-OK lines.
 * docs/testing-faults.md has the details and how to run one case by hand.
 */
#include <mpi.h>

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

constexpr int kVictim = 2;
constexpr size_t kAllgatherBytes = 64 * 1024;   /* per rank */
constexpr size_t kBcastBytes = 256 * 1024;
/* allreduce (int32 elements) and bcast_small (4 bytes each): within the
 * node-local paths' reach (node_coll.c, node_hier.c). */
constexpr size_t kSmallCount = 256;
/* A block above WEFT_NODE_COLL_KB's default (64 KiB): pulled by CMA on one node. */
constexpr size_t kPulledBytes = 96 * 1024;

/* What the run is about; the watchdog's failure line needs it. */
struct Run {
    std::string kase, mode;
    int rank = -1, size = 0;
    std::vector<int> pids;   /* every rank's pid (MPI_Allgather at start) */
    double timeout = 3;      /* WEFT_TIMEOUT */
};
Run g_run;

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_first_line(const std::string &path)
{
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    return line;
}

/* SIGKILLs a stopped victim, so mpirun can finish. Only while its pid is
 * still this program (same /proc/<pid>/comm): a pid is never killed after
 * it could have been reused. */
void kill_stopped_victim()
{
    if (g_run.mode != "stop" || (int)g_run.pids.size() <= kVictim || g_run.rank == kVictim)
        return;
    const pid_t pid = (pid_t)g_run.pids[kVictim];
    const std::string theirs = read_first_line("/proc/" + std::to_string(pid) + "/comm");
    if (!theirs.empty() && theirs == read_first_line("/proc/self/comm"))
        kill(pid, SIGKILL);
}

/* Prints one result line and ends the process without MPI_Finalize. */
[[noreturn]] void finish(bool ok, const std::string &detail)
{
    std::printf("%s rank %d %s %s: %s\n", ok ? "FAULT-OK" : "FAULT-FAIL", g_run.rank, g_run.kase.c_str(),
                g_run.mode.c_str(), detail.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(ok ? 0 : 1);
}

/* A call that does not return in time ends the survivor with a FAULT-FAIL
 * line (and frees a stopped victim so mpirun can finish). */
class Watchdog {
public:
    Watchdog(double seconds, std::string what) : what_(std::move(what))
    {
        thread_ = std::thread([this, seconds] {
            std::unique_lock<std::mutex> lk(mu_);
            if (!cv_.wait_for(lk, std::chrono::duration<double>(seconds), [this] { return done_; })) {
                kill_stopped_victim();
                char buf[64];
                std::snprintf(buf, sizeof buf, " did not return within %.1f s", seconds);
                finish(false, what_ + buf);
            }
        });
    }
    ~Watchdog()
    {
        {
            std::lock_guard<std::mutex> lk(mu_);
            done_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

private:
    std::string what_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread thread_;
};

bool is_allgather_case(const std::string &k)
{
    return k == "ring" || k == "rd" || k == "bruck" || k == "direct" || k == "hier";
}

/* The case's collective once. verify: check the data (the warm-up, where
 * every rank is alive); problems get what was wrong. */
int run_collective(weft_comm_t *c, uint64_t index, bool verify, std::vector<std::string> &problems)
{
    const int me = g_run.rank, n = g_run.size;
    if (g_run.kase == "barrier")
        return weft_barrier(c);
    if (g_run.kase == "first") {
        unsigned char out[100], in[100];
        fill_pattern(out, sizeof out, pattern_seed(me, 702, index));
        weft_request_t *rq[2] = {nullptr, nullptr};
        int rc = weft_irecv(c, in, sizeof in, kVictim, 702, &rq[0]);
        if (rc != WEFT_SUCCESS)
            return rc;
        rc = weft_isend(c, out, sizeof out, kVictim, 702, &rq[1]);
        if (rc != WEFT_SUCCESS) {
            weft_wait(rq[0], nullptr);   /* fails too: the pipe broke */
            return rc;
        }
        return weft_waitall(2, rq, nullptr);
    }
    if (g_run.kase == "allreduce") {
        std::vector<int32_t> in(kSmallCount), out(kSmallCount, -1);
        for (size_t i = 0; i < kSmallCount; i++)
            in[i] = (int32_t)((size_t)(me + 1) * 1000 + i + index);
        int rc = weft_allreduce(c, in.data(), out.data(), kSmallCount, WEFT_INT32, WEFT_SUM);
        for (size_t i = 0; rc == WEFT_SUCCESS && verify && i < kSmallCount; i++)
            if (out[i] != (int32_t)((size_t)n * (n + 1) / 2 * 1000 + (size_t)n * (i + index))) {
                problems.push_back("allreduce delivered wrong data");
                break;
            }
        return rc;
    }
    if (g_run.kase == "reduce_scatter") {
        /* kSmallCount elements in all: kSmallCount / n a rank. */
        const size_t per = kSmallCount / (size_t)n;
        std::vector<int32_t> in(per * (size_t)n), out(per, -1);
        for (size_t i = 0; i < in.size(); i++)
            in[i] = (int32_t)((size_t)(me + 1) * 1000 + i + index);
        int rc = weft_reduce_scatter(c, in.data(), out.data(), per, WEFT_INT32, WEFT_SUM);
        for (size_t i = 0; rc == WEFT_SUCCESS && verify && i < per; i++)
            if (out[i] != (int32_t)((size_t)n * (n + 1) / 2 * 1000 + (size_t)n * ((size_t)me * per + i + index))) {
                problems.push_back("reduce_scatter delivered wrong data");
                break;
            }
        return rc;
    }
    if (g_run.kase == "alltoall_small") {
        const size_t per = kSmallCount;
        std::vector<unsigned char> send(per * (size_t)n), out(per * (size_t)n);
        for (int p = 0; p < n; p++)
            fill_pattern(send.data() + (size_t)p * per, per, pattern_seed(me * 64 + p, 704, index));
        int rc = weft_alltoall(c, send.data(), out.data(), per);
        for (int p = 0; rc == WEFT_SUCCESS && verify && p < n; p++)
            if (pattern_mismatch(out.data() + (size_t)p * per, per, pattern_seed(p * 64 + me, 704, index)) != SIZE_MAX) {
                problems.push_back("alltoall: wrong block from rank " + std::to_string(p));
                break;
            }
        return rc;
    }
    if (g_run.kase == "alltoall_pulled") {
        /* Blocks over the slot: each rank reads its block out of every
         * other's send buffer by CMA (node_coll.c, node_a2a_pull). */
        const size_t per = kPulledBytes;
        std::vector<unsigned char> send(per * (size_t)n), out(per * (size_t)n);
        for (int p = 0; p < n; p++)
            fill_pattern(send.data() + (size_t)p * per, per, pattern_seed(me * 64 + p, 705, index));
        int rc = weft_alltoall(c, send.data(), out.data(), per);
        for (int p = 0; rc == WEFT_SUCCESS && verify && p < n; p++)
            if (pattern_mismatch(out.data() + (size_t)p * per, per, pattern_seed(p * 64 + me, 705, index)) != SIZE_MAX) {
                problems.push_back("alltoall (pulled): wrong block from rank " + std::to_string(p));
                break;
            }
        return rc;
    }
    if (g_run.kase == "scatter_pulled") {
        /* Root 0, blocks over the slot: each rank reads its block out of
         * the root's send buffer by CMA (node_coll.c, node_scatter_pull);
         * the victim is a receiver the root holds its buffer for. */
        const size_t per = kPulledBytes;
        std::vector<unsigned char> send(me == 0 ? per * (size_t)n : 0), out(per);
        for (int p = 0; me == 0 && p < n; p++)
            fill_pattern(send.data() + (size_t)p * per, per, pattern_seed(p, 706, index));
        int rc = weft_scatter(c, send.data(), out.data(), per, 0);
        if (rc == WEFT_SUCCESS && verify && pattern_mismatch(out.data(), per, pattern_seed(me, 706, index)) != SIZE_MAX)
            problems.push_back("scatter (pulled) delivered wrong data");
        return rc;
    }
    if (g_run.kase == "scatter_small") {
        const size_t per = kSmallCount;
        std::vector<unsigned char> send(me == kVictim ? per * (size_t)n : 0), out(per);
        for (int p = 0; me == kVictim && p < n; p++)
            fill_pattern(send.data() + (size_t)p * per, per, pattern_seed(p, 703, index));
        int rc = weft_scatter(c, send.data(), out.data(), per, kVictim);
        if (rc == WEFT_SUCCESS && verify && pattern_mismatch(out.data(), per, pattern_seed(me, 703, index)) != SIZE_MAX)
            problems.push_back("scatter delivered wrong data");
        return rc;
    }
    if (g_run.kase == "bcast" || g_run.kase == "bcast_small") {
        std::vector<unsigned char> buf(g_run.kase == "bcast" ? kBcastBytes : kSmallCount * 4);
        if (me == kVictim)
            fill_pattern(buf.data(), buf.size(), pattern_seed(kVictim, 701, index));
        int rc = weft_bcast(c, buf.data(), buf.size(), kVictim);
        if (rc == WEFT_SUCCESS && verify &&
            pattern_mismatch(buf.data(), buf.size(), pattern_seed(kVictim, 701, index)) != SIZE_MAX)
            problems.push_back("bcast delivered wrong data");
        return rc;
    }
    std::vector<unsigned char> out(kAllgatherBytes), in(kAllgatherBytes * (size_t)n);
    fill_pattern(out.data(), out.size(), pattern_seed(me, 700, index));
    int rc = weft_allgather(c, out.data(), in.data(), kAllgatherBytes);
    if (rc == WEFT_SUCCESS && verify)
        for (int p = 0; p < n; p++)
            if (pattern_mismatch(in.data() + (size_t)p * kAllgatherBytes, kAllgatherBytes,
                                 pattern_seed(p, 700, index)) != SIZE_MAX)
                problems.push_back("allgather: wrong block of rank " + std::to_string(p));
    return rc;
}

/* The error must name the victim, and no other rank as the failed one:
 * besides the victim it may name only the reporting rank itself ("rank
 * <me>: ...") and ranks that passed the news on ("detected by rank N",
 * "reported by rank N"). Any "peer N" other than the victim means a step
 * with a live rank was blamed (e.g. timed out on it). */
void check_error_names_victim(const std::string &err, std::vector<std::string> &problems)
{
    static const std::regex named(R"((by )?(rank|peer) (\d+)\b)");
    bool victim_named = false;
    std::string others;
    for (auto it = std::sregex_iterator(err.begin(), err.end(), named); it != std::sregex_iterator(); ++it) {
        const int who = std::atoi((*it)[3].str().c_str());
        const bool is_rank = (*it)[2] == "rank";
        if (who == kVictim)
            victim_named = true;
        else if (is_rank && (who == g_run.rank || (*it)[1].matched))
            continue;   /* the reporter itself, or who passed the news on */
        else
            others += (others.empty() ? "" : ", ") + it->str();
    }
    if (!victim_named)
        problems.push_back("the error does not name rank " + std::to_string(kVictim));
    if (!others.empty())
        problems.push_back("the error names another rank as failed (" + others + ")");
}

/* An MPI barrier that keeps weft's progress going while it waits. */
void progressing_barrier(weft_comm_t *c, MPI_Comm comm, std::vector<std::string> &problems)
{
    const int self = weft_comm_rank(c), tag = 77777;
    unsigned char in = 0, out = 1;
    weft_request_t *dummy = nullptr;
    if (weft_irecv(c, &in, 1, self, tag, &dummy) != WEFT_SUCCESS) {
        problems.push_back(std::string("progressing barrier: irecv from self failed: ") + weft_comm_last_error(c));
        MPI_Barrier(comm);
        return;
    }
    MPI_Request b;
    MPI_Ibarrier(comm, &b);
    for (int flag = 0; !flag;) {
        int done = 0;
        weft_status_t st;
        MPI_Test(&b, &flag, MPI_STATUS_IGNORE);
        if (weft_test(dummy, &done, &st) != WEFT_SUCCESS || done) {
            problems.push_back("progressing barrier: the receive from self completed early");
            MPI_Wait(&b, MPI_STATUS_IGNORE);
            return;
        }
        usleep(200);
    }
    if (weft_send(c, &out, 1, self, tag) != WEFT_SUCCESS || weft_wait(dummy, nullptr) != WEFT_SUCCESS || in != 1)
        problems.push_back(std::string("progressing barrier: self message failed: ") + weft_comm_last_error(c));
}

/* Ring of weft p2p among the survivors, small and rendezvous-size, verified. */
void survivor_ring(weft_comm_t *c, const std::vector<int> &survivors, int my_index,
                   std::vector<std::string> &problems)
{
    const int ns = (int)survivors.size();
    const int right = survivors[(my_index + 1) % ns], left = survivors[(my_index + ns - 1) % ns];
    int tag = 3000;
    for (size_t bytes : {(size_t)100, (size_t)(1u << 20) + 3}) {
        std::vector<unsigned char> out(bytes), in(bytes);
        fill_pattern(out.data(), bytes, pattern_seed(g_run.rank, tag, 1));
        weft_request_t *reqs[2] = {nullptr, nullptr};
        weft_status_t st[2];
        int rc = weft_irecv(c, in.data(), bytes, left, tag, &reqs[0]);
        if (rc == WEFT_SUCCESS)
            rc = weft_isend(c, out.data(), bytes, right, tag, &reqs[1]);
        if (rc == WEFT_SUCCESS)
            rc = weft_waitall(2, reqs, st);
        if (rc != WEFT_SUCCESS) {
            problems.push_back("survivor p2p of " + std::to_string(bytes) + " B (from rank " + std::to_string(left) +
                               ", to rank " + std::to_string(right) + "): " + weft_strerror(rc) + ": " +
                               weft_comm_last_error(c));
            return;   /* requests may be left posted: the comm is not reused */
        }
        if (st[0].bytes != bytes ||
            pattern_mismatch(in.data(), bytes, pattern_seed(left, tag, 1)) != SIZE_MAX)
            problems.push_back("survivor p2p of " + std::to_string(bytes) + " B from rank " + std::to_string(left) +
                               ": wrong data");
        tag++;
    }
}

std::string join(const std::vector<std::string> &v)
{
    std::string s;
    for (const std::string &x : v)
        s += (s.empty() ? "" : "; ") + x;
    return s;
}

} // namespace

int main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        std::fprintf(stderr, "MPI_Init failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_run.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_run.size);
    g_run.kase = argc > 1 ? argv[1] : env_or("WEFT_FAULT_CASE", "");
    g_run.mode = argc > 2 ? argv[2] : env_or("WEFT_FAULT_MODE", "");
    g_run.timeout = std::atof(env_or("WEFT_TIMEOUT", "60"));
    const bool known_case = is_allgather_case(g_run.kase) || g_run.kase == "bcast" || g_run.kase == "barrier" ||
                            g_run.kase == "first" || g_run.kase == "allreduce" || g_run.kase == "bcast_small" ||
                            g_run.kase == "reduce_scatter" || g_run.kase == "scatter_small" ||
                            g_run.kase == "alltoall_small" || g_run.kase == "alltoall_pulled" ||
                            g_run.kase == "scatter_pulled";
    if (!known_case || (g_run.mode != "kill" && g_run.mode != "stop") || g_run.size <= kVictim)
        finish(false, "usage: weft_mpi_faults ring|rd|bruck|direct|hier|bcast|bcast_small|allreduce|reduce_scatter|"
                          "scatter_small|alltoall_small|alltoall_pulled|scatter_pulled|barrier|first kill|stop, on at "
                          "least " +
                          std::to_string(kVictim + 1) + " ranks");

    const bool victim = g_run.rank == kVictim;
    int pid = (int)getpid();
    g_run.pids.resize((size_t)g_run.size);
    MPI_Allgather(&pid, 1, MPI_INT, g_run.pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
    /* The survivors' own communicator, for their MPI after the fault. */
    MPI_Comm survivors_comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, victim ? MPI_UNDEFINED : 0, g_run.rank, &survivors_comm);
    std::vector<int> survivors;
    for (int r = 0; r < g_run.size; r++)
        if (r != kVictim)
            survivors.push_back(r);
    const int my_index = victim ? -1 : (g_run.rank < kVictim ? g_run.rank : g_run.rank - 1);

    std::vector<std::string> problems;
    Settings settings;
    if (is_allgather_case(g_run.kase))
        settings.push_back({"WEFT_ALLGATHER_ALGO", g_run.kase});
    weft_comm_t *c = nullptr;
    int rc = create_with(MPI_COMM_WORLD, settings, &c);
    int create_failed = rc != WEFT_SUCCESS, any_create_failed = 0;
    MPI_Allreduce(&create_failed, &any_create_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_create_failed) {
        if (victim)
            _exit(1);
        finish(false, std::string("weft_comm_create_config failed (on this rank: ") + weft_strerror(rc) + ")");
    }

    /* Warm-up: the same collective with every rank alive, verified (not
     * for "first": no pipe to the victim may exist before the fault). */
    if (g_run.kase != "first") {
        Watchdog wd(g_run.timeout + 20, "the warm-up " + g_run.kase);
        rc = run_collective(c, 0, true, problems);
        if (rc != WEFT_SUCCESS)
            problems.push_back(std::string("the warm-up with every rank alive failed: ") + weft_strerror(rc) + ": " +
                               weft_comm_last_error(c));
    }
    MPI_Barrier(MPI_COMM_WORLD);   /* the last MPI call the victim makes */

    if (victim) {
        raise(g_run.mode == "kill" ? SIGKILL : SIGSTOP);
        for (;;)
            pause();   /* stopped, then killed by a survivor */
    }
    usleep(200000);   /* the victim's signal was raised by now */

    double took;
    std::string err;
    {
        Watchdog wd(g_run.timeout + 10, "the " + g_run.kase + " with rank 2 gone");
        const double t0 = now_s();
        rc = run_collective(c, 1, false, problems);
        took = now_s() - t0;
        err = weft_comm_last_error(c);
    }
    char line[512];
    std::snprintf(line, sizeof line, "%s returned %s after %.2f s", g_run.kase.c_str(), weft_strerror(rc), took);
    const std::string outcome = line;
    if (rc == WEFT_SUCCESS)
        problems.push_back(g_run.kase + " succeeded with rank 2 gone");
    if (took > g_run.timeout + 1)
        problems.push_back(outcome + ", more than WEFT_TIMEOUT + 1 s");
    if (rc != WEFT_SUCCESS)
        check_error_names_victim(err, problems);

    /* Survivors in step (the slowest is out of its failed call), then p2p.
     * weft makes progress only inside weft calls: a survivor whose part of
     * the failed call ended early must keep answering the others' messages
     * of that call (a large one announced to it is refused, which frees the
     * sender's call) while it waits, as an application would by calling
     * weft; a plain MPI_Barrier would leave a slower survivor waiting on it
     * until WEFT_TIMEOUT. So: MPI_Ibarrier, tested between weft progress
     * passes (weft_test on a receive from self that a final send matches). */
    progressing_barrier(c, survivors_comm, problems);
    {
        Watchdog wd(2 * g_run.timeout + 10, "the survivors' p2p ring");
        survivor_ring(c, survivors, my_index, problems);
    }
    MPI_Barrier(survivors_comm);
    if (my_index == 0)
        kill_stopped_victim();

    double destroy_took;
    {
        Watchdog wd(g_run.timeout + 10, "weft_comm_destroy with rank 2 gone");
        const double t0 = now_s();
        rc = weft_comm_destroy(c);
        destroy_took = now_s() - t0;
    }
    std::snprintf(line, sizeof line, "; destroy returned %s after %.2f s", weft_strerror(rc), destroy_took);
    if (destroy_took > g_run.timeout + 2)
        problems.push_back(std::string("destroy took more than WEFT_TIMEOUT + 2 s") + line);

    /* Every survivor's line is out before any survivor exits. */
    const bool ok = problems.empty();
    const std::string detail = outcome + line + " | last error: " + err + (ok ? "" : " | " + join(problems));
    std::printf("%s rank %d %s %s: %s\n", ok ? "FAULT-OK" : "FAULT-FAIL", g_run.rank, g_run.kase.c_str(),
                g_run.mode.c_str(), detail.c_str());
    std::fflush(stdout);
    {
        Watchdog wd(20, "the survivors' last barrier");
        MPI_Barrier(survivors_comm);
    }
    kill_stopped_victim();   /* in case the first survivor could not */
    _exit(ok ? 0 : 1);
}
