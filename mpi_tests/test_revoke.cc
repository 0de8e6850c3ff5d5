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
 * skip    Rank 2 lives but skips that call (it waits in MPI_Barrier).
 * argerr  Rank 2 makes that call with an argument its own check refuses
 *         (an unknown dtype, a NULL buffer, a root out of range, a NULL
 *         newcomm): it gets WEFT_ERR_INVALID_ARG at once.
 * size, kind, root  Rank 2 makes that call with valid arguments but another
 *         operation: half the size; a barrier (an allreduce where the
 *         others barrier); root 1 where the others use root 0 (bcast,
 *         reduce); uint32 where the others reduce int32 (dtype), max where
 *         they sum (op). Its own call must fail too.
 * link    Rank 2 shuts down its tcp connections to rank WEFT_REVOKE_LINK_PEER
 *         (default 1): both live on and go on with the loop. Every rank's
 *         call must fail (rank 2's may complete when nothing of it needed
 *         the link any more: then its next one) naming the link; the
 *         shrink leaves rank 2 out (of one broken link, the higher rank), and rank
 *         2's own weft_comm_shrink must say it leaves.
 *         WEFT_REVOKE_OP picks the loop's operation (default allreduce;
 *         iallreduce, allgather, bcast, reduce, alltoall, barrier, p2p:
 *         a ring of sends and receives; split: weft_comm_split and the new
 *         comm's destroy; pipe: a ring of 256 KiB message-pipe messages;
 *         init: weft_comm_init of all ranks and its destroy; stream, in
 *         weft_mpi_revoke_stream only: weft_allreduce_on_stream on the
 *         emulated CUDA runtime, its failure read as the comm's async
 *         error): the matrix of revoke.cmake.
 *         Every other rank's call must fail naming rank 2 within
 *         WEFT_TIMEOUT + 2 s of its start. Then each calls weft_comm_shrink:
 *         after kill, stop and link it must give a comm of 3 ranks -- old ranks 0,
 *         1 and 3, now 0, 1, 2 -- after skip and argerr (rank 2 lives and
 *         calls the shrink too) one of all 4; its allreduce must be exact.
 *         After argerr the old comm must first still work: the refused call
 *         took its number on every rank, so an allreduce on it is exact.
 *         The time from the failed call to the new comm is printed.
 * WEFT_REVOKE_SPLIT=1 (kill, skip): the loop runs on a comm split from the
 * world one with the ranks reversed, whose rank 2 is world rank 1: every
 * survivor's error must name it as "rank 2 (parent rank 1)".
 * Every rank judges itself; the new comm's rank 0 prints REVOKE-ALL-OK once
 * the new comm's allreduce of every rank's verdict says all passed (in the
 * kill/stop cases MPI_Finalize would wait for the dead rank: _exit). Any
 * failure prints REVOKE-FAIL; a watchdog ends a rank that hangs.
 */
#include <mpi.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef WEFT_REVOKE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
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
        std::printf("rank %d: allreduce_exact: %s\n", g_rank, last(c).c_str());
        return false;
    }
    int32_t want = 0;
    for (int r : old_ranks)
        want += r + 1;
    for (size_t i = 0; i < count; i++)
        if (out[i] != want) {
            std::printf("rank %d: allreduce_exact: element %zu is %d, not %d\n", g_rank, i, (int)out[i], (int)want);
            return false;
        }
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

/* The text of the last failure of an operation that reports through a
 * callback (a message pipe's) or not on the comm (weft_comm_init): what
 * the survivors' check reads instead of weft_comm_last_error. */
std::string g_why;

/* Op pipe: each rank writes one 256 KiB message on a message pipe to
 * rank + 1 and reads one from rank - 1 (pipes opened once, id 21), moving
 * them with weft_progress until both are called back. The first error a
 * callback reports is the result, its text in g_why. */
struct PipeRound {
    weft_comm_t *c = nullptr;
    weft_pipe_t *to_next = nullptr, *from_prev = nullptr;
    void *dst = nullptr;
    size_t dst_bytes = 0;
    int writes_done = 0, reads_done = 0, err = WEFT_SUCCESS;
};

