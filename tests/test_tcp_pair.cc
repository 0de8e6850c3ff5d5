// The TCP transport end to end inside one process, driven through its
// vtable alone: fake ranks of a small job (no MPI, no pipe layer), each with
// its own core, rank cards and upcalls that record what the transport
// reports, connect over 127.0.0.1. Covers the accept path's token check
// with a stranger connecting, control frames in order, rendezvous striped
// across data sockets, a peer that goes away, and the lazy connection: no
// socket before a pair's first message, both ranks sending first at once
// (one set of sockets survives), a peer that is gone or never answers.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "weft.h"   // mpi.h must not sit inside extern "C"

extern "C" {
#include "config.h"
#include "core.h"
#include "log.h"
#include "tcp_hello.h"
#include "tcp_listen.h"
#include "transport.h"
extern const struct weft_transport weft_transport_tcp;
}

namespace {

const weft_transport &tcp = weft_transport_tcp;

using Env = std::map<std::string, std::string>;

const char *env_lookup(const char *name, void *ctx)
{
    const Env *env = static_cast<const Env *>(ctx);
    auto it = env->find(name);
    return it == env->end() ? nullptr : it->second.c_str();
}

const uint64_t kTokens[4] = {0x0123456789abcdefull, 0xfedcba9876543210ull, 0x1111222233334444ull,
                             0x5555666677778888ull};

// The tcp blob in a rank card, as the transport writes it: the card's
// bytes are the protocol between ranks.
struct TcpCard {
    uint16_t family;
    uint16_t port;     // network byte order
    uint8_t addr[16];  // IPv4 in the first 4 bytes
};

struct Frame {
    int peer;
    std::string bytes;   // the pipe's header, then its payload
};

struct Done {
    weft_tp_xfer *x;
    int err;
};

struct Failed {
    int peer;
    int err;
};

// One rank as the pipe layer and the comm would set it up for tcp.
struct Rank {
    weft_core core;
    std::vector<unsigned char> cards;   // every rank's card: header, then the tcp blob
    std::vector<unsigned char> uses;
    weft_tp_upcalls up{};
    weft_tp_env env{};
    void *ctx = nullptr;
    bool destroyed = false;

    std::vector<Frame> frames;
    std::vector<Done> done;
    std::vector<Failed> failed;

    std::string last_error() const { return weft_error_line(const_cast<struct weft_core *>(&core)); }
};

size_t blob_off() { return (sizeof(weft_card_hdr) + 7) & ~(size_t)7; }
size_t card_stride() { return (blob_off() + tcp.card_bytes + 7) & ~(size_t)7; }

void on_ctrl(void *arg, int peer, const void *frame, size_t len)
{
    static_cast<Rank *>(arg)->frames.push_back({peer, std::string(static_cast<const char *>(frame), len)});
}

void rndv_done(void *arg, weft_tp_xfer *x, int err) { static_cast<Rank *>(arg)->done.push_back({x, err}); }

// The pipe breaks and forgets the peer's transfers, as the contract says.
void peer_failed(void *arg, int peer, int err)
{
    Rank *r = static_cast<Rank *>(arg);
    r->failed.push_back({peer, err});
    tcp.abort_peer(r->ctx, peer);
}

// Rank `rank` of `size`, every other rank on tcp, before create.
std::unique_ptr<Rank> fake_rank(int rank, int size, const Env &env)
{
    std::unique_ptr<Rank> r(new Rank());
    weft_core_init(&r->core, rank, size);
    char err[256];
    EXPECT_EQ(weft_config_load(&r->core.cfg, env_lookup, const_cast<Env *>(&env), err, sizeof(err)), WEFT_SUCCESS)
        << err;
    strcpy(r->core.cfg.tcp_if, "127.0.0.1");
    r->cards.assign((size_t)size * card_stride(), 0);
    r->uses.assign((size_t)size, 1);
    r->uses[(size_t)rank] = 0;
    r->up.arg = r.get();
    r->up.on_ctrl = on_ctrl;
    r->up.rndv_done = rndv_done;
    r->up.peer_failed = peer_failed;
    r->env.core = &r->core;
    r->env.index = 0;
    r->env.cards.base = r->cards.data();
    r->env.cards.stride = card_stride();
    r->env.cards.blob_off = blob_off();
    r->env.up = &r->up;
    r->env.coll = nullptr;   // tcp exchanges nothing collectively
    r->env.uses = r->uses.data();
    r->env.used_anywhere = 1;
    return r;
}

weft_card_hdr *card_hdr(Rank &r, int rank) { return reinterpret_cast<weft_card_hdr *>(&r.cards[(size_t)rank * card_stride()]); }
unsigned char *blob(Rank &r, int rank) { return &r.cards[(size_t)rank * card_stride() + blob_off()]; }
TcpCard tcp_card(Rank &r, int rank)
{
    TcpCard c;
    memcpy(&c, blob(r, rank), sizeof(c));
    return c;
}

void destroy(Rank &r)
{
    if (!r.destroyed)
        tcp.destroy(r.ctx);
    r.destroyed = true;
    r.ctx = nullptr;
}

void free_rank(std::unique_ptr<Rank> &r)
{
    destroy(*r);
    weft_core_fini(&r->core);
    r.reset();
}

using Ranks = std::vector<Rank *>;

// Creates tcp on every rank (listeners open, own card written) and hands
// each rank every card, as the bootstrap's exchange would.
void exchange_cards(const Ranks &ranks)
{
    for (size_t r = 0; r < ranks.size(); r++) {
        Rank &me = *ranks[r];
        weft_card_hdr *h = card_hdr(me, (int)r);
        h->token = kTokens[r];
        h->pid = (int32_t)getpid();
        snprintf(h->hostname, sizeof(h->hostname), "host%zu", r);
        ASSERT_EQ(tcp.create(&me.env, blob(me, (int)r), &me.ctx), WEFT_SUCCESS) << me.last_error();
        ASSERT_NE(me.ctx, nullptr);
    }
    for (Rank *dst : ranks)
        for (size_t r = 0; r < ranks.size(); r++)
            memcpy(card_hdr(*dst, (int)r), card_hdr(*ranks[r], (int)r), card_stride());
}

// Every rank connects at once, each on its own thread, as separate processes would.
std::vector<int> connect_all(const Ranks &ranks)
{
    std::vector<int> rcs(ranks.size(), -1);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < ranks.size(); r++)
        threads.emplace_back([&, r] { rcs[r] = tcp.connect(&ranks[r]->env, ranks[r]->ctx); });
    for (std::thread &t : threads)
        t.join();
    return rcs;
}

