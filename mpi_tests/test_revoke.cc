/*
 * weft_comm_revoke and weft_comm_shrink (issue 28), np 4.
 *
 *   weft_mpi_revoke    WEFT_REVOKE_CASE=revoke|exclude|kill|stop
 *
 * revoke  No rank fails. After a barrier, rank 0 revokes the comm from a
 *         second thread 0.3 s later while its main thread waits in a
 *         weft_recv nobody serves; ranks 1 and 2 are in a 1 MiB
 *         weft_allreduce the others never call, rank 3 in a weft_wait of
 *         a receive nobody serves. Every rank's call must return
 *         WEFT_ERR_REVOKED, naming rank 0, within 1 s of the revoke (+1 s
 *         of slack for a loaded machine). Then later calls (a collective, a
 *         send, a message pipe) fail the same way at once, the async error
 *         says so, a second revoke is harmless, and weft_comm_shrink gives
 *         a comm of all 4 ranks in the same order, whose allreduce is exact.
 * exclude Rank 3 lives but is left out: it revokes the comm and destroys
 *         it; ranks 0-2 call weft_comm_shrink_excluding({3}) and must get
 *         their 3-rank comm without waiting WEFT_TIMEOUT for rank 3.
 * kill    Rank 2 SIGKILLs itself before its 6th allreduce of a loop.
 * stop    Rank 2 SIGSTOPs itself there (rank 0 SIGKILLs it at the end).
 *         WEFT_REVOKE_OP picks the loop's operation (default allreduce;
 *         iallreduce, allgather, bcast, reduce, alltoall, barrier, p2p:
 *         a ring of sends and receives): the matrix of revoke.cmake.
 *         The survivors' allreduce must fail naming rank 2; each then calls
 *         weft_comm_shrink and must get a comm of 3 ranks -- old ranks 0, 1
 *         and 3, now 0, 1, 2 -- whose allreduce is exact; the time from the
 *         failed call to the new comm is printed.
 * Every rank judges itself; the new comm's rank 0 prints REVOKE-ALL-OK once
 * the new comm's allreduce of every rank's verdict says all passed (in the
 * kill/stop cases MPI_Finalize would wait for the dead rank: _exit). Any
 * failure prints REVOKE-FAIL; a watchdog ends a rank that hangs.
 */
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"

