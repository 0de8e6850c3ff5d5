/*
 * A link goes down while its peer still runs, then the peer dies, stops or
 * carries on: destroy's final barrier must end in every case.
 *
 *   weft_mpi_link_down <mode>        np 2, every pair over TCP (tcp, vnodes2)
 *     mode: die    rank 1 dies 1.5 s after its link went down (past the
 *                  1 s weft looks at a same-host peer whose link reset):
 *                  rank 0's destroy sees the death while it waits in the
 *                  final barrier and ends with the survivors' barrier
 *                  (within WEFT_TIMEOUT + 2 s; MPI's barrier alone would
 *                  wait for the dead rank forever)
 *           stop   rank 1 raises SIGSTOP instead (alive, silent): rank 0's
 *                  destroy gives the barrier up after WEFT_TIMEOUT with
 *                  WEFT_ERR_TIMEOUT naming the link to peer 1, then kills it
 *           live   rank 1 goes on and destroys too: both destroys return at
 *                  once (the barrier completes; no timeout is waited out)
 *
 * Rank 1 cuts its own link: after a message each way (the pair's sockets
 * are up), it shuts down every TCP connection that appeared since before
 * weft_comm_create (weft's: MPI talks between these ranks through shared
 * memory and was warmed up first), without calling weft again (no progress
 * thread). Rank 0 then receives from rank 1, which must fail naming peer 1
 * while rank 1's process still runs ("only this link is down").
 *
 * Prints "LINKDOWN-OK rank 0 ..." or "LINKDOWN-FAIL rank N ..." and _exits
 * in die/stop (MPI_Finalize would wait for rank 1). mpirun needs
 * --mca orte_enable_recovery 1 --mca orte_abort_on_non_zero_status 0.
 */
#include <mpi.h>

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"