// One progress pass on every rank, as weft_progress does.
void pump(const Ranks &ranks)
{
    for (Rank *r : ranks)
        if (!r->destroyed)
            tcp.progress(r->ctx);
}

bool pump_until(const Ranks &ranks, const std::function<bool()> &done, double seconds = 20)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
        if (done())
            return true;
        if (std::chrono::steady_clock::now() > end)
            return false;
        pump(ranks);
    }
}

// Open descriptors of this process (the directory's own one not counted).
int count_fds()
{
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr)
        return -1;
    int n = 0;
    while (dirent *e = readdir(d))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

// Sends one control frame, pumping while the transport says "no room now".
int send_frame(const Ranks &ranks, Rank &from, int to, const std::string &hdr, const std::string &payload)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
        int rc = tcp.ctrl_send(from.ctx, to, hdr.data(), hdr.size(), payload.data(), payload.size());
        if (rc != WEFT_EAGAIN || std::chrono::steady_clock::now() > end)
            return rc;
        pump(ranks);
    }
}

// A client socket connected to the listener a card offers, blocking, with
// a receive timeout so a test cannot hang.
int stranger_connect(const TcpCard &card)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = card.port;
    memcpy(&sa.sin_addr, card.addr, 4);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)), 0);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

Env small_env() { return {{"WEFT_TCP_STREAMS", "3"}, {"WEFT_TCP_CHUNK_KB", "4"}, {"WEFT_TCP_EAGER", "1024"},
                          {"WEFT_TIMEOUT", "10"}}; }

// A transfer as the pipe would hand it over: its buffer and byte count.
std::unique_ptr<weft_tp_xfer> make_xfer(void *buf, size_t bytes, int peer, int tag = 0)
{
    std::unique_ptr<weft_tp_xfer> x(new weft_tp_xfer());
    x->buf = buf;
    x->bytes = bytes;
    x->mem_kind = 0;
    x->device = -1;
    x->peer = peer;
    x->tag = tag;
    return x;
}

// Connects every rank and brings every pair up: connections are lazy, so
// each pair exchanges one frame each way (then forgotten).
void connect_up(const Ranks &ranks)
{
    for (int rc : connect_all(ranks))
        ASSERT_EQ(rc, WEFT_SUCCESS);
    for (size_t i = 0; i < ranks.size(); i++)
        for (size_t j = 0; j < ranks.size(); j++)
            if (i != j)
                ASSERT_EQ(send_frame(ranks, *ranks[i], (int)j, "\5", "up"), WEFT_SUCCESS) << ranks[i]->last_error();
    ASSERT_TRUE(pump_until(ranks, [&] {
        for (Rank *r : ranks)
            if (r->frames.size() != ranks.size() - 1)
                return false;
        return true;
    }));
    for (Rank *r : ranks)
        r->frames.clear();
}

size_t done_count(const Rank &r, int err)
{
    return (size_t)std::count_if(r.done.begin(), r.done.end(), [err](const Done &d) { return d.err == err; });
}

// Connects two fresh ranks; the test owns them.
struct Pair {
    std::unique_ptr<Rank> a, b;
    explicit Pair(const Env &env = small_env()) : a(fake_rank(0, 2, env)), b(fake_rank(1, 2, env)) {}
    Ranks ranks() const { return {a.get(), b.get()}; }
    ~Pair()
    {
        if (a)
            free_rank(a);
        if (b)
            free_rank(b);
    }
};

}  // namespace

TEST(TcpPair, DescribesItselfAsACarrierForAnyPeer)
{
    EXPECT_STREQ(tcp.name, "tcp");
    EXPECT_EQ(tcp.ctrl, 1);
    EXPECT_EQ(tcp.scope, WEFT_TP_SCOPE_ANY);
    EXPECT_EQ(tcp.sure, 0);
    EXPECT_GE(tcp.card_bytes, sizeof(TcpCard));
    EXPECT_EQ(tcp.card_bytes % 8, 0u);
    EXPECT_EQ(tcp.rndv_get, nullptr);
    EXPECT_NE(tcp.rndv_expect, nullptr);
    EXPECT_NE(tcp.rndv_push, nullptr);
    EXPECT_EQ(tcp.rndv_mem(nullptr, 1), WEFT_TP_MEM_HOST);
}