namespace {

constexpr int kVictim = 2;

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double wall_s()
{
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int g_rank = -1;
std::atomic<const char *> g_stage{"start"};

[[noreturn]] void fail(const std::string &what)
{
    std::printf("REVOKE-FAIL rank %d: %s\n", g_rank, what.c_str());
    std::fflush(stdout);
    _exit(1);
}

void check(bool ok, const std::string &what)
{
    if (!ok)
        fail(what);
}

std::string last(weft_comm_t *c) { return weft_comm_last_error(c) ? weft_comm_last_error(c) : "(none)"; }

void start_watchdog(double s)
{
    std::thread([s] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        fail("watchdog: still in " + std::string(g_stage.load()) + " after " + std::to_string((int)s) + " s");
    }).detach();
}

/* An allreduce of every rank's old rank + 1 on comm: exact or not. */
bool allreduce_exact(weft_comm_t *c, const std::vector<int> &old_ranks, int mine)
{
    const size_t count = 100000;   /* 400 KB: past every eager limit */
    std::vector<int32_t> in(count, mine + 1), out(count, -1);
    int rc = weft_allreduce(c, in.data(), out.data(), count, WEFT_INT32, WEFT_SUM);
    if (rc != WEFT_SUCCESS) {
        std::printf("rank %d: allreduce on the new comm: %s\n", g_rank, last(c).c_str());
        return false;
    }
    int32_t want = 0;
    for (int r : old_ranks)
        want += r + 1;
    for (size_t i = 0; i < count; i++)
        if (out[i] != want)
            return false;
    return true;
}

/* The new comm's ranks agree every one of them passed; its rank 0 says so. */
void all_ok(weft_comm_t *nc)
{
    g_stage = "final agreement";
    int32_t one = 1, sum = 0;
    int rc = weft_allreduce(nc, &one, &sum, 1, WEFT_INT32, WEFT_SUM);
    check(rc == WEFT_SUCCESS && sum == weft_comm_size(nc), "the final allreduce: " + last(nc));
    if (weft_comm_rank(nc) == 0)
        std::printf("REVOKE-ALL-OK %d ranks\n", sum);
    std::fflush(stdout);
}

void case_revoke(weft_comm_t *c, int rank, int size)
{
    std::vector<int32_t> in(1 << 18, rank), out(1 << 18);
    char dummy[16];
    /* Refused arguments: nothing done, the comm stays usable everywhere. */
    g_stage = "argument checks";
    weft_comm_t *sentinel = reinterpret_cast<weft_comm_t *>(0x5678), *nc0 = sentinel;
    int self = rank, out_of_range = size;
    check(weft_comm_shrink(c, nullptr) == WEFT_ERR_INVALID_ARG, "shrink with a NULL newcomm");
    check(weft_comm_shrink_excluding(c, &self, 1, &nc0) == WEFT_ERR_INVALID_ARG &&
              last(c).find("this rank itself") != std::string::npos,
          "shrink excluding this rank: " + last(c));
    check(weft_comm_shrink_excluding(c, &out_of_range, 1, &nc0) == WEFT_ERR_INVALID_ARG, "an out-of-range rank");
    check(weft_comm_shrink_excluding(c, nullptr, 1, &nc0) == WEFT_ERR_INVALID_ARG, "a NULL list");
    check(nc0 == sentinel, "newcomm set by a refused shrink");
    check(weft_barrier(c) == WEFT_SUCCESS, "a barrier after the refused calls: " + last(c));
    /* A message pipe's pending operation ends too: a descriptor request on
     * a pipe to rank - 1, which writes nothing. */
    weft_pipe_t *to_next = nullptr, *from_prev = nullptr;
    check(weft_pipe_open(c, (rank + 1) % size, 11, &to_next) == WEFT_SUCCESS, "pipe open: " + last(c));
    check(weft_pipe_open(c, (rank + size - 1) % size, 11, &from_prev) == WEFT_SUCCESS, "pipe open: " + last(c));
    static std::atomic<int> desc_err{-1};
    static std::string desc_why;
    check(weft_pipe_read_descriptor(
              from_prev,
              [](weft_pipe_t *, int err, const char *why, const weft_pipe_descriptor_t *, void *) {
                  desc_why = why ? why : "";
                  desc_err = err;
              },
              nullptr) == WEFT_SUCCESS,
          "read_descriptor: " + last(c));
    g_stage = "waiting for the revoke";
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    std::thread revoker;
    int rc;
    if (rank == 0) {
        revoker = std::thread([c] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            int r = weft_comm_revoke(c);
            check(r == WEFT_SUCCESS, "weft_comm_revoke returned " + std::to_string(r));
        });
        rc = weft_recv(c, dummy, sizeof dummy, 1, 5, nullptr);
    } else if (rank == 3) {
        weft_request_t *req = nullptr;
        check(weft_irecv(c, dummy, sizeof dummy, 2, 5, &req) == WEFT_SUCCESS, "irecv: " + last(c));
        rc = weft_wait(req, nullptr);
    } else {
        rc = weft_allreduce(c, in.data(), out.data(), in.size(), WEFT_INT32, WEFT_SUM);
    }
    const double took = now_s() - t0;
    if (revoker.joinable())
        revoker.join();
    check(rc == WEFT_ERR_REVOKED, "the pending call returned " + std::to_string(rc) + " (" + last(c) + ")");
    check(last(c).find("revoked by rank 0") != std::string::npos, "the text does not name rank 0: " + last(c));
    check(took < 0.3 + 1.0 + 1.0, "the pending call ended " + std::to_string(took) + " s after the barrier");
    std::printf("rank %d: pending call ended %.3f s after the barrier (revoke at 0.3 s): %s\n", rank, took,
                last(c).c_str());

    g_stage = "later calls";
    weft_request_t *req = nullptr;
    check(weft_barrier(c) == WEFT_ERR_REVOKED, "a later barrier: " + last(c));
    check(weft_isend(c, dummy, 1, (rank + 1) % size, 0, &req) == WEFT_ERR_REVOKED, "a later isend: " + last(c));
    check(last(c).find("revoked by rank 0") != std::string::npos, "a later call's text: " + last(c));
    weft_pipe_t *pipe = nullptr;
    check(weft_pipe_open(c, (rank + 1) % size, 3, &pipe) == WEFT_ERR_REVOKED, "a later pipe open: " + last(c));
    check(weft_comm_async_error(c) == WEFT_ERR_REVOKED, "weft_comm_async_error");
    g_stage = "the message pipe's descriptor request";
    for (double t = now_s(); desc_err.load() < 0 && now_s() - t < 3;)
        weft_progress(c);
    check(desc_err.load() == WEFT_ERR_REVOKED && desc_why.find("revoked by rank 0") != std::string::npos,
          "the pending descriptor request ended with " + std::to_string(desc_err.load()) + ": " + desc_why);
    check(weft_pipe_close(to_next) == WEFT_SUCCESS && weft_pipe_close(from_prev) == WEFT_SUCCESS,
          "closing the pipes after the revoke");
    check(weft_comm_revoke(c) == WEFT_SUCCESS, "a second revoke");

