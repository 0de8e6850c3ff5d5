/*
 * A message pipe's peer dies mid-message (issue 14): "a failed peer fails
 * every pending operation of its pipes with the error that names it"
 * (include/weft.h, "Message pipes").
 *
 *   weft_mpi_msgpipe_faults              np 2; WEFT_MSGPIPE_FAULT_MODE=poll|thread
 *
 * Rank 1 (the victim) runs without a progress thread: after its write it
 * never calls weft again, so its large buffer stays unsent (announced only)
 * wherever the sender has to move it. Both ranks open pipe 7. The survivor
 * (rank 0, progress mode from WEFT_MSGPIPE_FAULT_MODE) writes a 64 MiB
 * message the victim never reads and asks for two descriptors; the victim
 * writes one message (metadata, a small inline payload, a 64 MiB tensor on
 * the data lane). Once the survivor has its descriptor (checked exactly) and
 * has posted the read, it tells the victim over MPI, and the victim raises
 * SIGKILL. The survivor then checks, within WEFT_TIMEOUT + 2 s:
 *   - its write, its second descriptor request and its read are each called
 *     back once, in order per kind, with an error that is neither success
 *     nor WEFT_ERR_CLOSED and whose reason (after "... to rank 1 (message
 *     N): ") names rank 1. The read may have finished before the death only
 *     where the reader pulls the data itself (shm with CMA); it must then
 *     hold the exact bytes;
 *   - later calls on the pipe fail; closing it succeeds; weft_comm_destroy
 *     returns within WEFT_TIMEOUT + 2 s.
 * It prints "MSGPIPE-FAULT-OK rank 0 ..." or "MSGPIPE-FAULT-FAIL rank 0 ..."
 * and _exits (MPI_Finalize would wait for the dead rank). mpirun needs
 * --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0, and
 * its exit code says nothing, so the ctest entries judge by the line.
 */
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

constexpr int kVictim = 1;
constexpr int kId = 7;
constexpr size_t kBig = 64u << 20;
constexpr size_t kSmall = 100;

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void finish(int rank, bool ok, const std::string &detail)
{
    std::printf("%s rank %d: %s\n", ok ? "MSGPIPE-FAULT-OK" : "MSGPIPE-FAULT-FAIL", rank, detail.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(ok ? 0 : 1);
}

/* Where the survivor is, and what it saw so far, for the watchdog's line. */
std::atomic<const char *> g_stage{"start"};
std::mutex g_seen_mu;
std::string g_seen;

/* Ends the survivor with a FAIL line if it is still running after `s` seconds. */
void start_watchdog(int rank, double s)
{
    std::thread([rank, s] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        std::string seen;
        {
            std::lock_guard<std::mutex> lk(g_seen_mu);
            seen = g_seen;
        }
        finish(rank, false, "watchdog: still in " + std::string(g_stage.load()) + " after " +
                                std::to_string((int)s) + " s; callbacks:" + seen);
    }).detach();
}

struct Ev {
    char kind;
    int err;
    std::string why;
};
std::mutex g_mu;
std::vector<Ev> g_ev;
bool g_desc_ok = false;
std::string g_desc_problem = "no descriptor";

void on_cb(weft_pipe_t *, int err, const char *why, void *arg)
{
    std::lock_guard<std::mutex> lk(g_mu);
    g_ev.push_back({*static_cast<char *>(arg), err, why ? why : "(NULL)"});
}

/* The victim's message: seeds of sender 1, pipe 7. */
uint64_t seed(int part) { return pattern_seed(kVictim, kId * 8 + part, 0); }

void on_desc(weft_pipe_t *, int err, const char *why, const weft_pipe_descriptor_t *d, void *arg)
{
    std::lock_guard<std::mutex> lk(g_mu);
    g_ev.push_back({*static_cast<char *>(arg), err, why ? why : "(NULL)"});
    if (*static_cast<char *>(arg) != '0')
        return;
    if (err != WEFT_SUCCESS || d == nullptr) {
        g_desc_problem = std::string("first descriptor failed: ") + (why ? why : "");
        return;
    }
    std::vector<unsigned char> meta(12);
    fill_pattern(meta.data(), meta.size(), seed(3));
    if (d->metadata_bytes != meta.size() || std::memcmp(d->metadata, meta.data(), meta.size()) != 0)
        g_desc_problem = "descriptor metadata differs";
    else if (d->num_payloads != 1 || d->payloads[0].bytes != kSmall || d->num_tensors != 1 ||
             d->tensors[0].bytes != kBig || d->tensors[0].source_device != WEFT_PIPE_HOST ||
             d->tensors[0].target_device != WEFT_PIPE_ANY)
        g_desc_problem = "descriptor fields differ";
    else
        g_desc_problem = "";
    g_desc_ok = g_desc_problem.empty();
}