TEST(TcpPair, CardOffersAListenerOnTheChosenAddress)
{
    std::unique_ptr<Rank> r = fake_rank(0, 2, small_env());
    ASSERT_EQ(tcp.create(&r->env, blob(*r, 0), &r->ctx), WEFT_SUCCESS) << r->last_error();
    TcpCard card = tcp_card(*r, 0);
    EXPECT_EQ(card.family, AF_INET);
    EXPECT_NE(card.port, 0);
    in_addr lo;
    inet_pton(AF_INET, "127.0.0.1", &lo);
    EXPECT_EQ(memcmp(card.addr, &lo, 4), 0);
    EXPECT_EQ(tcp.eager_limit(r->ctx, 1, 0), 1024u);
    EXPECT_EQ(tcp.eager_limit(r->ctx, 1, 1), 1024u);

    // reach: both ranks need a listener; rank 1's blob is still zero.
    char why[128] = "";
    EXPECT_EQ(tcp.reach(&r->env.cards, 0, 1, why, sizeof(why)), 0);
    EXPECT_NE(std::string(why).find("by the peer"), std::string::npos) << why;
    why[0] = '\0';
    EXPECT_EQ(tcp.reach(&r->env.cards, 1, 0, why, sizeof(why)), 0);
    EXPECT_NE(std::string(why).find("not offered here"), std::string::npos) << why;
    memcpy(blob(*r, 1), blob(*r, 0), sizeof(TcpCard));
    EXPECT_EQ(tcp.reach(&r->env.cards, 0, 1, why, sizeof(why)), 1);
    EXPECT_EQ(tcp.reach(&r->env.cards, 1, 0, why, sizeof(why)), 1);
    free_rank(r);
}

