/*
 * weft_get_unique_id / weft_comm_init / weft_last_error: ranks that meet
 * through a unique id (mpirun only launches them; MPI_Bcast carries the id,
 * as a key-value store would under torchrun).
 *
 * CommInit.*: a comm made this way carries p2p, allgather, allreduce and is
 * destroyed; two comms from two ids alive at once (the second with the rank
 * order reversed); the id serves one meeting; argument errors (nothing
 * created, *comm untouched, the text in weft_last_error, which a later
 * success does not clear); nranks mismatch and a rank claimed twice (every
 * rank fails with the root's text); a root whose process exited (fails
 * fast, naming the address).
 * CommInitTimeout.* (run with WEFT_TIMEOUT=3): a rank given a corrupted
 * token, and a rank that never calls weft_comm_init: the others fail with
 * WEFT_ERR_TIMEOUT naming the rank that never joined and the root's address.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "weft.h"
#include "weft_mpi_test.h"

using namespace weft_mpitest;

namespace {

/* No comm from the fixture: these tests make their own. Its TearDown
 * still carries any rank's failure to every rank. */
class CommInit : public WeftMpiTest {
protected:
    MPI_Comm base_comm() override { return MPI_COMM_NULL; }
};
class CommInitTimeout : public CommInit {};

/* An id made on `root_rank` (its root thread runs in that process), the same
 * on every rank. Collective. */
weft_unique_id_t shared_id(int root_rank = 0)
{
    struct {
        weft_unique_id_t id;
        int rc;
    } msg;
    std::memset(&msg, 0, sizeof(msg));
    if (world_rank() == root_rank) {
        msg.rc = weft_get_unique_id(&msg.id);
        EXPECT_EQ(msg.rc, WEFT_SUCCESS) << weft_last_error();
    }
    MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, root_rank, MPI_COMM_WORLD);
    EXPECT_EQ(msg.rc, WEFT_SUCCESS) << "weft_get_unique_id failed on rank " << root_rank;
    return msg.id;
}

/* "192.0.2.2:4711": the root's address as the id holds it (bootstrap_uid.c:
 * port at bytes 6..7, IPv4 address at 16..19) and as the errors print it. */
std::string id_addr(const weft_unique_id_t &id)
{
    in_addr a;
    uint16_t port;
    std::memcpy(&port, id.internal + 6, 2);
    std::memcpy(&a, id.internal + 16, 4);
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(port));
}

double seconds_since(std::chrono::steady_clock::time_point t0)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

weft_comm_t *const kUntouched = reinterpret_cast<weft_comm_t *>(0x5a5a);

/* p2p ring (eager and rendezvous sizes), allgather and allreduce on c,
 * whose rank `me` of `n` is world rank `world`. */
void check_traffic(weft_comm_t *c, int me, int n, int world)
{
    ASSERT_EQ(weft_comm_rank(c), me);
    ASSERT_EQ(weft_comm_size(c), n);
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (size_t bytes : { (size_t)0, (size_t)100, (size_t)(1 << 20) }) {
        std::vector<unsigned char> out(bytes), in(bytes + 1, 0);
        fill_pattern(out.data(), bytes, pattern_seed(me, 3, bytes));
        weft_request_t *reqs[2];
        ASSERT_EQ(weft_irecv(c, in.data(), in.size(), prev, 3, &reqs[0]), WEFT_SUCCESS) << weft_comm_last_error(c);
        ASSERT_EQ(weft_isend(c, out.data(), bytes, next, 3, &reqs[1]), WEFT_SUCCESS) << weft_comm_last_error(c);
        weft_status_t st[2];
        ASSERT_EQ(weft_waitall(2, reqs, st), WEFT_SUCCESS) << weft_comm_last_error(c);
        EXPECT_EQ(st[0].bytes, bytes);
        EXPECT_EQ(st[0].peer, prev);
        EXPECT_TRUE(HasPattern(in.data(), bytes, prev, 3, bytes));
    }
    std::vector<int> worlds(n, -1);
    ASSERT_EQ(weft_allgather(c, &world, worlds.data(), sizeof(int)), WEFT_SUCCESS) << weft_comm_last_error(c);
    std::vector<int> expect_worlds(n);
    MPI_Allgather(&world, 1, MPI_INT, expect_worlds.data(), 1, MPI_INT, MPI_COMM_WORLD);
    /* Members of c are all world ranks; c's order is given by me. */
    std::vector<int> by_me(n);
    MPI_Allgather(&me, 1, MPI_INT, by_me.data(), 1, MPI_INT, MPI_COMM_WORLD);
    for (int w = 0; w < n; w++)
        EXPECT_EQ(worlds[by_me[w]], expect_worlds[w]) << "allgather slot of comm rank " << by_me[w];
    std::vector<double> x(1000), y(1000, -1);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = (me + 1) * 0.5 + (double)i;
    ASSERT_EQ(weft_allreduce(c, x.data(), y.data(), x.size(), WEFT_FLOAT64, WEFT_SUM), WEFT_SUCCESS)
        << weft_comm_last_error(c);
    for (size_t i = 0; i < y.size(); i++)
        ASSERT_EQ(y[i], 0.25 * n * (n + 1) + (double)(n * i)) << "element " << i;
}

} // namespace

