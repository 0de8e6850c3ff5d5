/*
 * weft_comm_init needs no MPI: three forked processes that never call
 * MPI_Init (nor any MPI function) get a unique id through a pipe, meet,
 * run an allreduce and an allgather over the comm, and destroy it. Each
 * child reports through its exit code; the parent also checks that the
 * root thread serving the meeting lets go of its listener.
 *
 * Its own binary (tests/CMakeLists.txt), linked against the shared libweft
 * as an application would be, not against the unit tests' static archive.
 */
#include <gtest/gtest.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

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

constexpr int kRanks = 3;

/* Child exit codes: which step failed. */
enum { kOk = 0, kReadId = 10, kInit, kSize, kAllreduce, kAllreduceValue, kAllgather, kAllgatherValue, kSendRecv,
       kDestroy };

/* Reads exactly n bytes (the id) from fd; false on EOF or error. */
bool read_full(int fd, void *buf, size_t n)
{
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

/* One rank: never touches MPI. Prints what failed and exits with the step's code. */
[[noreturn]] void child(int rank, int id_fd)
{
    weft_unique_id_t id;
    if (!read_full(id_fd, &id, sizeof(id)))
        _exit(kReadId);
    close(id_fd);

    weft_comm_t *comm = nullptr;
    int rc = weft_comm_init(&id, kRanks, rank, &comm);
    if (rc != WEFT_SUCCESS) {
        std::fprintf(stderr, "child rank %d: weft_comm_init: %s: %s\n", rank, weft_strerror(rc), weft_last_error());
        _exit(kInit);
    }
    if (weft_comm_rank(comm) != rank || weft_comm_size(comm) != kRanks)
        _exit(kSize);

    /* allreduce SUM of (rank + 1) * (i + 1) over 1000 int64: (1+2+3) * (i + 1). */
    std::vector<int64_t> in(1000), out(1000, -1);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = static_cast<int64_t>((rank + 1) * (i + 1));
    rc = weft_allreduce(comm, in.data(), out.data(), in.size(), WEFT_INT64, WEFT_SUM);
    if (rc != WEFT_SUCCESS) {
        std::fprintf(stderr, "child rank %d: weft_allreduce: %s\n", rank, weft_comm_last_error(comm));
        _exit(kAllreduce);
    }
    for (size_t i = 0; i < out.size(); i++)
        if (out[i] != static_cast<int64_t>(6 * (i + 1))) {
            std::fprintf(stderr, "child rank %d: allreduce element %zu is %lld, want %lld\n", rank, i,
                         static_cast<long long>(out[i]), static_cast<long long>(6 * (i + 1)));
            _exit(kAllreduceValue);
        }

    int mine = 100 + rank, all[kRanks] = { -1, -1, -1 };
    rc = weft_allgather(comm, &mine, all, sizeof(int));
    if (rc != WEFT_SUCCESS)
        _exit(kAllgather);
    for (int r = 0; r < kRanks; r++)
        if (all[r] != 100 + r)
            _exit(kAllgatherValue);

    /* A ring of 64 KiB messages: the pipes work, not only the collectives. */
    std::vector<unsigned char> sbuf(64 << 10, static_cast<unsigned char>(rank)), rbuf(64 << 10, 0xff);
    int next = (rank + 1) % kRanks, prev = (rank + kRanks - 1) % kRanks;
    weft_request_t *reqs[2] = { nullptr, nullptr };
    if (weft_irecv(comm, rbuf.data(), rbuf.size(), prev, 7, &reqs[0]) != WEFT_SUCCESS ||
        weft_isend(comm, sbuf.data(), sbuf.size(), next, 7, &reqs[1]) != WEFT_SUCCESS ||
        weft_waitall(2, reqs, nullptr) != WEFT_SUCCESS)
        _exit(kSendRecv);
    for (unsigned char b : rbuf)
        if (b != static_cast<unsigned char>(prev))
            _exit(kSendRecv);

    rc = weft_comm_destroy(comm);
    if (rc != WEFT_SUCCESS) {
        std::fprintf(stderr, "child rank %d: weft_comm_destroy: %s\n", rank, weft_strerror(rc));
        _exit(kDestroy);
    }
    /* exit, not _exit: under the sanitizers LeakSanitizer then checks this
     * process too (a leak turns the exit code non-zero). */
    std::exit(kOk);
}

/* Waits for pid at most `seconds`; kills it after. Returns its wait status,
 * or -1 if it had to be killed. */
int wait_bounded(pid_t pid, double seconds)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        if (got == pid)
            return status;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

/* The id's listener address (bytes 16..19, port at 6..7: bootstrap_uid.c). */
sockaddr_in id_address(const weft_unique_id_t &id)
{
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    std::memcpy(&sa.sin_port, id.internal + 6, 2);
    std::memcpy(&sa.sin_addr, id.internal + 16, 4);
    return sa;
}

bool can_connect(const sockaddr_in &sa)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bool ok = connect(fd, reinterpret_cast<const sockaddr *>(&sa), sizeof(sa)) == 0;
    close(fd);
    return ok;
}

} // namespace