void pipe_note(PipeRound *r, int err, const char *why)
{
    if (err != WEFT_SUCCESS && r->err == WEFT_SUCCESS) {
        r->err = err;
        g_why = why ? why : "";
    }
}

int pipe_op(weft_comm_t *c, int rank, int size, std::vector<int32_t> &in, std::vector<int32_t> &out)
{
    static PipeRound r;
    if (r.to_next == nullptr) {
        r.c = c;
        int rc = weft_pipe_open(c, (rank + 1) % size, 21, &r.to_next);
        if (rc == WEFT_SUCCESS)
            rc = weft_pipe_open(c, (rank + size - 1) % size, 21, &r.from_prev);
        if (rc != WEFT_SUCCESS)
            return rc;
    }
    r.writes_done = r.reads_done = 0;
    r.dst = out.data();
    r.dst_bytes = out.size() * sizeof(int32_t);
    weft_pipe_payload_t pl = {in.data(), in.size() * sizeof(int32_t), nullptr, 0};
    weft_pipe_message_t msg = {nullptr, 0, 1, &pl, 0, nullptr};
    int rc = weft_pipe_write(
        r.to_next, &msg,
        [](weft_pipe_t *, int err, const char *why, void *arg) {
            auto *rr = static_cast<PipeRound *>(arg);
            pipe_note(rr, err, why);
            rr->writes_done = 1;
        },
        &r);
    if (rc != WEFT_SUCCESS)
        return rc;
    rc = weft_pipe_read_descriptor(
        r.from_prev,
        [](weft_pipe_t *p, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg) {
            auto *rr = static_cast<PipeRound *>(arg);
            if (err != WEFT_SUCCESS || d->num_payloads != 1 || d->payloads[0].bytes > rr->dst_bytes) {
                pipe_note(rr, err != WEFT_SUCCESS ? err : WEFT_ERR_INTERNAL,
                          err != WEFT_SUCCESS ? why : "the test's descriptor is not one payload of 256 KiB");
                rr->reads_done = 1;
                return;
            }
            weft_pipe_buffer_t b = {rr->dst, rr->dst_bytes};
            weft_pipe_allocation_t a = {1, &b, 0, nullptr};
            int rrc = weft_pipe_read(
                p, &a,
                [](weft_pipe_t *, int err2, const char *why2, void *arg2) {
                    auto *r2 = static_cast<PipeRound *>(arg2);
                    pipe_note(r2, err2, why2);
                    r2->reads_done = 1;
                },
                rr);
            if (rrc != WEFT_SUCCESS) {
                pipe_note(rr, rrc, weft_comm_last_error(rr->c));
                rr->reads_done = 1;
            }
        },
        &r);
    if (rc != WEFT_SUCCESS)
        return rc;
    /* Until both ends of this round are called back: weft must end them
     * (the watchdog fails the test otherwise). An error ends the round at
     * once: the other side's callback may wait for a peer that is gone. */
    while (!(r.writes_done && r.reads_done) && r.err == WEFT_SUCCESS) {
        rc = weft_progress(c);
        if (rc != WEFT_SUCCESS && r.err == WEFT_SUCCESS) {
            g_why = last(c);
            return rc;
        }
    }
    return r.err;
}

/* Op init: a new comm of all ranks by weft_comm_init (rank 0 makes the
 * unique id and sends it to each rank with MPI_Send: no MPI collective,
 * which would wait for a dead rank), and its destroy. */