    g_stage = "weft_comm_shrink";
    const double s0 = now_s();
    weft_comm_t *nc = nullptr;
    rc = weft_comm_shrink(c, &nc);
    check(rc == WEFT_SUCCESS && nc != nullptr, "weft_comm_shrink: " + last(c));
    std::printf("rank %d: weft_comm_shrink took %.3f s\n", rank, now_s() - s0);
    check(weft_comm_size(nc) == size && weft_comm_rank(nc) == rank, "the new comm's size or rank");
    check(allreduce_exact(nc, {0, 1, 2, 3}, rank), "the new comm's allreduce is not exact");
    all_ok(nc);
    g_stage = "destroy";
    int d1 = weft_comm_destroy(c);
    check(d1 == WEFT_SUCCESS, "destroying the revoked comm: " + std::to_string(d1) + " " + weft_last_error());
    check(weft_comm_destroy(nc) == WEFT_SUCCESS, std::string("destroying the new comm: ") + weft_last_error());
}

/* Rank 3 lives but is left out: it revokes and destroys its handle; the
 * others shrink excluding it, and nobody waits WEFT_TIMEOUT for it. */
void case_exclude(weft_comm_t *c, int rank)
{
    /* MPI's barrier: a weft barrier's last rank may still be in it when
     * the others' shrink revokes the comm (it would then fail, rightly). */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 3) {
        g_stage = "the excluded rank's revoke and destroy";
        check(weft_comm_revoke(c) == WEFT_SUCCESS, "revoke on the excluded rank");
        int d = weft_comm_destroy(c);
        check(d == WEFT_SUCCESS, "destroy on the excluded rank: " + std::to_string(d) + " " + weft_last_error());
        return;
    }
    g_stage = "weft_comm_shrink_excluding";
    const int excl = 3;
    const double s0 = now_s();
    weft_comm_t *nc = nullptr;
    int rc = weft_comm_shrink_excluding(c, &excl, 1, &nc);
    const double took = now_s() - s0;
    check(rc == WEFT_SUCCESS && nc != nullptr, "weft_comm_shrink_excluding: " + last(c));
    std::printf("rank %d: weft_comm_shrink_excluding took %.3f s\n", rank, took);
    check(took < 2.5, "the shrink waited for the excluded rank (WEFT_TIMEOUT is 5 s)");
    check(weft_comm_size(nc) == 3 && weft_comm_rank(nc) == rank, "the new comm's size or rank");
    check(allreduce_exact(nc, {0, 1, 2}, rank), "the new comm's allreduce is not exact");
    all_ok(nc);
    g_stage = "destroy";
    check(weft_comm_destroy(nc) == WEFT_SUCCESS, std::string("destroying the new comm: ") + weft_last_error());
    int d = weft_comm_destroy(c);
    check(d == WEFT_SUCCESS, "destroying the revoked comm: " + std::to_string(d) + " " + weft_last_error());
}

/* One operation of the loop the victim dies in (WEFT_REVOKE_OP): a
 * collective, a non-blocking one, or a ring of sends and receives. */
int one_op(weft_comm_t *c, const std::string &op, int rank, int size, std::vector<int32_t> &in,
           std::vector<int32_t> &out)
{
    const size_t n = in.size();
    if (op == "allreduce")
        return weft_allreduce(c, in.data(), out.data(), n, WEFT_INT32, WEFT_SUM);
    if (op == "iallreduce") {
        weft_request_t *req = nullptr;
        int rc = weft_iallreduce(c, in.data(), out.data(), n, WEFT_INT32, WEFT_SUM, &req);
        return rc != WEFT_SUCCESS ? rc : weft_wait(req, nullptr);
    }
    if (op == "allgather")
        return weft_allgather(c, in.data(), out.data(), n / size * sizeof(int32_t));
    if (op == "bcast")
        return weft_bcast(c, in.data(), n * sizeof(int32_t), 0);
    if (op == "reduce")
        return weft_reduce(c, in.data(), out.data(), n, WEFT_INT32, WEFT_SUM, 0);
    if (op == "alltoall")
        return weft_alltoall(c, in.data(), out.data(), n / size * sizeof(int32_t));
    if (op == "barrier")
        return weft_barrier(c);
    if (op == "p2p") {   /* to rank + 1, from rank - 1 */
        weft_request_t *r[2] = {nullptr, nullptr};
        int rc = weft_irecv(c, out.data(), n * sizeof(int32_t), (rank + size - 1) % size, 9, &r[0]);
        if (rc == WEFT_SUCCESS)
            rc = weft_isend(c, in.data(), n * sizeof(int32_t), (rank + 1) % size, 9, &r[1]);
        int w = weft_waitall(r[1] ? 2 : 1, r, nullptr);
        return rc != WEFT_SUCCESS ? rc : w;
    }
    fail("WEFT_REVOKE_OP=" + op + ": allreduce, iallreduce, allgather, bcast, reduce, alltoall, barrier or p2p");
}