TEST(CommInitNoMpi, ThreeForkedProcessesAllreduce)
{
    int pipes[kRanks][2];
    pid_t pids[kRanks];
    for (int r = 0; r < kRanks; r++) {
        ASSERT_EQ(pipe(pipes[r]), 0);
        pids[r] = fork();
        ASSERT_GE(pids[r], 0);
        if (pids[r] == 0) {
            for (int q = 0; q <= r; q++)   /* the parent's write ends: only it writes */
                close(pipes[q][1]);
            child(r, pipes[r][0]);
        }
        close(pipes[r][0]);
    }

    /* The parent makes the id (its root thread serves the meeting), and is
     * no rank itself: the root needs no comm. */
    weft_unique_id_t id;
    std::memset(&id, 0, sizeof(id));
    ASSERT_EQ(weft_get_unique_id(&id), WEFT_SUCCESS) << weft_last_error();
    EXPECT_EQ(std::memcmp(id.internal, "WfId", 4), 0);
    for (int r = 0; r < kRanks; r++) {
        ASSERT_EQ(write(pipes[r][1], &id, sizeof(id)), static_cast<ssize_t>(sizeof(id)));
        close(pipes[r][1]);
    }

    for (int r = 0; r < kRanks; r++) {
        int status = wait_bounded(pids[r], 60);
        ASSERT_NE(status, -1) << "rank " << r << " did not finish within 60 s (killed)";
        ASSERT_TRUE(WIFEXITED(status)) << "rank " << r << " died by signal " << WTERMSIG(status);
        EXPECT_EQ(WEXITSTATUS(status), kOk) << "rank " << r << " failed at step " << WEXITSTATUS(status)
                                            << " (see its stderr)";
    }

    /* The id served its one meeting: the listener is gone, so a later
     * weft_comm_init with it cannot join a finished meeting. */
    sockaddr_in sa = id_address(id);
    EXPECT_FALSE(can_connect(sa)) << "the unique id's listener still accepts after the meeting";
}

/* The id's root is in a process that exited: weft_comm_init fails fast
 * (a refused connection is retried for about a second, not WEFT_TIMEOUT),
 * naming the root's address. */
