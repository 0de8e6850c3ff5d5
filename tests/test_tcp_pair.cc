// The TCP transport end to end inside one process: two hand-built comms
// (rank 0 and rank 1 of a 2-rank job, no MPI) connect over 127.0.0.1 and
// move messages through the real pipe layer. Covers the accept path's
// token check with a stranger connecting, striping across data sockets,
// and a peer that goes away.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"   // mpi.h must not sit inside extern "C"

extern "C" {
#include "comm.h"
#include "config.h"
#include "pipe.h"
#include "tcp_hello.h"
#include "transport.h"
}

namespace {

using Env = std::map<std::string, std::string>;

const char *env_lookup(const char *name, void *ctx)
{
    const Env *env = static_cast<const Env *>(ctx);
    auto it = env->find(name);
    return it == env->end() ? nullptr : it->second.c_str();
}

const uint64_t kTokens[4] = {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1111222233334444ull,
                             0x5555666677778888ull};

// A comm of `size` ranks as weft_comm_create would leave it just before
// connect, for rank `rank`, with every other pipe on tcp.
weft_comm *fake_comm(int rank, int size, const Env &env)
{
    weft_comm *c = static_cast<weft_comm *>(calloc(1, sizeof(weft_comm)));
    c->rank = rank;
    c->size = size;
    char err[256];
    EXPECT_EQ(weft_config_load(&c->cfg, env_lookup, const_cast<Env *>(&env), err, sizeof(err)), WEFT_SUCCESS)
        << err;
    strcpy(c->cfg.tcp_if, "127.0.0.1");
    pthread_mutex_init(&c->lock, nullptr);
    pthread_mutex_init(&c->err_lock, nullptr);
    c->cards = static_cast<weft_rank_card *>(calloc((size_t)size, sizeof(weft_rank_card)));
    c->pipes = static_cast<weft_pipe *>(calloc((size_t)size, sizeof(weft_pipe)));
    for (int r = 0; r < size; r++) {
        EXPECT_EQ(weft_pipe_init(c, &c->pipes[r], r), WEFT_SUCCESS);
        if (r != rank) {
            c->pipes[r].tp = &weft_transport_tcp;
            c->pipes[r].eager_limit = weft_transport_tcp.eager_limit(c);
        }
    }
    c->tp_used = 1u << WEFT_TP_TCP;
    return c;
}

void free_comm(weft_comm *c)
{
    weft_transport_tcp.disconnect(c);
    for (int r = 0; r < c->size; r++)
        weft_pipe_fini(&c->pipes[r]);
    free(c->pipes);
    free(c->cards);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->err_lock);
    free(c);
}

// Fills every card (listeners open) and hands each comm all the cards, as
// the MPI_Allgather would.
void exchange_cards(const std::vector<weft_comm *> &comms)
{
    for (size_t r = 0; r < comms.size(); r++) {
        ASSERT_EQ(weft_transport_tcp.card_fill(comms[r], &comms[r]->cards[r]), WEFT_SUCCESS)
            << comms[r]->last_error;
        comms[r]->cards[r].token = kTokens[r];
    }
    for (weft_comm *c : comms)
        for (size_t r = 0; r < comms.size(); r++)
            c->cards[r] = comms[r]->cards[r];
}

void exchange_cards(weft_comm *a, weft_comm *b) { exchange_cards(std::vector<weft_comm *>{a, b}); }

// Every rank connects at once, each on its own thread, as separate processes would.
std::vector<int> connect_all(const std::vector<weft_comm *> &comms)
{
    std::vector<int> rcs(comms.size(), -1);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms.size(); r++)
        threads.emplace_back([&, r] { rcs[r] = weft_transport_tcp.connect(comms[r]); });
    for (std::thread &t : threads)
        t.join();
    return rcs;
}

void connect_both(weft_comm *a, weft_comm *b, int *rca, int *rcb)
{
    std::vector<int> rcs = connect_all({a, b});
    *rca = rcs[0];
    *rcb = rcs[1];
}