TEST_F(CommInit, TrafficAndDestroy)
{
    weft_unique_id_t id = shared_id();
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_init(&id, size, rank, &c), WEFT_SUCCESS) << weft_last_error();
    ASSERT_NE(c, nullptr);
    check_traffic(c, rank, size, rank);
    if (HasFailure())
        return;   /* leaked: the ranks may no longer agree on what comes next */
    EXPECT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
}

/* Destroy of a comm with no MPI behind it ends with weft's own barrier over
 * the pipes, whose messages may be a pair's first (lazy connections): no
 * rank may see a peer's goodbye as a failure. Before the barrier had two
 * rounds, a sender left before the receiver opened its shm lane ("its lane
 * ... cannot be opened") and a tcp peer's close after the barrier was taken
 * for a broken link; both printed warnings (and cost a 1 s look each). */
TEST_F(CommInit, DestroyAfterFirstMessagesWarnsNothing)
{
    weft_unique_id_t id = shared_id();
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_init(&id, size, rank, &c), WEFT_SUCCESS) << weft_last_error();
    /* One collective: some pairs have talked, most pairs first meet in destroy. */
    int x = rank, sum = -1;
    ASSERT_EQ(weft_allreduce(c, &x, &sum, 1, WEFT_INT32, WEFT_SUM), WEFT_SUCCESS) << weft_comm_last_error(c);
    EXPECT_EQ(sum, size * (size - 1) / 2);
    testing::internal::CaptureStderr();
    int rc = weft_comm_destroy(c);
    std::string said = testing::internal::GetCapturedStderr();
    EXPECT_EQ(rc, WEFT_SUCCESS) << weft_last_error();
    EXPECT_EQ(said.find("WARN"), std::string::npos) << "weft_comm_destroy printed:\n" << said;
}

/* Two ids, two roots (in different processes when np > 1), two comms alive
 * at once, the second with the ranks in reverse order; traffic alternates. */
TEST_F(CommInit, TwoCommsFromTwoIds)
{
    weft_unique_id_t a = shared_id(0), b = shared_id(size - 1);
    EXPECT_NE(std::memcmp(a.internal, b.internal, sizeof(a.internal)), 0) << "two calls gave the same id";
    weft_comm_t *ca = nullptr, *cb = nullptr;
    ASSERT_EQ(weft_comm_init(&a, size, rank, &ca), WEFT_SUCCESS) << weft_last_error();
    ASSERT_EQ(weft_comm_init(&b, size, size - 1 - rank, &cb), WEFT_SUCCESS) << weft_last_error();
    for (int round = 0; round < 2 && !HasFailure(); round++) {
        check_traffic(ca, rank, size, rank);
        check_traffic(cb, size - 1 - rank, size, rank);
    }
    if (HasFailure())
        return;
    EXPECT_EQ(weft_comm_destroy(cb), WEFT_SUCCESS);
    EXPECT_EQ(weft_comm_destroy(ca), WEFT_SUCCESS);
}

/* The id served its meeting: a second weft_comm_init with it finds no
 * listener and fails fast, on every rank. */