void case_fail(weft_comm_t *c, int rank, bool stop, const std::vector<int> &pids)
{
    const char *env_op = std::getenv("WEFT_REVOKE_OP");
    const std::string op = env_op ? env_op : "allreduce";
    std::vector<int32_t> in(1 << 16, rank), out(1 << 16);
    int rc = WEFT_SUCCESS;
    double t_fail = 0;
    g_stage = "the loop the victim dies in";
    for (int i = 0; i < 1000 && rc == WEFT_SUCCESS; i++) {
        if (rank == kVictim && i == 5) {
            /* The wall clock (one host: the survivors' too), for the
             * fault-to-verdict times of docs/testing.md. */
            std::printf("REVOKE-FAULT t=%.6f\n", wall_s());
            std::fflush(stdout);
            raise(stop ? SIGSTOP : SIGKILL);
        }
        rc = one_op(c, op, rank, weft_comm_size(c), in, out);
        t_fail = now_s();
    }
    std::printf("REVOKE-VERDICT rank %d t=%.6f\n", rank, wall_s());
    check(rc != WEFT_SUCCESS, "the " + op + " loop never failed");
    check(last(c).find("rank 2") != std::string::npos, "the failure does not name rank 2: " + last(c));
    std::printf("rank %d: %s failed: %s\n", rank, op.c_str(), last(c).c_str());

    g_stage = "weft_comm_shrink";
    weft_comm_t *nc = nullptr;
    rc = weft_comm_shrink(c, &nc);
    check(rc == WEFT_SUCCESS && nc != nullptr, "weft_comm_shrink: " + last(c));
    std::printf("rank %d: weft_comm_shrink gave rank %d of %d, %.3f s after the failed call\n", rank,
                weft_comm_rank(nc), weft_comm_size(nc), now_s() - t_fail);
    const int size = weft_comm_size(c);
    std::vector<int> survivors;
    for (int r = 0; r < size; r++)
        if (r != kVictim)
            survivors.push_back(r);
    check(weft_comm_size(nc) == size - 1 && weft_comm_rank(nc) == (rank < kVictim ? rank : rank - 1),
          "the new comm's size or rank");
    check(allreduce_exact(nc, survivors, rank), "the new comm's allreduce is not exact");
    check(weft_barrier(c) == WEFT_ERR_REVOKED, "the old comm after the shrink: " + last(c));
    all_ok(nc);
    g_stage = "destroy";
    weft_comm_destroy(c);   /* a rank failed: its code says so; it must only end */
    check(weft_comm_destroy(nc) == WEFT_SUCCESS, std::string("destroying the new comm: ") + weft_last_error());
    if (stop && rank == 0)
        kill(pids[kVictim], SIGKILL);
}

}  // namespace

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    g_rank = rank;
    const char *env = std::getenv("WEFT_REVOKE_CASE");
    const std::string which = env ? env : "revoke";
    if (size != 4 && !(size > 4 && (which == "kill" || which == "stop")))
        fail("needs 4 ranks (kill and stop: 4 or more, by hand)");
    std::vector<int> pids(size);
    int pid = (int)getpid();
    MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
    start_watchdog(60);
    weft_comm_t *c = nullptr;
    g_stage = "weft_comm_create";
    check(weft_comm_create(MPI_COMM_WORLD, &c) == WEFT_SUCCESS, std::string("create: ") + weft_last_error());
    if (which == "revoke" || which == "exclude") {
        if (which == "revoke")
            case_revoke(c, rank, size);
        else
            case_exclude(c, rank);
        g_stage = "MPI_Finalize";
        MPI_Finalize();
        return 0;
    }
    if (which != "kill" && which != "stop")
        fail("WEFT_REVOKE_CASE=" + which + ": revoke, exclude, kill or stop");
    case_fail(c, rank, which == "stop", pids);
    std::fflush(stdout);
    _exit(0);   /* MPI_Finalize would wait for the dead rank */
}