TEST(CommInitNoMpi, RootGoneFailsFast)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(p[0]);
        weft_unique_id_t id;
        int rc = weft_get_unique_id(&id);
        if (rc == WEFT_SUCCESS && write(p[1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id)))
            rc = -1;
        _exit(rc == WEFT_SUCCESS ? 0 : 1);
    }
    close(p[1]);
    weft_unique_id_t id;
    ASSERT_TRUE(read_full(p[0], &id, sizeof(id)));
    close(p[0]);
    int status = wait_bounded(pid, 30);
    ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);

    weft_comm_t *comm = reinterpret_cast<weft_comm_t *>(0x1);   /* must stay untouched on failure */
    auto t0 = std::chrono::steady_clock::now();
    int rc = weft_comm_init(&id, 2, 0, &comm);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, WEFT_ERR_TRANSPORT);
    EXPECT_EQ(comm, reinterpret_cast<weft_comm_t *>(0x1));
    EXPECT_LT(took, 5.0) << "a gone root must not cost WEFT_TIMEOUT";
    char addr[INET_ADDRSTRLEN];
    sockaddr_in sa = id_address(id);
    inet_ntop(AF_INET, &sa.sin_addr, addr, sizeof(addr));
    std::string want = std::string("cannot reach the unique id's root at ") + addr + ":" +
                       std::to_string(ntohs(sa.sin_port)) + ": Connection refused";
    std::string got = weft_last_error();
    EXPECT_NE(got.find(want), std::string::npos) << got;
    EXPECT_NE(got.find("rank 0: weft_comm_init"), std::string::npos) << got;
}

/* weft_last_error is per thread, and calls that record nothing leave it
 * (mpi_tests/test_comm_init.cc checks that a successful weft_comm_init does). */
TEST(CommInitNoMpi, LastErrorIsPerThread)
{
    EXPECT_EQ(weft_get_unique_id(nullptr), WEFT_ERR_INVALID_ARG);
    const std::string mine = weft_last_error();
    EXPECT_NE(mine.find("weft_get_unique_id: id is NULL (invalid argument)"), std::string::npos) << mine;
    std::string other = "unset";
    std::thread t([&] { other = weft_last_error(); });
    t.join();
    EXPECT_EQ(other, "") << "another thread sees this thread's error";
    EXPECT_EQ(weft_comm_size(nullptr), -1);
    EXPECT_STREQ(weft_strerror(WEFT_SUCCESS), "success");
    EXPECT_EQ(mine, weft_last_error());
}

/* The root listens where WEFT_TCP_IF says (src/core/netif.c, as the tcp
 * transport; here in the configuration of the id and of the comm), and the
 * id carries that address; a name that matches nothing is refused with the
 * variable named. One-rank meetings consume each id. */
TEST(CommInitNoMpi, RootHonoursTcpIf)
{
    for (const char *want : { "127.0.0.1", "lo" }) {
        const weft_setting_t s[] = { { "WEFT_TCP_IF", want } };
        weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
        cfg.settings = s;
        cfg.nsettings = 1;
        weft_unique_id_t id;
        ASSERT_EQ(weft_get_unique_id_config(&id, &cfg), WEFT_SUCCESS) << weft_last_error();
        sockaddr_in sa = id_address(id);
        EXPECT_EQ(ntohl(sa.sin_addr.s_addr), INADDR_LOOPBACK) << "WEFT_TCP_IF=" << want;
        weft_comm_t *c = nullptr;
        ASSERT_EQ(weft_comm_init_config(&id, 1, 0, &cfg, &c), WEFT_SUCCESS) << weft_last_error();
        EXPECT_EQ(weft_comm_size(c), 1);
        EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    }
    const weft_setting_t s[] = { { "WEFT_TCP_IF", "nosuchif0" } };
    weft_config_t cfg = WEFT_CONFIG_INITIALIZER;
    cfg.settings = s;
    cfg.nsettings = 1;
    weft_unique_id_t id;
    std::memset(&id, 0x77, sizeof(id));
    EXPECT_EQ(weft_get_unique_id_config(&id, &cfg), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(static_cast<unsigned char>(id.internal[0]), 0x77) << "id written on failure";
    EXPECT_NE(std::string(weft_last_error()).find("weft_get_unique_id: WEFT_TCP_IF=nosuchif0 is neither an IPv4 "
                                                  "address nor an interface with one"), std::string::npos)
        << weft_last_error();
}