int init_op(int rank, int size)
{
    weft_unique_id_t id;
    if (rank == 0) {
        if (weft_get_unique_id(&id) != WEFT_SUCCESS)
            fail(std::string("weft_get_unique_id: ") + weft_last_error());
        for (int r = 1; r < size; r++)
            MPI_Send(&id, sizeof id, MPI_BYTE, r, 77, MPI_COMM_WORLD);
    } else {
        MPI_Recv(&id, sizeof id, MPI_BYTE, 0, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    weft_comm_t *nc = nullptr;
    int rc = weft_comm_init(&id, size, rank, &nc);
    if (rc != WEFT_SUCCESS) {
        g_why = weft_last_error() ? weft_last_error() : "";
        return rc;
    }
    rc = weft_comm_destroy(nc);
    if (rc != WEFT_SUCCESS)
        g_why = weft_last_error() ? weft_last_error() : "";
    return rc;
}

#ifdef WEFT_REVOKE_CUDA
/* Op stream: an allreduce on a CUDA stream (the emulated runtime), in
 * device memory; its failure shows once the stream is done, as the comm's
 * async error (weft_comm_last_error says why). */
int stream_op(weft_comm_t *c, size_t n)
{
    static cudaStream_t s;
    static void *din = nullptr, *dout = nullptr;
    if (din == nullptr) {
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
            cudaMalloc(&din, n * sizeof(int32_t)) != cudaSuccess || cudaMalloc(&dout, n * sizeof(int32_t)) != cudaSuccess)
            fail("the stream op's CUDA setup (WEFT_CUDA_LIB must be the emulator the test links)");
    }
    int rc = weft_allreduce_on_stream(c, din, dout, n, WEFT_INT32, WEFT_SUM, s);
    if (rc != WEFT_SUCCESS)
        return rc;
    if (cudaStreamSynchronize(s) != cudaSuccess)
        fail("cudaStreamSynchronize failed");
    return weft_comm_async_error(c);
}
#endif

/* Fault link: this process's TCP connections, as "local|peer" endpoint
 * pairs ("a.b.c.d:port"), with their descriptors (every socket in
 * /proc/self/fd that has a peer). */
std::string endpoint(const sockaddr_storage &a)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (a.ss_family == AF_INET) {
        const auto *v4 = reinterpret_cast<const sockaddr_in *>(&a);
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
        port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
        const auto *v6 = reinterpret_cast<const sockaddr_in6 *>(&a);
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
        port = ntohs(v6->sin6_port);
    }
    return std::string(host) + ":" + std::to_string(port);
}

struct TcpConn { int fd; std::string local, peer; };

std::vector<TcpConn> tcp_connections()
{
    std::vector<TcpConn> v;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr)
        return v;
    while (dirent *e = readdir(d)) {
        const int fd = std::atoi(e->d_name);
        struct stat st;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
            continue;
        sockaddr_storage l{}, p{};
        socklen_t ll = sizeof l, pl = sizeof p;
        int type = 0;
        socklen_t tl = sizeof type;
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM ||
            getsockname(fd, reinterpret_cast<sockaddr *>(&l), &ll) != 0 ||
            getpeername(fd, reinterpret_cast<sockaddr *>(&p), &pl) != 0 ||
            (l.ss_family != AF_INET && l.ss_family != AF_INET6))
            continue;
        v.push_back({fd, endpoint(l), endpoint(p)});
    }
    closedir(d);
    return v;
}

/* Every rank calls this at the same point: rank `partner` tells the
 * others its connections' local endpoints, and rank `victim` shuts down
 * each of its connections whose far end is one of them -- the link
 * between the two breaks (both sides see it closed) while both processes
 * live on. Returns how many connections it shut down (victim only). */
