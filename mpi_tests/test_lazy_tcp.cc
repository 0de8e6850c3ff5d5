/*
 * Lazy TCP connections (issue 15): the tcp transport opens a pair's sockets
 * (1 control + WEFT_TCP_STREAMS data) at the pair's first message, from
 * either side, and keeps one set per pair when both sides start at once
 * (plus the higher rank's own control socket, which carries its frames). Run where tcp carries pairs: WEFT_TRANSPORTS=tcp (every pair), and
 * virtual nodes (the pairs across fake nodes; mpi_tests/CMakeLists.txt).
 *
 * What the tests count is the process's own TCP sockets that belong to
 * weft: every socket of this process (/proc/self/fd) whose row in
 * /proc/self/net/tcp has a weft listener's port at one end (connected to a
 * peer's listener, or accepted on ours). The listeners are the listening
 * sockets that weft_comm_create added, and their ports are exchanged over
 * MPI. Open MPI's own sockets never touch those ports.
 *
 * The first message to a peer that died is in mpi_tests/test_faults.cc
 * (case "first", over tcp and vnodes2 too); the handshake itself (both
 * sides at once, refused, no answer within WEFT_TIMEOUT, strangers) in
 * tests/test_tcp_pair.cc and tests/test_tcp_hostile.cc.
 */
#include <mpi.h>
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

/* One row of /proc/self/net/tcp that is a socket of this process. */
struct Sock {
    unsigned lport, rport;
    int state;   /* 1 established, 10 listening, ... (include/net/tcp_states.h) */
};

std::set<unsigned long> my_socket_inodes()
{
    std::set<unsigned long> inodes;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr)
        return inodes;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.')
            continue;
        char link[64], path[300];
        std::snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        unsigned long ino;
        if (std::sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes.insert(ino);
    }
    closedir(d);
    return inodes;
}

/* This process's IPv4 TCP sockets (weft's listener is IPv4 only). */
std::vector<Sock> my_tcp_sockets(std::vector<unsigned long> *inodes_out = nullptr)
{
    const std::set<unsigned long> mine = my_socket_inodes();
    std::vector<Sock> v;
    std::ifstream f("/proc/self/net/tcp");
    std::string line;
    std::getline(f, line);   /* header */
    while (std::getline(f, line)) {
        unsigned lip, lport, rip, rport, state;
        unsigned long inode = 0;
        char rest[512];
        /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
        if (std::sscanf(line.c_str(), " %*d: %x:%x %x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu %511[^\n]", &lip,
                        &lport, &rip, &rport, &state, &inode, rest) < 6)
            continue;
        if (inode == 0 || mine.count(inode) == 0)
            continue;
        v.push_back({lport, rport, (int)state});
        if (inodes_out)
            inodes_out->push_back(inode);
    }
    return v;
}

std::set<unsigned long> listening_inodes()
{
    std::vector<unsigned long> inodes;
    std::vector<Sock> v = my_tcp_sockets(&inodes);
    std::set<unsigned long> out;
    for (size_t i = 0; i < v.size(); i++)
        if (v[i].state == 10)
            out.insert(inodes[i]);
    return out;
}

class LazyTcp : public WeftMpiTest {
protected:
    MPI_Comm base_comm() override { return MPI_COMM_NULL; }

    static int streams()
    {
        const char *s = getenv("WEFT_TCP_STREAMS");
        return s ? std::atoi(s) : 4;   /* the default (src/core/config.c) */
    }
    static int per_peer() { return 1 + streams(); }

    /* Whether the pipe between ranks a and b goes over tcp in this run. */
    bool tcp_pair(int a, int b) const
    {
        if (a == b)
            return false;
        const char *tp = getenv("WEFT_TRANSPORTS");
        if (tp != nullptr && std::strcmp(tp, "tcp") == 0)
            return true;
        const char *vn = getenv("WEFT_VIRTUAL_NODES");
        int k = vn ? std::atoi(vn) : 0;
        if (k <= 0)
            return false;
        if (k > size)
            k = size;
        return (long long)a * k / size != (long long)b * k / size;   /* src/comm/comm.c: vblock */
    }
    int tcp_peers_among(const std::vector<int> &ranks) const
    {
        int n = 0;
        for (int p : ranks)
            n += tcp_pair(rank, p);
        return n;
    }