// One progress pass on every comm, as weft_progress does.
void pump(const std::vector<weft_comm *> &comms)
{
    for (weft_comm *c : comms) {
        weft_transport_tcp.progress(c);
        for (int r = 0; r < c->size; r++)
            if (c->pipes[r].out_head)
                weft_pipe_flush(&c->pipes[r]);
    }
}

bool pump_until(const std::vector<weft_comm *> &comms, const std::vector<weft_request *> &reqs,
                double seconds = 20)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
        bool all = true;
        for (weft_request *r : reqs)
            all = all && r->state == WEFT_REQ_DONE;
        if (all)
            return true;
        if (std::chrono::steady_clock::now() > end)
            return false;
        pump(comms);
    }
}

// A client socket connected to a's listener (card of `rank`), blocking,
// with a receive timeout so a test cannot hang.
int stranger_connect(const weft_rank_card &card)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = card.tcp_port;
    memcpy(&sa.sin_addr, card.tcp_addr, 4);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)), 0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

Env small_env() { return {{"WEFT_TCP_STREAMS", "3"}, {"WEFT_TCP_CHUNK_KB", "4"}, {"WEFT_TCP_EAGER", "1024"},
                          {"WEFT_TIMEOUT", "10"}}; }

}  // namespace

TEST(TcpPair, CardOffersAListenerOnTheChosenAddress)
{
    weft_comm *c = fake_comm(0, 2, small_env());
    weft_rank_card card{};
    ASSERT_EQ(weft_transport_tcp.card_fill(c, &card), WEFT_SUCCESS) << c->last_error;
    EXPECT_EQ(card.tcp_family, AF_INET);
    EXPECT_NE(card.tcp_port, 0);
    in_addr lo;
    inet_pton(AF_INET, "127.0.0.1", &lo);
    EXPECT_EQ(memcmp(card.tcp_addr, &lo, 4), 0);
    free_comm(c);
}

TEST(TcpPair, UnknownInterfaceIsAnError)
{
    weft_comm *c = fake_comm(0, 2, small_env());
    strcpy(c->cfg.tcp_if, "no-such-if0");
    weft_rank_card card{};
    EXPECT_EQ(weft_transport_tcp.card_fill(c, &card), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(c->last_error).find("no-such-if0"), std::string::npos) << c->last_error;
    free_comm(c);
}