int break_link(int rank, int victim, int partner)
{
    std::string mine;
    if (rank == partner)
        for (const TcpConn &t : tcp_connections())
            mine += t.local + "\n";
    int len = (int)mine.size();
    MPI_Bcast(&len, 1, MPI_INT, partner, MPI_COMM_WORLD);
    mine.resize(len);
    MPI_Bcast(&mine[0], len, MPI_CHAR, partner, MPI_COMM_WORLD);
    int cut = 0;
    if (rank == victim)
        for (const TcpConn &t : tcp_connections())
            if (mine.find(t.peer + "\n") != std::string::npos && shutdown(t.fd, SHUT_RDWR) == 0)
                cut++;
    return cut;
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
    if (op == "split") {   /* a comm creation, and the new comm's destroy */
        weft_comm_t *nc = nullptr;
        int rc = weft_comm_split(c, 0, rank, &nc);
        return rc != WEFT_SUCCESS ? rc : weft_comm_destroy(nc);
    }
    if (op == "p2p") {   /* to rank + 1, from rank - 1 */
        weft_request_t *r[2] = {nullptr, nullptr};
        int rc = weft_irecv(c, out.data(), n * sizeof(int32_t), (rank + size - 1) % size, 9, &r[0]);
        if (rc == WEFT_SUCCESS)
            rc = weft_isend(c, in.data(), n * sizeof(int32_t), (rank + 1) % size, 9, &r[1]);
        int w = weft_waitall(r[1] ? 2 : 1, r, nullptr);
        return rc != WEFT_SUCCESS ? rc : w;
    }
    if (op == "pipe")
        return pipe_op(c, rank, size, in, out);
    if (op == "init")
        return init_op(rank, size);
#ifdef WEFT_REVOKE_CUDA
    if (op == "stream")
        return stream_op(c, in.size());
#endif
    fail("WEFT_REVOKE_OP=" + op + ": allreduce, iallreduce, allgather, bcast, reduce, alltoall, barrier, split, p2p, "
         "pipe, init or (weft_mpi_revoke_stream) stream");
}

/* The same operation as one_op, with an argument the caller's own check
 * refuses before anything moves (fault argerr). The barrier has none. */
int one_op_refused(weft_comm_t *c, const std::string &op, int size, std::vector<int32_t> &in,
                   std::vector<int32_t> &out)
{
    const size_t n = in.size();
    const weft_dtype_t bad_dtype = static_cast<weft_dtype_t>(97);
    if (op == "allreduce")
        return weft_allreduce(c, in.data(), out.data(), n, bad_dtype, WEFT_SUM);
    if (op == "iallreduce") {
        weft_request_t *req = nullptr;
        return weft_iallreduce(c, in.data(), out.data(), n, bad_dtype, WEFT_SUM, &req);
    }
    if (op == "allgather")
        return weft_allgather(c, in.data(), nullptr, n / size * sizeof(int32_t));
    if (op == "bcast")
        return weft_bcast(c, in.data(), n * sizeof(int32_t), -1);
    if (op == "reduce")
        return weft_reduce(c, in.data(), out.data(), n, WEFT_INT32, WEFT_SUM, size);
    if (op == "alltoall")
        return weft_alltoall(c, nullptr, out.data(), n / size * sizeof(int32_t));
    if (op == "split")
        return weft_comm_split(c, 0, 0, nullptr);
    fail("WEFT_REVOKE_CASE=argerr: no refused form of WEFT_REVOKE_OP=" + op);
}

/* The same call number with another operation than the others' (faults
 * size, kind, root, dtype, op): valid arguments, so it is made, and it cannot match.
 * size: half the count (or bytes); kind: a barrier where the others call
 * op (an allreduce of one element where they call a barrier); root: root
 * 1 where they use root 0. */