TEST(TcpPair, UnknownInterfaceIsAnError)
{
    std::unique_ptr<Rank> r = fake_rank(0, 2, small_env());
    strcpy(r->core.cfg.tcp_if, "no-such-if0");
    EXPECT_EQ(tcp.create(&r->env, blob(*r, 0), &r->ctx), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(r->ctx, nullptr);
    EXPECT_NE(r->last_error().find("no-such-if0"), std::string::npos) << r->last_error();
    free_rank(r);
}

TEST(TcpPair, ConnectWithoutStateOrPeersIsANoOp)
{
    std::unique_ptr<Rank> r = fake_rank(0, 2, small_env());
    // Not offered here: no ctx, nothing to exchange.
    EXPECT_EQ(tcp.connect(&r->env, nullptr), WEFT_SUCCESS);
    // Offered, but no pipe uses it: the listener just closes.
    ASSERT_EQ(tcp.create(&r->env, blob(*r, 0), &r->ctx), WEFT_SUCCESS) << r->last_error();
    r->uses.assign(2, 0);
    EXPECT_EQ(tcp.connect(&r->env, r->ctx), WEFT_SUCCESS) << r->last_error();
    EXPECT_EQ(tcp.progress(r->ctx), 0);
    EXPECT_EQ(tcp.busy(r->ctx), 0);
    free_rank(r);
}

TEST(TcpPair, StrangersWithAWrongTokenOrRankAreRejectedAndRanksStillConnect)
{
    Pair p;
    exchange_cards(p.ranks());

    // Rank 1 accepts (rank 0 is the lower rank and connects). Two strangers
    // reach its listener first: one with a wrong token, one with the right
    // token but claiming a rank that does not connect to rank 1.
    int bad_token = stranger_connect(tcp_card(*p.b, 1));
    weft_tcp_hello h{};
    h.token = kTokens[1] ^ 0xff;
    h.rank = 0;
    h.index = 0;
    h.streams = 3;
    h.chunk = 4096;
    h.eager_limit = 1024;
    ASSERT_EQ(send(bad_token, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    int bad_rank = stranger_connect(tcp_card(*p.b, 1));
    h.token = kTokens[1];
    h.rank = 1;   // rank 1 itself
    ASSERT_EQ(send(bad_rank, &h, sizeof(h), 0), (ssize_t)sizeof(h));

    std::vector<int> rcs = connect_all(p.ranks());
    EXPECT_EQ(rcs[0], WEFT_SUCCESS) << p.a->last_error();
    EXPECT_EQ(rcs[1], WEFT_SUCCESS) << p.b->last_error();

    // The ranks themselves are connected: a frame goes each way.
    ASSERT_EQ(send_frame(p.ranks(), *p.a, 1, "h0", "from 0"), WEFT_SUCCESS) << p.a->last_error();
    ASSERT_EQ(send_frame(p.ranks(), *p.b, 0, "h1", "from 1"), WEFT_SUCCESS) << p.b->last_error();
    ASSERT_TRUE(pump_until(p.ranks(), [&] { return p.a->frames.size() == 1 && p.b->frames.size() == 1; }));
    EXPECT_EQ(p.b->frames[0].peer, 0);
    EXPECT_EQ(p.b->frames[0].bytes, "h0from 0");
    EXPECT_EQ(p.a->frames[0].peer, 1);
    EXPECT_EQ(p.a->frames[0].bytes, "h1from 1");

    // The strangers got no acknowledgement: their connections were closed.
    for (int fd : {bad_token, bad_rank}) {
        char buf[16];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        EXPECT_LE(n, 0) << "a stranger was answered";
        if (n < 0) {
            EXPECT_NE(errno, EAGAIN) << "stranger's connection left open";
        }
        close(fd);
    }
    EXPECT_TRUE(p.a->failed.empty());
    EXPECT_TRUE(p.b->failed.empty());
}

TEST(TcpPair, ControlFramesArriveWholeAndInOrderBothWays)
{
    Pair p;
    exchange_cards(p.ranks());
    std::vector<int> rcs = connect_all(p.ranks());
    ASSERT_EQ(rcs[0], WEFT_SUCCESS) << p.a->last_error();
    ASSERT_EQ(rcs[1], WEFT_SUCCESS) << p.b->last_error();

    // Headers up to WEFT_TP_CTRL_HDR_MAX, payloads up to the eager limit
    // (1024 here), empty payloads, and enough of them to fill the socket.
    Rank *rk[2] = {p.a.get(), p.b.get()};
    std::vector<std::string> sent[2];
    const size_t hdr_sizes[] = {1, 16, 40, WEFT_TP_CTRL_HDR_MAX};
    const size_t pay_sizes[] = {0, 1, 255, 1000, 1024};
    for (int i = 0; i < 3000; i++) {
        for (int from = 0; from < 2; from++) {
            std::string hdr(hdr_sizes[i % 4], '\0'), pay(pay_sizes[(i / 4) % 5], '\0');
            for (size_t k = 0; k < hdr.size(); k++)
                hdr[k] = (char)(k == 0 ? (i % WEFT_TP_FRAME_TYPE_LIMIT) : (k * 7 + (size_t)i + (size_t)from));
            for (size_t k = 0; k < pay.size(); k++)
                pay[k] = (char)(k * 131 + (size_t)i * 3 + (size_t)from);
            ASSERT_EQ(send_frame(p.ranks(), *rk[from], 1 - from, hdr, pay), WEFT_SUCCESS)
                << rk[from]->last_error();
            sent[from].push_back(hdr + pay);
        }
    }
    ASSERT_TRUE(pump_until(p.ranks(), [&] {
        return p.a->frames.size() == sent[1].size() && p.b->frames.size() == sent[0].size();
    })) << p.a->frames.size() << " / " << p.b->frames.size();
    for (int to = 0; to < 2; to++) {
        for (size_t i = 0; i < sent[1 - to].size(); i++) {
            ASSERT_EQ(rk[to]->frames[i].peer, 1 - to);
            ASSERT_EQ(rk[to]->frames[i].bytes, sent[1 - to][i]) << "frame " << i << " to " << to;
        }
    }
    // Everything accepted has left: destroy would not wait.
    ASSERT_TRUE(pump_until(p.ranks(), [&] { return !tcp.busy(p.a->ctx) && !tcp.busy(p.b->ctx); }));
}

TEST(TcpPair, ControlFrameLimitsFollowTheContract)
{
    // WEFT_TCP_EAGER=0: payloads of WEFT_TP_CTRL_PAYLOAD_MIN still fit
    // (rendezvous keys travel as CTS payloads).
    Env env = small_env();
    env["WEFT_TCP_EAGER"] = "0";
    Pair p(env);
    exchange_cards(p.ranks());
    std::vector<int> rcs = connect_all(p.ranks());
    ASSERT_EQ(rcs[0], WEFT_SUCCESS) << p.a->last_error();
    ASSERT_EQ(rcs[1], WEFT_SUCCESS) << p.b->last_error();
    EXPECT_EQ(tcp.eager_limit(p.a->ctx, 1, 0), 0u);

    std::string hdr(WEFT_TP_CTRL_HDR_MAX, '\3'), pay(WEFT_TP_CTRL_PAYLOAD_MIN, 'k');
    ASSERT_EQ(send_frame(p.ranks(), *p.a, 1, hdr, pay), WEFT_SUCCESS) << p.a->last_error();
    ASSERT_TRUE(pump_until(p.ranks(), [&] { return p.b->frames.size() == 1; }));
    EXPECT_EQ(p.b->frames[0].bytes, hdr + pay);

    EXPECT_EQ(tcp.ctrl_send(p.a->ctx, 1, hdr.data(), hdr.size(), pay.data(), pay.size() + 1), WEFT_ERR_INTERNAL);
    std::string big_hdr(WEFT_TP_CTRL_HDR_MAX + 1, '\3');
    EXPECT_EQ(tcp.ctrl_send(p.a->ctx, 1, big_hdr.data(), big_hdr.size(), nullptr, 0), WEFT_ERR_INTERNAL);
    // Refused frames leave the connection usable.
    ASSERT_EQ(send_frame(p.ranks(), *p.a, 1, "\1", ""), WEFT_SUCCESS);
    ASSERT_TRUE(pump_until(p.ranks(), [&] { return p.b->frames.size() == 2; }));
    EXPECT_EQ(p.b->frames[1].bytes, "\1");
    EXPECT_TRUE(p.b->failed.empty());
}

TEST(TcpPair, RendezvousOfEverySizeArrivesIntactBothWays)
{
    Pair p;
    exchange_cards(p.ranks());
    std::vector<int> rcs = connect_all(p.ranks());
    ASSERT_EQ(rcs[0], WEFT_SUCCESS) << p.a->last_error();
    ASSERT_EQ(rcs[1], WEFT_SUCCESS) << p.b->last_error();

    // chunk 4096, 3 streams: less than one chunk, one chunk, fewer chunks
    // than streams, many chunks with a short tail, megabytes.
    const std::vector<size_t> sizes = {1, 1025, 4096, 4097, 8193, 3 * 4096 * 5 + 7, (3u << 20) + 3};
    Rank *rk[2] = {p.a.get(), p.b.get()};
    std::vector<std::vector<unsigned char>> sbuf[2], rbuf[2];
    std::vector<std::unique_ptr<weft_tp_xfer>> sx[2], rx[2];
    for (int from = 0; from < 2; from++) {
        int to = 1 - from;
        for (size_t i = 0; i < sizes.size(); i++) {
            std::vector<unsigned char> s(sizes[i]);
            for (size_t k = 0; k < s.size(); k++)
                s[k] = (unsigned char)(k * 131 + i * 7 + (size_t)from);
            sbuf[from].push_back(std::move(s));
            rbuf[to].emplace_back(sizes[i] + 16, 0xEE);
        }
        for (size_t i = 0; i < sizes.size(); i++) {
            // As the pipe does: the receiver expects (and sends the CTS with
            // the key), then the sender pushes, both in CTS order.
            rx[to].push_back(make_xfer(rbuf[to][i].data(), sizes[i], from, (int)i));
            unsigned char key[WEFT_TP_KEY_MAX];
            size_t keylen = 99;
            ASSERT_EQ(tcp.rndv_expect(rk[to]->ctx, from, rx[to][i].get(), nullptr, key, &keylen), WEFT_SUCCESS)
                << rk[to]->last_error();
            EXPECT_EQ(keylen, 0u);
            sx[from].push_back(make_xfer(sbuf[from][i].data(), sizes[i], to, (int)i));
            ASSERT_EQ(tcp.rndv_push(rk[from]->ctx, to, sx[from][i].get(), key, keylen), WEFT_SUCCESS)
                << rk[from]->last_error();
            // A control frame between pushes travels independently.
            ASSERT_EQ(send_frame(p.ranks(), *rk[from], to, "\2", std::to_string(i)), WEFT_SUCCESS);
        }
    }
    const size_t want = 2 * sizes.size();   // per rank: its pushes and its receives
    ASSERT_TRUE(pump_until(p.ranks(), [&] { return p.a->done.size() == want && p.b->done.size() == want; }))
        << p.a->last_error() << " / " << p.b->last_error();

    for (int r = 0; r < 2; r++) {
        EXPECT_EQ(done_count(*rk[r], WEFT_SUCCESS), want);
        EXPECT_TRUE(rk[r]->failed.empty());
        // Completions of each kind come in FIFO order.
        std::vector<weft_tp_xfer *> pushes, recvs;
        for (const Done &d : rk[r]->done) {
            bool is_push = std::any_of(sx[r].begin(), sx[r].end(), [&](const auto &x) { return x.get() == d.x; });
            (is_push ? pushes : recvs).push_back(d.x);
        }
        ASSERT_EQ(pushes.size(), sizes.size());
        ASSERT_EQ(recvs.size(), sizes.size());
        for (size_t i = 0; i < sizes.size(); i++) {
            EXPECT_EQ(pushes[i], sx[r][i].get()) << "push " << i << " of rank " << r;
            EXPECT_EQ(recvs[i], rx[r][i].get()) << "receive " << i << " of rank " << r;
        }
        ASSERT_EQ(rk[r]->frames.size(), sizes.size());
        for (size_t i = 0; i < sizes.size(); i++)
            EXPECT_EQ(rk[r]->frames[i].bytes, "\2" + std::to_string(i));
    }
    for (int to = 0; to < 2; to++) {
        for (size_t i = 0; i < sizes.size(); i++) {
            const auto &got = rbuf[to][i];
            const auto &sent = sbuf[1 - to][i];
            ASSERT_TRUE(std::equal(sent.begin(), sent.end(), got.begin())) << "size " << sizes[i] << " to " << to;
            for (size_t k = sent.size(); k < got.size(); k++)
                ASSERT_EQ(got[k], 0xEE) << "byte written past the message, size " << sizes[i];
        }
    }
}

TEST(TcpPair, CompletionUpcallsMayReenterTheTransport)
{
    Pair p;
    exchange_cards(p.ranks());
    std::vector<int> rcs = connect_all(p.ranks());
    ASSERT_EQ(rcs[0], WEFT_SUCCESS) << p.a->last_error();
    ASSERT_EQ(rcs[1], WEFT_SUCCESS) << p.b->last_error();

    // A chain of transfers where each receive's completion posts the next
    // receive and sends a frame from inside rndv_done (as the pipe answers
    // with a CTS), and the sender pushes the next once that frame is in.
    const int n = 8;
    const size_t bytes = 20000;
    std::vector<std::vector<unsigned char>> sbuf(n, std::vector<unsigned char>(bytes)), rbuf(n, std::vector<unsigned char>(bytes));
    std::vector<std::unique_ptr<weft_tp_xfer>> sx, rx;
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < bytes; k++)
            sbuf[(size_t)i][k] = (unsigned char)(k + (size_t)i * 17);
        sx.push_back(make_xfer(sbuf[(size_t)i].data(), bytes, 1, i));
        rx.push_back(make_xfer(rbuf[(size_t)i].data(), bytes, 0, i));
    }
    struct Chain {
        Rank *b;
        std::vector<std::unique_ptr<weft_tp_xfer>> *rx;
        int next = 1;
    } chain{p.b.get(), &rx};
    weft_tp_upcalls up = p.b->up;
    static Chain *active;
    active = &chain;
    up.rndv_done = [](void *arg, weft_tp_xfer *x, int err) {
        Rank *b = static_cast<Rank *>(arg);
        b->done.push_back({x, err});
        if (active->next < (int)active->rx->size()) {
            size_t keylen = 0;
            unsigned char key[WEFT_TP_KEY_MAX];
            tcp.rndv_expect(b->ctx, 0, (*active->rx)[(size_t)active->next].get(), nullptr, key, &keylen);
            tcp.ctrl_send(b->ctx, 0, "\4", 1, nullptr, 0);
            active->next++;
        }
    };
    p.b->up = up;

    size_t keylen = 0;
    unsigned char key[WEFT_TP_KEY_MAX];
    ASSERT_EQ(tcp.rndv_expect(p.b->ctx, 0, rx[0].get(), nullptr, key, &keylen), WEFT_SUCCESS);
    ASSERT_EQ(tcp.rndv_push(p.a->ctx, 1, sx[0].get(), key, keylen), WEFT_SUCCESS);
    size_t pushed = 1;
    ASSERT_TRUE(pump_until(p.ranks(), [&] {
        while (pushed < (size_t)n && p.a->frames.size() >= pushed) {
            EXPECT_EQ(tcp.rndv_push(p.a->ctx, 1, sx[pushed].get(), nullptr, 0), WEFT_SUCCESS);
            pushed++;
        }
        return p.b->done.size() == (size_t)n && p.a->done.size() == (size_t)n;
    })) << p.a->last_error() << " / " << p.b->last_error();
    for (int i = 0; i < n; i++)
        EXPECT_EQ(rbuf[(size_t)i], sbuf[(size_t)i]) << "transfer " << i;
    EXPECT_TRUE(p.a->failed.empty());
    EXPECT_TRUE(p.b->failed.empty());
}

TEST(TcpPair, PeerThatGoesAwayIsReportedByNameAndItsTransfersDropped)
{
    Pair p;
    exchange_cards(p.ranks());
    connect_up(p.ranks());

    // Rank 0 waits for a large message from rank 1 and is pushing one to it
    // (rank 1 expected it) when rank 1 disappears.
    std::vector<unsigned char> in(1 << 20), out(8 << 20, 1), b_in(8 << 20);
    auto rx = make_xfer(in.data(), in.size(), 1);
    auto sx = make_xfer(out.data(), out.size(), 1);
    auto brx = make_xfer(b_in.data(), b_in.size(), 0);
    size_t keylen = 0;
    unsigned char key[WEFT_TP_KEY_MAX];
    ASSERT_EQ(tcp.rndv_expect(p.a->ctx, 1, rx.get(), nullptr, key, &keylen), WEFT_SUCCESS);
    ASSERT_EQ(tcp.rndv_expect(p.b->ctx, 0, brx.get(), nullptr, key, &keylen), WEFT_SUCCESS);
    ASSERT_EQ(tcp.rndv_push(p.a->ctx, 1, sx.get(), key, keylen), WEFT_SUCCESS);
    tcp.progress(p.a->ctx);
    destroy(*p.b);

    ASSERT_TRUE(pump_until({p.a.get()}, [&] { return !p.a->failed.empty(); }, 10));
    pump({p.a.get()});
    ASSERT_EQ(p.a->failed.size(), 1u);   // reported once
    EXPECT_EQ(p.a->failed[0].peer, 1);
    EXPECT_EQ(p.a->failed[0].err, WEFT_ERR_TRANSPORT);
    EXPECT_NE(p.a->last_error().find("peer 1"), std::string::npos) << p.a->last_error();
    // Transfers of a failed peer are the pipe's to fail: no completion for
    // the receive (the push may have left for the kernel before the peer
    // went away, which completes it legitimately).
    for (const Done &d : p.a->done) {
        EXPECT_EQ(d.x, sx.get());
        EXPECT_EQ(d.err, WEFT_SUCCESS);
    }
    // The broken connection refuses new work at once instead of hanging.
    EXPECT_NE(tcp.ctrl_send(p.a->ctx, 1, "\1", 1, nullptr, 0), WEFT_SUCCESS);
    EXPECT_NE(tcp.rndv_push(p.a->ctx, 1, sx.get(), nullptr, 0), WEFT_SUCCESS);
    EXPECT_NE(tcp.rndv_expect(p.a->ctx, 1, rx.get(), nullptr, key, &keylen), WEFT_SUCCESS);
    EXPECT_EQ(tcp.busy(p.a->ctx), 0);
}

TEST(TcpPair, DifferentStripingSettingsFailTheFirstMessageWithAClearError)
{
    Env e0 = small_env(), e1 = small_env();
    e0["WEFT_TIMEOUT"] = e1["WEFT_TIMEOUT"] = "2";
    e1["WEFT_TCP_STREAMS"] = "2";
    std::unique_ptr<Rank> a = fake_rank(0, 2, e0);
    std::unique_ptr<Rank> b = fake_rank(1, 2, e1);
    Ranks both = {a.get(), b.get()};
    exchange_cards(both);
    std::vector<int> rcs = connect_all(both);
    EXPECT_EQ(rcs[0], WEFT_SUCCESS) << a->last_error();
    EXPECT_EQ(rcs[1], WEFT_SUCCESS) << b->last_error();
    // Rank 0's first message (the lower rank's goes out right after its
    // hello): rank 1 turns the hello down, and rank 0's pipe learns it
    // through peer_failed with an error naming the peer.
    int rc = tcp.ctrl_send(a->ctx, 1, "\1", 1, nullptr, 0);
    EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_EAGAIN) << rc << ": " << a->last_error();
    ASSERT_TRUE(pump_until(both, [&] { return !a->failed.empty(); }, 10)) << a->last_error();
    EXPECT_EQ(a->failed[0].peer, 1);
    EXPECT_NE(a->last_error().find("peer 1"), std::string::npos) << a->last_error();
    EXPECT_NE(a->last_error().find("WEFT_TCP_"), std::string::npos) << a->last_error();
    weft_tcp_listen_stats s1;
    weft_tcp_listen_stats_get(b->ctx, &s1);
    EXPECT_GE(s1.bad_hello, 1u);
    EXPECT_EQ(s1.peers, 0u);
    EXPECT_EQ(tcp.busy(a->ctx), 0) << "a failed peer's frames would keep destroy waiting";
    EXPECT_TRUE(b->frames.empty()) << "a frame was read from a connection whose hello was turned down";
    // Nothing usable afterwards: the failed pair refuses at once.
    EXPECT_NE(tcp.ctrl_send(a->ctx, 1, "\1", 1, nullptr, 0), WEFT_SUCCESS);
    EXPECT_NE(tcp.ctrl_send(a->ctx, 1, "\1", 1, nullptr, 0), WEFT_EAGAIN);
    // The other direction fails the same way on rank 1.
    rc = tcp.ctrl_send(b->ctx, 0, "\1", 1, nullptr, 0);
    EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_EAGAIN) << rc << ": " << b->last_error();
    ASSERT_TRUE(pump_until(both, [&] { return !b->failed.empty(); }, 10)) << b->last_error();
    EXPECT_NE(b->last_error().find("peer 0"), std::string::npos) << b->last_error();
    EXPECT_TRUE(a->frames.empty());
    free_rank(a);
    free_rank(b);
}