TEST(TcpPair, StrangersWithAWrongTokenOrRankAreRejectedAndRanksStillConnect)
{
    weft_comm *a = fake_comm(0, 2, small_env());
    weft_comm *b = fake_comm(1, 2, small_env());
    exchange_cards(a, b);

    // Rank 1 accepts (rank 0 is the lower rank and connects). Two strangers
    // reach its listener first: one with a wrong token, one with the right
    // token but claiming a rank that does not connect to rank 1.
    int bad_token = stranger_connect(b->cards[1]);
    weft_tcp_hello h{};
    h.token = kTokens[1] ^ 0xff;
    h.rank = 0;
    h.index = 0;
    h.streams = 3;
    h.chunk = 4096;
    h.eager_limit = 1024;
    ASSERT_EQ(send(bad_token, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    int bad_rank = stranger_connect(b->cards[1]);
    h.token = kTokens[1];
    h.rank = 1;   // rank 1 itself
    ASSERT_EQ(send(bad_rank, &h, sizeof(h), 0), (ssize_t)sizeof(h));

    int rca = -1, rcb = -1;
    connect_both(a, b, &rca, &rcb);
    EXPECT_EQ(rca, WEFT_SUCCESS) << a->last_error;
    EXPECT_EQ(rcb, WEFT_SUCCESS) << b->last_error;
    EXPECT_NE(a->pipes[1].tp_peer, nullptr);
    EXPECT_NE(b->pipes[0].tp_peer, nullptr);

    // The strangers got no acknowledgement: their connections were closed.
    for (int fd : {bad_token, bad_rank}) {
        char buf[16];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        EXPECT_LE(n, 0) << "a stranger was answered";
        if (n < 0)
            EXPECT_NE(errno, EAGAIN) << "stranger's connection left open";
        close(fd);
    }
    free_comm(a);
    free_comm(b);
}

TEST(TcpPair, MessagesOfEverySizeArriveIntactBothWays)
{
    weft_comm *a = fake_comm(0, 2, small_env());
    weft_comm *b = fake_comm(1, 2, small_env());
    exchange_cards(a, b);
    int rca = -1, rcb = -1;
    connect_both(a, b, &rca, &rcb);
    ASSERT_EQ(rca, WEFT_SUCCESS) << a->last_error;
    ASSERT_EQ(rcb, WEFT_SUCCESS) << b->last_error;

    // eager limit 1024, chunk 4096, 3 streams: eager, threshold, one chunk,
    // fewer chunks than streams, many chunks with a short tail.
    const std::vector<size_t> sizes = {0, 1, 1023, 1024, 1025, 4096, 4097, 8193, 3 * 4096 * 5 + 7,
                                       (3u << 20) + 3};
    std::vector<std::vector<unsigned char>> sbuf[2], rbuf[2];
    std::vector<weft_request *> reqs;
    weft_comm *comms[2] = {a, b};
    for (int from = 0; from < 2; from++) {
        int to = 1 - from;
        for (size_t i = 0; i < sizes.size(); i++) {
            std::vector<unsigned char> s(sizes[i]);
            for (size_t k = 0; k < s.size(); k++)
                s[k] = (unsigned char)(k * 131 + i * 7 + from);
            sbuf[from].push_back(std::move(s));
            rbuf[to].emplace_back(sizes[i] + 16, 0xEE);
        }
        for (size_t i = 0; i < sizes.size(); i++) {
            weft_request *r = nullptr;
            int tag = (int)(i % 3);   // several lanes at once
            ASSERT_EQ(weft_pipe_irecv(comms[to], rbuf[to][i].data(), rbuf[to][i].size(), from, tag, &r),
                      WEFT_SUCCESS);
            reqs.push_back(r);
            ASSERT_EQ(weft_pipe_isend(comms[from], sbuf[from][i].data(), sizes[i], to, tag, &r), WEFT_SUCCESS);
            reqs.push_back(r);
        }
    }
    ASSERT_TRUE(pump_until({a, b}, reqs)) << a->last_error << " / " << b->last_error;
    for (weft_request *r : reqs) {
        EXPECT_EQ(r->status.error, WEFT_SUCCESS);
        free(r);
    }
    for (int to = 0; to < 2; to++) {
        for (size_t i = 0; i < sizes.size(); i++) {
            const auto &got = rbuf[to][i];
            const auto &want = sbuf[1 - to][i];
            ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin())) << "size " << sizes[i] << " to " << to;
            for (size_t k = want.size(); k < got.size(); k++)
                ASSERT_EQ(got[k], 0xEE) << "byte written past the message, size " << sizes[i];
        }
    }
    free_comm(a);
    free_comm(b);
}

TEST(TcpPair, PeerThatGoesAwayBreaksThePipeNamingThePeer)
{
    weft_comm *a = fake_comm(0, 2, small_env());
    weft_comm *b = fake_comm(1, 2, small_env());
    exchange_cards(a, b);
    int rca = -1, rcb = -1;
    connect_both(a, b, &rca, &rcb);
    ASSERT_EQ(rca, WEFT_SUCCESS) << a->last_error;
    ASSERT_EQ(rcb, WEFT_SUCCESS) << b->last_error;

    // A large send waiting for its CTS when rank 1 disappears.
    std::vector<unsigned char> big(1 << 20, 1);
    weft_request *s = nullptr;
    ASSERT_EQ(weft_pipe_isend(a, big.data(), big.size(), 1, 0, &s), WEFT_SUCCESS);
    weft_transport_tcp.disconnect(b);

    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (s->state != WEFT_REQ_DONE && std::chrono::steady_clock::now() < end)
        weft_transport_tcp.progress(a);
    ASSERT_EQ(s->state, WEFT_REQ_DONE);
    EXPECT_EQ(s->status.error, WEFT_ERR_TRANSPORT);
    EXPECT_EQ(a->pipes[1].broken, WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(a->last_error).find("peer 1"), std::string::npos) << a->last_error;
    free(s);
    // Sends on the broken pipe fail at once instead of hanging.
    EXPECT_NE(weft_pipe_isend(a, big.data(), 10, 1, 0, &s), WEFT_SUCCESS);
    free_comm(a);
    free_comm(b);
}