int one_op_mismatched(weft_comm_t *c, const std::string &op, const std::string &fault, int size,
                      std::vector<int32_t> &in, std::vector<int32_t> &out)
{
    const size_t n = in.size();
    if (fault == "kind") {
        if (op == "barrier")
            return weft_allreduce(c, in.data(), out.data(), 1, WEFT_INT32, WEFT_SUM);
        return weft_barrier(c);
    }
    if (fault == "dtype" || fault == "op") {   /* the same bytes: uint32 for int32; max for sum */
        const weft_dtype_t dt = fault == "dtype" ? WEFT_UINT32 : WEFT_INT32;
        const weft_op_t o = fault == "op" ? WEFT_MAX : WEFT_SUM;
        if (op == "allreduce")
            return weft_allreduce(c, in.data(), out.data(), n, dt, o);
        if (op == "iallreduce") {
            weft_request_t *req = nullptr;
            int rc = weft_iallreduce(c, in.data(), out.data(), n, dt, o, &req);
            return rc != WEFT_SUCCESS ? rc : weft_wait(req, nullptr);
        }
        if (op == "reduce")
            return weft_reduce(c, in.data(), out.data(), n, dt, o, 0);
        fail("WEFT_REVOKE_CASE=" + fault + ": WEFT_REVOKE_OP=" + op + " has no " + fault);
    }
    if (fault == "root") {
        if (op == "bcast")
            return weft_bcast(c, in.data(), n * sizeof(int32_t), 1);
        if (op == "reduce")
            return weft_reduce(c, in.data(), out.data(), n, WEFT_INT32, WEFT_SUM, 1);
        fail("WEFT_REVOKE_CASE=root: WEFT_REVOKE_OP=" + op + " has no root");
    }
    if (op == "allreduce")
        return weft_allreduce(c, in.data(), out.data(), n / 2, WEFT_INT32, WEFT_SUM);
    if (op == "iallreduce") {
        weft_request_t *req = nullptr;
        int rc = weft_iallreduce(c, in.data(), out.data(), n / 2, WEFT_INT32, WEFT_SUM, &req);
        return rc != WEFT_SUCCESS ? rc : weft_wait(req, nullptr);
    }
    if (op == "allgather")
        return weft_allgather(c, in.data(), out.data(), n / size * sizeof(int32_t) / 2);
    if (op == "bcast")
        return weft_bcast(c, in.data(), n * sizeof(int32_t) / 2, 0);
    if (op == "reduce")
        return weft_reduce(c, in.data(), out.data(), n / 2, WEFT_INT32, WEFT_SUM, 0);
    if (op == "alltoall")
        return weft_alltoall(c, in.data(), out.data(), n / size * sizeof(int32_t) / 2);
    fail("WEFT_REVOKE_CASE=size: WEFT_REVOKE_OP=" + op + " has no size");
}

/* How a survivor's failure must name the victim (WEFT_REVOKE_SPLIT: with
 * its number in the parent comm too). */
std::string g_victim_name = "rank 2";

/* Fault link: the rank whose link to rank 2 breaks (WEFT_REVOKE_LINK_PEER,
 * default 1; on two virtual nodes 0, the other node's leader, which the
 * message path's collectives use). */
int link_peer()
{
    const char *e = std::getenv("WEFT_REVOKE_LINK_PEER");
    return e ? std::atoi(e) : 1;
}