TEST(TcpPair, NoSocketIsOpenedBeforeAPairsFirstMessage)
{
    const int baseline = count_fds();
    std::vector<std::unique_ptr<Rank>> own;
    Ranks ranks;
    for (int r = 0; r < 3; r++) {
        own.push_back(fake_rank(r, 3, small_env()));
        ranks.push_back(own.back().get());
    }
    exchange_cards(ranks);
    for (int rc : connect_all(ranks))
        ASSERT_EQ(rc, WEFT_SUCCESS);
    pump(ranks);
    pump(ranks);
    // The three listeners, nothing else.
    EXPECT_EQ(count_fds(), baseline + 3);
    // 0 -> 1 talks; 2 never does: only pair (0, 1) opens 1 + 3 sockets a side.
    ASSERT_EQ(send_frame(ranks, *ranks[0], 1, "\1", "x"), WEFT_SUCCESS) << ranks[0]->last_error();
    ASSERT_TRUE(pump_until(ranks, [&] { return ranks[1]->frames.size() == 1; }));
    EXPECT_EQ(count_fds(), baseline + 3 + 2 * 4);
    for (int r = 0; r < 3; r++)
        EXPECT_TRUE(ranks[(size_t)r]->failed.empty()) << ranks[(size_t)r]->last_error();
    for (auto &r : own)
        free_rank(r);
    EXPECT_EQ(count_fds(), baseline);
}