TEST(TcpPair, DifferentStripingSettingsFailConnectWithAClearError)
{
    Env e0 = small_env(), e1 = small_env();
    e0["WEFT_TIMEOUT"] = e1["WEFT_TIMEOUT"] = "2";
    e1["WEFT_TCP_STREAMS"] = "2";
    weft_comm *a = fake_comm(0, 2, e0);
    weft_comm *b = fake_comm(1, 2, e1);
    exchange_cards(a, b);
    int rca = -1, rcb = -1;
    connect_both(a, b, &rca, &rcb);
    EXPECT_EQ(rca, WEFT_ERR_TRANSPORT) << a->last_error;
    EXPECT_NE(std::string(a->last_error).find("peer 1"), std::string::npos) << a->last_error;
    EXPECT_EQ(rcb, WEFT_ERR_TIMEOUT) << b->last_error;
    EXPECT_NE(std::string(b->last_error).find("peer 0"), std::string::npos) << b->last_error;
    free_comm(a);
    free_comm(b);
}

TEST(TcpPair, OtherPeersKeepWorkingWhenOnePeerGoesAway)
{
    std::vector<weft_comm *> comms;
    for (int r = 0; r < 3; r++)
        comms.push_back(fake_comm(r, 3, small_env()));
    exchange_cards(comms);
    for (int rc : connect_all(comms))
        ASSERT_EQ(rc, WEFT_SUCCESS);
    weft_transport_tcp.disconnect(comms[2]);   // rank 2 vanishes

    // Rank 0 notices on its next progress passes...
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((!comms[0]->pipes[2].broken || !comms[1]->pipes[2].broken) && std::chrono::steady_clock::now() < end)
        pump({comms[0], comms[1]});
    EXPECT_EQ(comms[0]->pipes[2].broken, WEFT_ERR_TRANSPORT);
    EXPECT_EQ(comms[1]->pipes[2].broken, WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(comms[0]->last_error).find("peer 2"), std::string::npos) << comms[0]->last_error;

    // ...while 0 <-> 1 still carry eager and striped messages.
    std::vector<unsigned char> s1(100, 7), s2(50000, 9), r1(100), r2(50000);
    std::vector<weft_request *> reqs(4);
    ASSERT_EQ(weft_pipe_irecv(comms[1], r1.data(), r1.size(), 0, 5, &reqs[0]), WEFT_SUCCESS);
    ASSERT_EQ(weft_pipe_irecv(comms[0], r2.data(), r2.size(), 1, 5, &reqs[1]), WEFT_SUCCESS);
    ASSERT_EQ(weft_pipe_isend(comms[0], s1.data(), s1.size(), 1, 5, &reqs[2]), WEFT_SUCCESS);
    ASSERT_EQ(weft_pipe_isend(comms[1], s2.data(), s2.size(), 0, 5, &reqs[3]), WEFT_SUCCESS);
    ASSERT_TRUE(pump_until({comms[0], comms[1]}, reqs)) << comms[0]->last_error;
    for (weft_request *r : reqs) {
        EXPECT_EQ(r->status.error, WEFT_SUCCESS);
        free(r);
    }
    EXPECT_EQ(r1, s1);
    EXPECT_EQ(r2, s2);
    for (weft_comm *c : comms)
        free_comm(c);
}