size_t count(char kind)
{
    std::lock_guard<std::mutex> lk(g_mu);
    size_t n = 0;
    for (auto &e : g_ev)
        n += e.kind == kind;
    return n;
}

/* The failure text past the pipe's own prefix names the dead rank. */
std::string blame_problem(const Ev &e, const char *op)
{
    if (e.err == WEFT_SUCCESS || e.err == WEFT_ERR_CLOSED)
        return std::string(op) + " ended with " + weft_strerror(e.err) + " (" + e.why + "), not a failure naming rank 1";
    if (e.why.find(op) == std::string::npos)
        return std::string(op) + ": why does not name the operation: " + e.why;
    size_t at = e.why.find("(message ");
    at = at == std::string::npos ? std::string::npos : e.why.find("): ", at);
    const std::string reason = at == std::string::npos ? e.why : e.why.substr(at + 3);
    if (reason.find("rank 1") == std::string::npos && reason.find("peer 1") == std::string::npos)
        return std::string(op) + ": the reason does not name rank 1: " + e.why;
    return "";
}

} // namespace

int main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
        return 1;
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const std::string mode = env_or("WEFT_MSGPIPE_FAULT_MODE", "poll");
    const double timeout = std::atof(env_or("WEFT_TIMEOUT", "60"));
    if (size != 2 || (mode != "poll" && mode != "thread"))
        finish(rank, false, "usage: np 2, WEFT_MSGPIPE_FAULT_MODE=poll|thread");
    const bool victim = rank == kVictim;
    const bool thread_mode = !victim && mode == "thread";
    weft_comm_t *c = nullptr;
    int rc = create_with(MPI_COMM_WORLD, {{"WEFT_PROGRESS_THREAD", thread_mode ? "1" : "0"}}, &c);
    int bad = rc != WEFT_SUCCESS, any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_bad) {
        if (victim)
            _exit(1);
        finish(rank, false, std::string("weft_comm_create_config failed: ") + weft_last_error());
    }
    weft_pipe_t *p = nullptr;
    if (weft_pipe_open(c, 1 - rank, kId, &p) != WEFT_SUCCESS) {
        if (victim)
            _exit(1);
        finish(rank, false, std::string("weft_pipe_open: ") + weft_comm_last_error(c));
    }

    if (victim) {
        static std::vector<unsigned char> meta(12), small(kSmall), big(kBig);
        fill_pattern(meta.data(), meta.size(), seed(3));
        fill_pattern(small.data(), small.size(), seed(1));
        fill_pattern(big.data(), big.size(), seed(2));
        weft_pipe_payload_t pl = {small.data(), small.size(), nullptr, 0};
        weft_pipe_tensor_t t = {big.data(), big.size(), WEFT_PIPE_HOST, nullptr, WEFT_PIPE_ANY, nullptr, 0};
        weft_pipe_message_t m = {meta.data(), meta.size(), 1, &pl, 1, &t};
        if (weft_pipe_write(p, &m, nullptr, nullptr) != WEFT_SUCCESS)
            _exit(1);
        /* No weft call from here on: the survivor says when to die. */
        int token = 0;
        MPI_Recv(&token, 1, MPI_INT, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        raise(SIGKILL);
        for (;;)
            pause();
    }

    start_watchdog(rank, 2 * timeout + 30);
    std::vector<std::string> problems;
    static std::vector<unsigned char> out(kBig), in_small(kSmall), in_big(kBig);
    fill_pattern(out.data(), out.size(), pattern_seed(0, kId, 0));
    static char kW = 'W', kD0 = '0', kD1 = '1', kR = 'R';
    weft_pipe_tensor_t wt = {out.data(), out.size(), WEFT_PIPE_HOST, nullptr, WEFT_PIPE_ANY, nullptr, 0};
    weft_pipe_message_t wm = {nullptr, 0, 0, nullptr, 1, &wt};
    if (weft_pipe_write(p, &wm, on_cb, &kW) != WEFT_SUCCESS || weft_pipe_read_descriptor(p, on_desc, &kD0) != WEFT_SUCCESS ||
        weft_pipe_read_descriptor(p, on_desc, &kD1) != WEFT_SUCCESS)
        finish(rank, false, std::string("queueing: ") + weft_comm_last_error(c));
    auto drive = [&](const std::function<bool()> &done, double secs) {
        const double end = now_s() + secs;
        while (!done() && now_s() < end) {
            if (thread_mode)
                usleep(200);
            else
                (void)weft_progress(c);
        }
        return done();
    };
    g_stage = "waiting for the victim's descriptor";
    if (!drive([] { return count('0') == 1; }, timeout))
        finish(rank, false, "no descriptor of the victim's message");
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (!g_desc_ok)
            finish(rank, false, g_desc_problem);
    }
    weft_pipe_buffer_t bp = {in_small.data(), in_small.size()}, bt = {in_big.data(), in_big.size()};
    weft_pipe_allocation_t a = {1, &bp, 1, &bt};
    if (weft_pipe_read(p, &a, on_cb, &kR) != WEFT_SUCCESS)
        finish(rank, false, std::string("weft_pipe_read: ") + weft_comm_last_error(c));
    int token = 1;
    MPI_Send(&token, 1, MPI_INT, kVictim, 99, MPI_COMM_WORLD);
    g_stage = "waiting for the callbacks after the victim's death";
    const double t0 = now_s();
    const bool all = drive([] { return count('W') == 1 && count('1') == 1 && count('R') == 1; }, timeout + 2);
    const double took = now_s() - t0;
    if (!all)
        problems.push_back("after " + std::to_string(took) + " s: write " + std::to_string(count('W')) +
                           ", descriptor " + std::to_string(count('1')) + ", read " + std::to_string(count('R')) +
                           " callbacks (1 each expected)");
    const std::string transports = env_or("WEFT_TRANSPORTS", "");
    const bool reader_pulls = transports == "shm" && std::string(env_or("WEFT_SHM_CMA", "1")) != "0";
    std::string seen;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        for (auto &e : g_ev) {
            seen += std::string(" [") + e.kind + " " + weft_strerror(e.err) + ": " + e.why + "]";
            std::string pr;
            if (e.kind == 'W')
                pr = blame_problem(e, "weft_pipe_write");
            else if (e.kind == '1')
                pr = blame_problem(e, "weft_pipe_read_descriptor");
            else if (e.kind == 'R' && e.err == WEFT_SUCCESS && reader_pulls)
                pr = pattern_mismatch(in_big.data(), kBig, seed(2)) == SIZE_MAX &&
                             pattern_mismatch(in_small.data(), kSmall, seed(1)) == SIZE_MAX
                         ? ""
                         : "the read succeeded with wrong bytes";
            else if (e.kind == 'R')
                pr = blame_problem(e, "weft_pipe_read");
            if (!pr.empty())
                problems.push_back(pr);
        }
    }
    {
        std::lock_guard<std::mutex> lk(g_seen_mu);
        g_seen = seen;
    }
    /* The broken pipe refuses new work; close and destroy end in time. */
    weft_pipe_message_t empty = {nullptr, 0, 0, nullptr, 0, nullptr};
    if (weft_pipe_write(p, &empty, nullptr, nullptr) == WEFT_SUCCESS)
        problems.push_back("a write on the pipe to the dead rank succeeded");
    if ((rc = weft_pipe_close(p)) != WEFT_SUCCESS)
        problems.push_back(std::string("weft_pipe_close: ") + weft_strerror(rc));
    g_stage = "weft_comm_destroy";
    const double d0 = now_s();
    rc = weft_comm_destroy(c);
    const double dtook = now_s() - d0;
    if (dtook > timeout + 2)
        problems.push_back("weft_comm_destroy took " + std::to_string(dtook) + " s");
    std::string detail = "callbacks after " + std::to_string(took) + " s:" + seen + "; destroy " +
                         weft_strerror(rc) + " after " + std::to_string(dtook) + " s";
    for (auto &pr : problems)
        detail += " | " + pr;
    finish(rank, problems.empty(), detail);
}