// The pipe's retry, in miniature: frames wait in a queue while ctrl_send
// says WEFT_EAGAIN and go out in order once it takes them.
struct Outbox {
    std::vector<std::string> q;
    size_t sent = 0;
    void flush(Rank &from, int to)
    {
        while (sent < q.size()) {
            int rc = tcp.ctrl_send(from.ctx, to, q[sent].data(), 1, q[sent].data() + 1, q[sent].size() - 1);
            if (rc == WEFT_EAGAIN)
                return;
            ASSERT_EQ(rc, WEFT_SUCCESS) << from.last_error();
            sent++;
        }
    }
};

TEST(TcpPair, FirstMessagesBothWaysAtOnceKeepOneSetOfSocketsAndTheirOrder)
{
    const int baseline = count_fds();
    {
        Pair p;
        exchange_cards(p.ranks());
        for (int rc : connect_all(p.ranks()))
            ASSERT_EQ(rc, WEFT_SUCCESS);
        Rank *rk[2] = {p.a.get(), p.b.get()};
        Outbox box[2];
        for (int from = 0; from < 2; from++)
            for (int i = 0; i < 200; i++)
                box[from].q.push_back("\1" + std::to_string(from) + ":" + std::to_string(i));
        // Both ranks start their connection before either side progresses
        // (their frames go out on their own control sockets right after
        // the hello).
        for (int from = 0; from < 2; from++) {
            box[from].flush(*rk[from], 1 - from);
            EXPECT_EQ(count_fds(), baseline + 2 + 4 * (from + 1)) << "sockets not started by rank " << from;
        }
        ASSERT_TRUE(pump_until(p.ranks(), [&] {
            box[0].flush(*rk[0], 1);
            box[1].flush(*rk[1], 0);
            return rk[0]->frames.size() == 200 && rk[1]->frames.size() == 200;
        })) << rk[0]->last_error() << " / " << rk[1]->last_error();
        for (int to = 0; to < 2; to++)
            for (size_t i = 0; i < 200; i++)
                ASSERT_EQ(rk[to]->frames[i].bytes, box[1 - to].q[i]) << "frame " << i << " to rank " << to;
        // The lower rank's set won: rank 1 accepted it, rank 0 turned rank
        // 1's down, and once the losing data sockets are closed each side
        // holds its listener, one set of 1 + 3 sockets, and rank 1's own
        // control socket, which carries rank 1's frames (kept: they may be
        // on it before the verdict).
        weft_tcp_listen_stats s0, s1;
        weft_tcp_listen_stats_get(p.a->ctx, &s0);
        weft_tcp_listen_stats_get(p.b->ctx, &s1);
        EXPECT_EQ(s1.peers, 4u);
        EXPECT_EQ(s0.peers, 0u);
        EXPECT_EQ(s0.collided, 4u);
        EXPECT_EQ(weft_tcp_listen_rejected(&s0) + weft_tcp_listen_rejected(&s1), 0u);
        EXPECT_TRUE(pump_until(p.ranks(), [&] { return count_fds() == baseline + 2 + 2 * 5; }, 5))
            << count_fds() - baseline;
        EXPECT_TRUE(rk[0]->failed.empty());
        EXPECT_TRUE(rk[1]->failed.empty());
        // Rendezvous data flows on the surviving set both ways.
        std::vector<unsigned char> s(70000, 3), d(70000);
        auto rx = make_xfer(d.data(), d.size(), 0);
        auto sx = make_xfer(s.data(), s.size(), 1);
        size_t keylen = 0;
        unsigned char key[WEFT_TP_KEY_MAX];
        ASSERT_EQ(tcp.rndv_expect(p.b->ctx, 0, rx.get(), nullptr, key, &keylen), WEFT_SUCCESS);
        ASSERT_EQ(tcp.rndv_push(p.a->ctx, 1, sx.get(), key, keylen), WEFT_SUCCESS);
        ASSERT_TRUE(pump_until(p.ranks(), [&] { return p.a->done.size() == 1 && p.b->done.size() == 1; }));
        EXPECT_EQ(d, s);
    }
    EXPECT_EQ(count_fds(), baseline);
}