TEST_F(CommInit, IdServesOneMeeting)
{
    weft_unique_id_t id = shared_id();
    weft_comm_t *c = nullptr;
    ASSERT_EQ(weft_comm_init(&id, size, rank, &c), WEFT_SUCCESS) << weft_last_error();
    ASSERT_EQ(weft_comm_destroy(c), WEFT_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    weft_comm_t *again = kUntouched;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(weft_comm_init(&id, size, rank, &again), WEFT_ERR_TRANSPORT);
    EXPECT_LT(seconds_since(t0), 5.0);
    EXPECT_EQ(again, kUntouched);
    std::string e = weft_last_error();
    EXPECT_NE(e.find("cannot reach the unique id's root at " + id_addr(id) + ": Connection refused"),
              std::string::npos) << e;
}

TEST_F(CommInit, ArgumentErrors)
{
    weft_unique_id_t id;
    std::memset(&id, 0, sizeof(id));
    std::memcpy(id.internal, "WfId", 4);   /* the checks below come before the magic's */
    id.internal[4] = 1;
    id.internal[5] = 4;
    weft_comm_t *c = kUntouched;
    struct Case {
        const weft_unique_id_t *id;
        int nranks, rank;
        weft_comm_t **out;
        const char *text;
    } cases[] = {
        { nullptr, 2, 0, &c, "weft_comm_init: rank 0: id is NULL" },
        { &id, 2, 1, nullptr, "weft_comm_init: rank 1: comm output pointer is NULL" },
        { &id, 0, 0, &c, "weft_comm_init: nranks is 0; at least 1" },
        { &id, -3, 0, &c, "weft_comm_init: nranks is -3; at least 1" },
        { &id, 4, -1, &c, "weft_comm_init: rank -1 is out of range for nranks 4" },
        { &id, 4, 4, &c, "weft_comm_init: rank 4 is out of range for nranks 4" },
    };
    for (const Case &k : cases) {
        EXPECT_EQ(weft_comm_init(k.id, k.nranks, k.rank, k.out), WEFT_ERR_INVALID_ARG) << k.text;
        EXPECT_NE(std::string(weft_last_error()).find(k.text), std::string::npos)
            << "want: " << k.text << "\ngot:  " << weft_last_error();
        EXPECT_EQ(c, kUntouched);
    }
    weft_unique_id_t bad = id;
    bad.internal[0] ^= 0x20;
    EXPECT_EQ(weft_comm_init(&bad, 2, 0, &c), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("weft_comm_init: rank 0: the id is not one weft_get_unique_id "
                                                  "made (bad magic)"), std::string::npos) << weft_last_error();
    bad = id;
    bad.internal[100] = 1;
    EXPECT_EQ(weft_comm_init(&bad, 2, 1, &c), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_last_error()).find("byte 100 is not zero"), std::string::npos) << weft_last_error();
    EXPECT_EQ(c, kUntouched);
    EXPECT_EQ(weft_get_unique_id(nullptr), WEFT_ERR_INVALID_ARG);
    const std::string last = weft_last_error();
    EXPECT_NE(last.find("weft_get_unique_id: id is NULL"), std::string::npos) << last;

    /* A later success leaves it alone (errno style). */
    weft_unique_id_t good = shared_id();
    weft_comm_t *ok = nullptr;
    ASSERT_EQ(weft_comm_init(&good, size, rank, &ok), WEFT_SUCCESS);
    ASSERT_EQ(weft_comm_destroy(ok), WEFT_SUCCESS);
    EXPECT_EQ(last, weft_last_error());
}

/* The last rank says nranks is one more than everyone else: every rank
 * fails with the root's text, whichever joined first set the meeting's size. */
TEST_F(CommInit, NranksMismatch)
{
    if (size < 2)
        GTEST_SKIP() << "needs two ranks";
    weft_unique_id_t id = shared_id();
    int nranks = rank == size - 1 ? size + 1 : size;
    weft_comm_t *c = kUntouched;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(weft_comm_init(&id, nranks, rank, &c), WEFT_ERR_INVALID_ARG);
    EXPECT_LT(seconds_since(t0), 10.0) << "a mismatch must fail at once, not after WEFT_TIMEOUT";
    EXPECT_EQ(c, kUntouched);
    std::string e = weft_last_error();
    std::string other = std::to_string(size - 1);
    /* Either "rank L says size+1, rank F says size" (the others came first)
     * or "rank X says size, rank L says size+1" (the last rank came first). */
    std::string a = "rank " + other + " says " + std::to_string(size + 1) + ", rank ";
    std::string b = " says " + std::to_string(size) + ", rank " + other + " says " + std::to_string(size + 1);
    EXPECT_NE(e.find("rank " + std::to_string(rank) + ": weft_comm_init: nranks mismatch: "), std::string::npos) << e;
    EXPECT_TRUE(e.find(a) != std::string::npos || e.find(b) != std::string::npos) << e;
}

/* The last rank claims rank 0 as well: every rank fails, naming the rank
 * joined twice and both addresses. */
TEST_F(CommInit, RankJoinedTwice)
{
    if (size < 2)
        GTEST_SKIP() << "needs two ranks";
    weft_unique_id_t id = shared_id();
    weft_comm_t *c = kUntouched;
    int claim = rank == size - 1 ? 0 : rank;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(weft_comm_init(&id, size, claim, &c), WEFT_ERR_INVALID_ARG);
    EXPECT_LT(seconds_since(t0), 10.0);
    EXPECT_EQ(c, kUntouched);
    std::string e = weft_last_error();
    EXPECT_NE(e.find("weft_comm_init: rank 0 joined twice (from "), std::string::npos) << e;
}

/* The root's process exited before anyone joined (a forked child made the
 * id): every rank fails fast, naming the root's address. */