namespace {

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void finish(int rank, bool ok, const std::string &detail)
{
    std::printf("%s rank %d: %s\n", ok ? "LINKDOWN-OK" : "LINKDOWN-FAIL", rank, detail.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(ok ? 0 : 1);
}

void start_watchdog(int rank, double s, const char *const *stage)
{
    std::thread([rank, s, stage] {
        std::this_thread::sleep_for(std::chrono::duration<double>(s));
        finish(rank, false, std::string("watchdog: still in ") + *stage + " after " + std::to_string((int)s) + " s");
    }).detach();
}

/* The socket inodes of this process's open descriptors, by descriptor. */
std::vector<std::pair<int, std::string>> sockets()
{
    std::vector<std::pair<int, std::string>> out;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr)
        return out;
    while (struct dirent *e = readdir(d)) {
        char path[300], link[128];
        std::snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (std::strncmp(link, "socket:", 7) == 0)
            out.emplace_back(std::atoi(e->d_name), link);
    }
    closedir(d);
    return out;
}

/* Connected IPv4/IPv6 stream sockets not in `before`: shut down both ways. */
int cut_new_tcp(const std::set<std::string> &before)
{
    int n = 0;
    for (auto &s : sockets()) {
        if (before.count(s.second))
            continue;
        sockaddr_storage a;
        socklen_t len = sizeof(a);
        int type = 0;
        socklen_t tlen = sizeof(type);
        if (getsockopt(s.first, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM)
            continue;
        if (getpeername(s.first, (sockaddr *)&a, &len) != 0 || (a.ss_family != AF_INET && a.ss_family != AF_INET6))
            continue;
        if (shutdown(s.first, SHUT_RDWR) == 0)
            n++;
    }
    return n;
}

} // namespace

int main(int argc, char **argv)
{
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
        return 1;
    int rank = -1, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const std::string mode = argc > 1 ? argv[1] : "";
    const char *t = std::getenv("WEFT_TIMEOUT");
    const double timeout = t ? std::atof(t) : 60;
    if (size != 2 || (mode != "die" && mode != "stop" && mode != "live"))
        finish(rank, false, "usage: np 2, weft_mpi_link_down die|stop|live");
    static const char *stage = "start";
    start_watchdog(rank, 2 * timeout + 20, &stage);
    const bool cutter = rank == 1;
    /* Rank 1 must not touch weft after the cut: no thread of weft's either
     * (WEFT_PROGRESS_THREAD=0 in the comm's configuration, below). */

    /* MPI's own connections first, so that only weft's are new below. */
    int pids[2] = {0, 0}, me = (int)getpid();
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    std::set<std::string> before;
    for (auto &s : sockets())
        before.insert(s.second);

    weft_comm_t *c = nullptr;
    const weft_setting_t no_thread[] = {{"WEFT_PROGRESS_THREAD", "0"}};
    weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
    cfg.settings = no_thread;
    cfg.nsettings = 1;
    if (weft_comm_create_config(MPI_COMM_WORLD, &cfg, &c) != WEFT_SUCCESS)
        finish(rank, false, std::string("weft_comm_create_config: ") + weft_last_error());
    std::vector<char> buf(4096, (char)rank), in(4096);
    stage = "the first exchange";
    int rc = rank == 0 ? weft_send(c, buf.data(), buf.size(), 1, 5) : weft_recv(c, in.data(), in.size(), 0, 5, nullptr);
    if (rc == WEFT_SUCCESS)
        rc = rank == 0 ? weft_recv(c, in.data(), in.size(), 1, 6, nullptr) : weft_send(c, buf.data(), buf.size(), 0, 6);
    if (rc != WEFT_SUCCESS)
        finish(rank, false, std::string("exchange before the cut: ") + weft_comm_last_error(c));

    if (cutter) {
        int n = cut_new_tcp(before);
        MPI_Send(&n, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
        if (mode == "die") {
            usleep(1500 * 1000);
            raise(SIGKILL);
        } else if (mode == "stop") {
            raise(SIGSTOP);
            for (;;)
                pause();
        }
        stage = "weft_comm_destroy (rank 1)";
        double d0 = now_s();
        rc = weft_comm_destroy(c);
        double took = now_s() - d0;
        MPI_Send(&took, 1, MPI_DOUBLE, 0, 2, MPI_COMM_WORLD);
        MPI_Finalize();
        return 0;
    }

    int cut = 0;
    MPI_Recv(&cut, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    std::vector<std::string> problems;
    if (cut == 0)
        finish(rank, false, "rank 1 found no TCP connection of weft's to cut (is every pair on TCP?)");
    /* The receive sees the link down; rank 1 still runs (die: for 1.5 s). */
    stage = "a receive from rank 1 after the cut";
    rc = weft_recv(c, in.data(), in.size(), 1, 7, nullptr);
    std::string err = weft_comm_last_error(c);
    if (rc == WEFT_SUCCESS)
        problems.push_back("a receive from rank 1 after its link was cut succeeded");
    else if (err.find("peer 1") == std::string::npos && err.find("rank 1") == std::string::npos)
        problems.push_back("the failed receive does not name rank 1: " + err);

    stage = "weft_comm_destroy (rank 0)";
    const double d0 = now_s();
    rc = weft_comm_destroy(c);
    const double took = now_s() - d0;
    std::string derr = weft_last_error();
    std::string detail = "receive: " + err + "; destroy " + weft_strerror(rc) + " after " + std::to_string(took) + " s";
    if (took > timeout + 2)
        problems.push_back("weft_comm_destroy took " + std::to_string(took) + " s");
    if (mode == "stop") {
        if (rc != WEFT_ERR_TIMEOUT || derr.find("link to peer 1") == std::string::npos)
            problems.push_back("destroy with the peer stopped: expected WEFT_ERR_TIMEOUT naming the link to peer 1, "
                               "got " + std::string(weft_strerror(rc)) + ": " + derr);
        if (took < timeout - 0.5)
            problems.push_back("destroy gave the barrier up before WEFT_TIMEOUT with the peer alive");
    }
    if (mode == "live") {
        double other = 0;
        stage = "waiting for rank 1's destroy";
        MPI_Recv(&other, 1, MPI_DOUBLE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        detail += "; rank 1's destroy after " + std::to_string(other) + " s";
        /* Both were in the barrier together: neither waited WEFT_TIMEOUT. */
        if (took > timeout - 0.5 || other > timeout - 0.5)
            problems.push_back("a destroy waited out WEFT_TIMEOUT though both ranks were in it");
    }
    for (auto &pr : problems)
        detail += " | " + pr;
    if (mode == "live") {
        std::printf("%s rank 0: %s\n", problems.empty() ? "LINKDOWN-OK" : "LINKDOWN-FAIL", detail.c_str());
        std::fflush(stdout);
        MPI_Finalize();
        return problems.empty() ? 0 : 1;
    }
    if (mode == "stop")
        kill(pids[1], SIGKILL);   /* it would stay stopped */
    finish(rank, problems.empty(), detail);
}