    /* A fresh comm; records its weft listener and every rank's port. */
    weft_comm_t *fresh()
    {
        const std::set<unsigned long> before = listening_inodes();
        weft_comm_t *c = nullptr;
        std::string what;
        int rc = make_test_comm(MPI_COMM_WORLD, &c, &what);
        EXPECT_EQ(rc, WEFT_SUCCESS) << what;
        if (rc != WEFT_SUCCESS)
            return nullptr;
        std::vector<unsigned long> inodes;
        std::vector<Sock> socks = my_tcp_sockets(&inodes);
        int my_port = 0, added = 0;
        for (size_t i = 0; i < socks.size(); i++)
            if (socks[i].state == 10 && before.count(inodes[i]) == 0) {
                my_port = (int)socks[i].lport;
                added++;
            }
        EXPECT_EQ(added, tcp_peers_among(all_ranks()) > 0 ? 1 : 0) << "weft listeners added by create";
        ports_.assign((size_t)size, 0);
        MPI_Allgather(&my_port, 1, MPI_INT, ports_.data(), 1, MPI_INT, MPI_COMM_WORLD);
        my_port_ = my_port;
        return c;
    }

    std::vector<int> all_ranks() const
    {
        std::vector<int> v;
        for (int r = 0; r < size; r++)
            v.push_back(r);
        return v;
    }

    /* weft's connected sockets in this process: to a peer's listener, or
     * accepted on ours. */
    int weft_sockets() const
    {
        std::set<unsigned> ports;
        for (int r = 0; r < size; r++)
            if (r != rank && ports_[(size_t)r] != 0)
                ports.insert((unsigned)ports_[(size_t)r]);
        int n = 0;
        for (const Sock &s : my_tcp_sockets()) {
            if (s.state == 10)
                continue;
            if (ports.count(s.rport) || (my_port_ != 0 && s.lport == (unsigned)my_port_))
                n++;
        }
        return n;
    }

    /* Progresses every rank for a while until ok() holds on all of them
     * (a handshake's last step, or closing a collision's losing sockets,
     * may need the other side's progress). Only weft_progress: no message,
     * so no new pair is connected by the waiting itself. */
    bool settle(weft_comm_t *c, const std::function<bool()> &ok)
    {
        for (int round = 0; round < 200; round++) {
            for (int i = 0; i < 10; i++) {
                weft_progress(c);
                usleep(500);
            }
            int mine = ok() ? 1 : 0, all = 0;
            MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
            if (all)
                return true;
        }
        return false;
    }

    std::vector<int> ports_;
    int my_port_ = 0;
};

/* Sends bytes to `to` and receives as many from `from`, verified. */
void exchange_all(weft_comm_t *c, const std::vector<int> &peers, size_t bytes, int tag)
{
    const int me = weft_comm_rank(c);
    std::vector<std::vector<unsigned char>> out(peers.size()), in(peers.size());
    std::vector<weft_request_t *> rq;
    /* Every send first, then every receive: each pair's first message goes
     * both ways at once. */
    for (size_t i = 0; i < peers.size(); i++) {
        out[i].resize(bytes);
        fill_pattern(out[i].data(), bytes, pattern_seed(me, tag, (uint64_t)peers[i]));
        weft_request_t *r = nullptr;
        ASSERT_EQ(weft_isend(c, out[i].data(), bytes, peers[i], tag, &r), WEFT_SUCCESS) << weft_comm_last_error(c);
        rq.push_back(r);
    }
    for (size_t i = 0; i < peers.size(); i++) {
        in[i].resize(bytes);
        weft_request_t *r = nullptr;
        ASSERT_EQ(weft_irecv(c, in[i].data(), bytes, peers[i], tag, &r), WEFT_SUCCESS) << weft_comm_last_error(c);
        rq.push_back(r);
    }
    ASSERT_EQ(weft_waitall((int)rq.size(), rq.data(), nullptr), WEFT_SUCCESS) << weft_comm_last_error(c);
    for (size_t i = 0; i < peers.size(); i++)
        EXPECT_TRUE(HasPattern(in[i].data(), bytes, peers[i], tag, (uint64_t)me)) << bytes << " B from rank " << peers[i];
}