TEST(TcpPair, FirstMessageToAPeerThatIsGoneFailsNamingIt)
{
    Pair p;
    exchange_cards(p.ranks());
    for (int rc : connect_all(p.ranks()))
        ASSERT_EQ(rc, WEFT_SUCCESS);
    destroy(*p.b);   // its listener is closed: the connection is refused
    // However soon the refusal shows (on loopback often inside connect()
    // itself), the pipe learns it the same way: through peer_failed at the
    // next progress pass, never from inside its send.
    int rc = tcp.ctrl_send(p.a->ctx, 1, "\1", 1, nullptr, 0);
    EXPECT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_EAGAIN) << rc << ": " << p.a->last_error();
    EXPECT_TRUE(p.a->failed.empty());
    ASSERT_TRUE(pump_until({p.a.get()}, [&] { return !p.a->failed.empty(); }, 5)) << p.a->last_error();
    EXPECT_EQ(p.a->failed.size(), 1u);
    EXPECT_EQ(p.a->failed[0].peer, 1);
    EXPECT_EQ(p.a->failed[0].err, WEFT_ERR_TRANSPORT);
    EXPECT_NE(p.a->last_error().find("peer 1 (127.0.0.1:"), std::string::npos) << p.a->last_error();
    EXPECT_NE(p.a->last_error().find("refused"), std::string::npos) << p.a->last_error();
    EXPECT_NE(tcp.ctrl_send(p.a->ctx, 1, "\1", 1, nullptr, 0), WEFT_EAGAIN);
}