void case_fail(weft_comm_t *c, int rank, const std::string &fault, const std::vector<int> &pids)
{
    const char *env_op = std::getenv("WEFT_REVOKE_OP");
    const std::string op = env_op ? env_op : "allreduce";
    const bool dies = fault == "kill" || fault == "stop";
    const int size = weft_comm_size(c);
    std::vector<int32_t> in(1 << 16, rank), out(1 << 16);
    int rc = WEFT_SUCCESS;
    int failed_at = -1;   /* the loop's index of the call that failed (the victim's: its fault) */
    double t_fail = 0, t_fault = 0, t_call = 0;
    const char *env_timeout = std::getenv("WEFT_TIMEOUT");
    const double limit = (env_timeout ? std::atof(env_timeout) : 60.0) + 2.0;
    g_stage = "the loop the fault happens in";
    for (int i = 0; i < 1000 && rc == WEFT_SUCCESS; i++) {
        if (rank == kVictim && i == 5) {
            /* The wall clock (one host: the survivors' too), for the
             * fault-to-verdict times of docs/testing.md. */
            std::printf("REVOKE-FAULT t=%.6f\n", wall_s());
            std::fflush(stdout);
            t_fault = now_s();
            failed_at = i;
            if (fault == "link") {
                /* Rank 1's and rank 2's link breaks; all four go on with
                 * the loop (rank 2 may complete this call when nothing of
                 * it needed the link any more: then its next one fails). */
                const int cut = break_link(rank, kVictim, link_peer());
                std::printf("rank %d: shut down %d connection(s) to rank %d\n", rank, cut, link_peer());
                check(cut > 0, "no TCP connection to rank " + std::to_string(link_peer()) +
                                   " to break (it must reach rank 2 over tcp, and this operation use that link)");
                t_call = now_s();
                rc = one_op(c, op, rank, size, in, out);
                t_fail = now_s();
                continue;
            }
            if (dies)
                raise(fault == "stop" ? SIGSTOP : SIGKILL);
            if (fault == "skip")
                break;
            if (fault == "size" || fault == "kind" || fault == "root" || fault == "dtype" || fault == "op") {
                /* Its own call fails too (the others' messages meet it, or
                 * the census finds them in another operation). */
                rc = one_op_mismatched(c, op, fault, size, in, out);
                check(rc != WEFT_SUCCESS, "rank 2's mismatched " + op + " (" + fault + ") succeeded");
                std::printf("rank %d: its mismatched %s (%s) failed: %s\n", rank, op.c_str(), fault.c_str(),
                            last(c).c_str());
                break;
            }
            rc = one_op_refused(c, op, size, in, out);
            check(rc == WEFT_ERR_INVALID_ARG, "the refused " + op + " returned " + std::to_string(rc) + " (" +
                                                  last(c) + ")");
            break;
        }
        if (fault == "link" && i == 5)
            break_link(rank, kVictim, link_peer());
        t_call = now_s();
        rc = one_op(c, op, rank, size, in, out);
        t_fail = now_s();
        failed_at = i;
    }
    if (rank == kVictim && fault == "link") {
        const std::string why = g_why.empty() ? last(c) : g_why;
        const std::string peer = "rank " + std::to_string(link_peer());
        check(rc != WEFT_SUCCESS && why.find(peer) != std::string::npos,
              "rank 2's failure after its link to " + peer + " broke does not name it: " + why);
        check(t_fail - t_call <= limit, "rank 2's failed " + op + " returned " + std::to_string(t_fail - t_call) + " s after it started");
        std::printf("rank %d: %s failed: %s\n", rank, op.c_str(), why.c_str());
    }
    if (rank != kVictim) {
        std::printf("REVOKE-VERDICT rank %d t=%.6f\n", rank, wall_s());
        check(rc != WEFT_SUCCESS, "the " + op + " loop never failed");
        const std::string why = g_why.empty() ? last(c) : g_why;
        check(why.find(g_victim_name) != std::string::npos, "the failure does not name " + g_victim_name + ": " + why);
        /* From the failed call's start: no later than from the fault. */
        check(t_fail - t_call <= limit, "the failed " + op + " returned " + std::to_string(t_fail - t_call) +
                                            " s after it started (WEFT_TIMEOUT + 2 s: " + std::to_string(limit) + ")");
        std::printf("rank %d: %s failed: %s\n", rank, op.c_str(), why.c_str());
    }
    /* After one broken link the shrink leaves its higher rank out: rank 2. */
    const bool leaves = dies || fault == "link";
    std::vector<int> expect;   /* the new comm's members, as old ranks */
    for (int r = 0; r < size; r++)
        if (r != kVictim || !leaves)
            expect.push_back(r);
    if (!dies) {
        /* Rank 2 lives: everyone out of the failed call before the next. */
        g_stage = "MPI_Barrier after the fault";
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == kVictim)
            t_fail = t_fault;
    }
    if (fault != "kill" && fault != "stop" && fault != "skip" && fault != "link") {
        /* The refused (or mismatched) call took its number on rank 2 too: when every rank
         * failed that call, the old comm's next collective matches on every
         * rank, and is exact. A rank whose own part of it needed nothing of
         * rank 2's (a bcast's root, and over tcp its ring neighbour, whose
         * pieces all come from the root) may complete it, as the contract
         * allows (docs/api.md, Collectives), and go on to later calls the
         * others never make; its failure then names rank 2 at a later call
         * (checked above), and the comm is out of step for good. */
        std::vector<int> at(size);
        MPI_Allgather(&failed_at, 1, MPI_INT, at.data(), 1, MPI_INT, MPI_COMM_WORLD);
        const bool in_step = std::all_of(at.begin(), at.end(), [&](int a) { return a == at[kVictim]; });
        check(in_step || op == "bcast" || op == "reduce",
              "a rank failed another call than rank 2's refused one, in a " + op + " where every rank waits for rank 2");
        g_stage = "an allreduce on the old comm after the refused call";
        if (in_step)
            check(allreduce_exact(c, expect, rank), "the old comm's allreduce after the refused call is not exact");
        else if (rank == 0) {
            std::string calls;
            for (int a : at)
                calls += " " + std::to_string(a);
            std::printf("REVOKE-NOTE the ranks failed at loop calls%s: the old comm is out of step, no allreduce "
                        "on it\n", calls.c_str());
        }
        /* The shrink revokes the old comm: a rank out of this allreduce
         * first would end a slower rank's part of it. */
        MPI_Barrier(MPI_COMM_WORLD);
    }

    g_stage = "weft_comm_shrink";
    weft_comm_t *nc = nullptr;
    rc = weft_comm_shrink(c, &nc);
    if (leaves && rank == kVictim) {
        /* It lives, and learns it is out (fault link). */
        check(rc == WEFT_ERR_REVOKED && nc == nullptr && last(c).find("leaves") != std::string::npos,
              "rank 2's shrink after its link broke: " + std::to_string(rc) + " " + last(c));
        std::printf("rank %d: weft_comm_shrink: %s\n", rank, last(c).c_str());
        weft_comm_destroy(c);
        return;
    }
    check(rc == WEFT_SUCCESS && nc != nullptr, "weft_comm_shrink: " + last(c));
    std::printf("rank %d: weft_comm_shrink gave rank %d of %d, %.3f s after the failed call\n", rank,
                weft_comm_rank(nc), weft_comm_size(nc), now_s() - t_fail);
    const int new_rank = static_cast<int>(std::find(expect.begin(), expect.end(), rank) - expect.begin());
    check(weft_comm_size(nc) == (int)expect.size() && weft_comm_rank(nc) == new_rank,
          "the new comm's size or rank: rank " + std::to_string(weft_comm_rank(nc)) + " of " +
              std::to_string(weft_comm_size(nc)));
    check(allreduce_exact(nc, expect, rank), "the new comm's allreduce is not exact");
    check(weft_barrier(c) == WEFT_ERR_REVOKED, "the old comm after the shrink: " + last(c));
    all_ok(nc);
    g_stage = "destroy";
    weft_comm_destroy(c);   /* a rank may have failed: its code says so; it must only end */
    check(weft_comm_destroy(nc) == WEFT_SUCCESS, std::string("destroying the new comm: ") + weft_last_error());
    if (fault == "stop" && rank == 0)
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
    if (size != 4 && !(size > 4 && which != "revoke" && which != "exclude"))
        fail("needs 4 ranks (the fault cases: 4 or more, by hand)");
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
    if (which != "kill" && which != "stop" && which != "skip" && which != "argerr" && which != "size" &&
        which != "kind" && which != "root" && which != "dtype" && which != "op" && which != "link")
        fail("WEFT_REVOKE_CASE=" + which + ": revoke, exclude, kill, stop, skip, argerr, size, kind, root, dtype, op "
             "or link");
    if (std::getenv("WEFT_REVOKE_SPLIT") != nullptr) {
        /* On a comm split from the world one with the ranks reversed: its
         * rank 2 is world rank size - 3, and the verdicts name both. */
        if (which != "kill" && which != "skip")
            fail("WEFT_REVOKE_SPLIT: kill or skip");
        weft_comm_t *sc = nullptr;
        g_stage = "weft_comm_split (ranks reversed)";
        check(weft_comm_split(c, 0, size - 1 - rank, &sc) == WEFT_SUCCESS && sc != nullptr,
              std::string("split: ") + weft_last_error());
        check(weft_comm_rank(sc) == size - 1 - rank, "the reversed split's rank");
        g_victim_name = "rank 2 (parent rank " + std::to_string(size - 1 - kVictim) + ")";
        std::vector<int> spids(size);
        for (int r = 0; r < size; r++)
            spids[size - 1 - r] = pids[r];
        case_fail(sc, size - 1 - rank, which, spids);
    } else {
        case_fail(c, rank, which, pids);
    }
    std::fflush(stdout);
    _exit(0);   /* MPI_Finalize would wait for the dead rank */
}