/* Create and destroy with no traffic: the listener, and no socket to any peer. */
TEST_F(LazyTcp, CreateAndDestroyWithNoTrafficOpensNoSocket)
{
    const std::set<unsigned long> listeners_before = listening_inodes();
    for (int i = 0; i < 3; i++) {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        MPI_Barrier(MPI_COMM_WORLD);
        for (int k = 0; k < 20; k++)
            weft_progress(c);
        MPI_Barrier(MPI_COMM_WORLD);
        EXPECT_EQ(weft_sockets(), 0) << "sockets to peers after create with no traffic";
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    EXPECT_EQ(listening_inodes(), listeners_before) << "a listener outlived its comm";
}

/* Every pair's first message in both directions at once (each rank sends
 * to every peer before receiving from any): all data arrives, and once the
 * handshakes are over each tcp pair holds one set of sockets (and at most
 * one more control socket). */
TEST_F(LazyTcp, FirstMessageInBothDirectionsAtOnceKeepsOneSetPerPair)
{
    if (tcp_peers_among(all_ranks()) == 0 && size > 1)
        ADD_FAILURE() << "no pair uses tcp in this configuration";
    for (size_t bytes : {(size_t)100, (size_t)(1u << 20) + 3}) {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        std::vector<int> peers;
        for (int p = 0; p < size; p++)
            if (p != rank)
                peers.push_back(p);
        MPI_Barrier(MPI_COMM_WORLD);   /* everyone starts at about the same time */
        exchange_all(c, peers, bytes, 11);
        /* One set per pair, plus at most the higher rank's own control
         * socket where both started at once (it carries that rank's
         * frames; tcp.c). */
        const int want = per_peer() * tcp_peers_among(peers);
        EXPECT_TRUE(settle(c, [&] { int n = weft_sockets(); return n >= want && n <= want + tcp_peers_among(peers); }))
            << bytes << " B: " << weft_sockets() << " weft sockets, want " << want << " to "
            << want + tcp_peers_among(peers);
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
        EXPECT_EQ(weft_sockets(), 0) << "sockets left after destroy";
    }
}

/* A collective as the very first operation of a comm: its messages make
 * the pipes while every rank is inside it; whole sets only. */
TEST_F(LazyTcp, FirstMessageInsideACollective)
{
    {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const size_t block = 3000;
        std::vector<unsigned char> out(block), in(block * (size_t)size);
        fill_pattern(out.data(), block, pattern_seed(rank, 21, 0));
        ASSERT_EQ(weft_allgather(c, out.data(), in.data(), block), WEFT_SUCCESS) << weft_comm_last_error(c);
        for (int p = 0; p < size; p++)
            EXPECT_TRUE(HasPattern(in.data() + (size_t)p * block, block, p, 21, 0)) << "block of rank " << p;
        const int most = per_peer() * tcp_peers_among(all_ranks());
        const int pairs = tcp_peers_among(all_ranks());
        EXPECT_TRUE(settle(c, [&] { return weft_sockets() <= most + pairs; })) << weft_sockets() << " weft sockets";
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    {
        weft_comm_t *c = fresh();
        ASSERT_NE(c, nullptr);
        const size_t count = 100000;   /* 400 KB: the large-message algorithms, rendezvous */
        std::vector<int32_t> out(count), in(count);
        for (size_t i = 0; i < count; i++)
            out[i] = (int32_t)(i % 1000) + rank;
        ASSERT_EQ(weft_allreduce(c, out.data(), in.data(), count, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS)
            << weft_comm_last_error(c);
        const int32_t ranks_sum = size * (size - 1) / 2;
        size_t wrong = 0;
        for (size_t i = 0; i < count; i++)
            wrong += in[i] != (int32_t)(i % 1000) * size + ranks_sum;
        EXPECT_EQ(wrong, 0u);
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
}

/* The last rank takes part in nothing but create and destroy; the others
 * talk all-to-all among themselves. No socket ever reaches the idle rank,
 * and the others hold one set per tcp peer among themselves. */
TEST_F(LazyTcp, APeerThatNeverSendsGetsNoSocket)
{
    if (size < 3)
        GTEST_SKIP() << "needs 3 ranks";
    weft_comm_t *c = fresh();
    ASSERT_NE(c, nullptr);
    const int idle = size - 1;
    std::vector<int> talkers;
    for (int p = 0; p < idle; p++)
        if (p != rank)
            talkers.push_back(p);
    if (rank != idle)
        for (size_t bytes : {(size_t)64, (size_t)(300u << 10)})
            exchange_all(c, talkers, bytes, 31);
    const int want = rank == idle ? 0 : per_peer() * tcp_peers_among(talkers);
    const int most = rank == idle ? 0 : want + tcp_peers_among(talkers);
    EXPECT_TRUE(settle(c, [&] { int n = weft_sockets(); return n >= want && n <= most; }))
        << weft_sockets() << " weft sockets, want " << want << " to " << most
        << (rank == idle ? " (the idle rank)" : "");
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

} // namespace