// 2 x WEFT_TIMEOUT: requests waiting on the pair fail after WEFT_TIMEOUT
// through the pipe's health checks first (tcp_conn.c: TCP_CONNECT_TIMEOUT_FACTOR).
TEST(TcpPair, PeerThatNeverAnswersFailsAfterTwiceWeftTimeout)
{
    Env env = small_env();
    env["WEFT_TIMEOUT"] = "0.5";
    Pair p(env);
    exchange_cards(p.ranks());
    for (int rc : connect_all(p.ranks()))
        ASSERT_EQ(rc, WEFT_SUCCESS);
    // Rank 1 never progresses (busy elsewhere): the kernel completes the
    // connects into its backlog, but no hello is ever answered.
    auto t0 = std::chrono::steady_clock::now();
    int rc = tcp.ctrl_send(p.a->ctx, 1, "\1", 1, nullptr, 0);
    ASSERT_TRUE(rc == WEFT_SUCCESS || rc == WEFT_EAGAIN) << rc << ": " << p.a->last_error();
    ASSERT_TRUE(pump_until({p.a.get()}, [&] { return !p.a->failed.empty(); }, 10)) << p.a->last_error();
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(took, 0.9);
    EXPECT_LT(took, 3.0);
    EXPECT_EQ(p.a->failed[0].peer, 1);
    EXPECT_EQ(p.a->failed[0].err, WEFT_ERR_TIMEOUT);
    EXPECT_NE(p.a->last_error().find("peer 1 (127.0.0.1:"), std::string::npos) << p.a->last_error();
    EXPECT_NE(p.a->last_error().find("no connection after 1 s (2 x WEFT_TIMEOUT)"), std::string::npos)
        << p.a->last_error();
    EXPECT_EQ(tcp.busy(p.a->ctx), 0) << "a failed peer's frames would keep destroy waiting";
}

TEST(TcpPair, OtherPeersKeepWorkingWhenOnePeerGoesAway)
{
    std::vector<std::unique_ptr<Rank>> own;
    Ranks ranks;
    for (int r = 0; r < 3; r++) {
        own.push_back(fake_rank(r, 3, small_env()));
        ranks.push_back(own.back().get());
    }
    exchange_cards(ranks);
    connect_up(ranks);
    destroy(*ranks[2]);   // rank 2 vanishes

    // Ranks 0 and 1 notice on their next progress passes...
    Ranks live = {ranks[0], ranks[1]};
    ASSERT_TRUE(pump_until(live, [&] { return !ranks[0]->failed.empty() && !ranks[1]->failed.empty(); }, 10));
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ(ranks[(size_t)r]->failed.size(), 1u);
        EXPECT_EQ(ranks[(size_t)r]->failed[0].peer, 2);
        EXPECT_EQ(ranks[(size_t)r]->failed[0].err, WEFT_ERR_TRANSPORT);
        EXPECT_NE(ranks[(size_t)r]->last_error().find("peer 2"), std::string::npos) << ranks[(size_t)r]->last_error();
    }

    // ...while 0 <-> 1 still carry control frames and striped messages.
    std::vector<unsigned char> s(50000, 9), d(50000);
    auto rx = make_xfer(d.data(), d.size(), 1, 5);
    auto sx = make_xfer(s.data(), s.size(), 0, 5);
    size_t keylen = 0;
    unsigned char key[WEFT_TP_KEY_MAX];
    ASSERT_EQ(tcp.rndv_expect(ranks[0]->ctx, 1, rx.get(), nullptr, key, &keylen), WEFT_SUCCESS);
    ASSERT_EQ(tcp.rndv_push(ranks[1]->ctx, 0, sx.get(), key, keylen), WEFT_SUCCESS);
    ASSERT_EQ(send_frame(live, *ranks[0], 1, "\1", std::string(100, 7)), WEFT_SUCCESS);
    ASSERT_TRUE(pump_until(live, [&] {
        return ranks[0]->done.size() == 1 && ranks[1]->done.size() == 1 && ranks[1]->frames.size() == 1;
    })) << ranks[0]->last_error();
    EXPECT_EQ(ranks[0]->done[0].x, rx.get());
    EXPECT_EQ(ranks[0]->done[0].err, WEFT_SUCCESS);
    EXPECT_EQ(ranks[1]->done[0].x, sx.get());
    EXPECT_EQ(ranks[1]->frames[0].bytes, "\1" + std::string(100, 7));
    EXPECT_EQ(d, s);
    for (auto &r : own)
        free_rank(r);
}