TEST_F(CommInit, RootGone)
{
    struct {
        weft_unique_id_t id;
        int ok;
    } msg;
    std::memset(&msg, 0, sizeof(msg));
    if (rank == 0) {
        int p[2];
        ASSERT_EQ(pipe(p), 0);
        pid_t pid = fork();
        if (pid == 0) {
            /* The child touches no MPI: it makes the id, hands it over, exits. */
            close(p[0]);
            weft_unique_id_t id;
            int ok = weft_get_unique_id(&id) == WEFT_SUCCESS &&
                     write(p[1], &id, sizeof(id)) == (ssize_t)sizeof(id);
            _exit(ok ? 0 : 1);
        }
        close(p[1]);
        msg.ok = pid > 0 && read(p[0], &msg.id, sizeof(msg.id)) == (ssize_t)sizeof(msg.id);
        close(p[0]);
        int status = 0;
        msg.ok = msg.ok && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, MPI_COMM_WORLD);
    ASSERT_TRUE(msg.ok) << "the child could not make an id";
    weft_comm_t *c = kUntouched;
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(weft_comm_init(&msg.id, size, rank, &c), WEFT_ERR_TRANSPORT);
    EXPECT_LT(seconds_since(t0), 5.0) << "a gone root must not cost WEFT_TIMEOUT";
    EXPECT_EQ(c, kUntouched);
    std::string e = weft_last_error();
    EXPECT_NE(e.find("rank " + std::to_string(rank) + ": weft_comm_init: cannot reach the unique id's root at " +
                     id_addr(msg.id) + ": Connection refused"), std::string::npos) << e;
}

/* The last rank's copy of the id has a corrupted job token: the root closes
 * its connection unread (that rank fails at once, saying why that can be),
 * and the others fail after WEFT_TIMEOUT naming it as never joined. */
TEST_F(CommInitTimeout, WrongToken)
{
    if (size < 2)
        GTEST_SKIP() << "needs two ranks";
    weft_unique_id_t id = shared_id();
    const int bad = size - 1;
    if (rank == bad)
        id.internal[9] ^= 0x01;   /* bytes 8..15: the token */
    weft_comm_t *c = kUntouched;
    int rc = -1;
    double took = 0;
    /* Rank 0's process hosts the root: its refusal is logged there, by
     * the root's thread, whenever the bad rank connects -- so no rank
     * starts before rank 0 captures its stderr (on a loaded machine the
     * refusal once came before, and was not in the log). */
    std::string log = capture_stderr([&] {
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = std::chrono::steady_clock::now();
        rc = weft_comm_init(&id, size, rank, &c);
        took = seconds_since(t0);
    });
    EXPECT_EQ(c, kUntouched);
    std::string e = weft_last_error();
    if (rank == 0) {
        EXPECT_NE(log.find("WARN: the unique id's root " + id_addr(id) + ": refused a connection from "),
                  std::string::npos) << log;
        EXPECT_NE(log.find(": wrong magic or job token (a unique id of another job, or a corrupted copy)"),
                  std::string::npos) << log;
    }
    if (rank == bad) {
        EXPECT_EQ(rc, WEFT_ERR_TRANSPORT);
        EXPECT_LT(took, 2.5) << "the refused rank learns at once";
        EXPECT_NE(e.find("weft_comm_init: the unique id's root at " + id_addr(id) +
                         " closed the connection before the meeting began: it refuses a job token it did not make"),
                  std::string::npos) << e;
    } else {
        EXPECT_EQ(rc, WEFT_ERR_TIMEOUT);
        EXPECT_GT(took, 2.5);
        EXPECT_LT(took, 15.0);
        EXPECT_NE(e.find("weft_comm_init: rank " + std::to_string(bad) + " of " + std::to_string(size) +
                         " never joined (waited 3 s at the unique id's root " + id_addr(id) + ")"),
                  std::string::npos) << e;
    }
}

/* The last rank never calls weft_comm_init: the others fail after
 * WEFT_TIMEOUT (3 s here), naming it and the root. */
TEST_F(CommInitTimeout, RankNeverJoins)
{
    if (size < 2)
        GTEST_SKIP() << "needs two ranks";
    weft_unique_id_t id = shared_id();
    if (rank != size - 1) {
        weft_comm_t *c = kUntouched;
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_EQ(weft_comm_init(&id, size, rank, &c), WEFT_ERR_TIMEOUT);
        double took = seconds_since(t0);
        EXPECT_GT(took, 2.5);
        EXPECT_LT(took, 15.0);
        EXPECT_EQ(c, kUntouched);
        std::string e = weft_last_error();
        EXPECT_NE(e.find("rank " + std::to_string(rank) + ": weft_comm_init: rank " + std::to_string(size - 1) +
                         " of " + std::to_string(size) + " never joined (waited 3 s at the unique id's root " +
                         id_addr(id) + ")"), std::string::npos) << e;
    }
}
