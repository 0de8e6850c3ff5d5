// Request ids on the wire (p2p/request.h): a CTS or FIN names a request by
// pool index + generation, and an id that names no live request of the
// pipe -- never handed out, freed and reused (stale generation), or a
// request of another pipe -- breaks that pipe with a protocol error naming
// the peer, never a dereference. One process, no MPI: a p2p context whose
// pipes to ranks 1 and 2 ride a fake carrier that records frames. The same
// fixture checks vectored messages (weft_p2p_isendv/irecvv) at the wire:
// their arguments, the RTS that announces the pieces, a carrier that cannot
// move them, an eager message scattered into a vectored receive.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "weft.h"   // mpi.h must not sit inside extern "C"

// The internal headers are C11; C++ spells its static assertion differently.
#define _Static_assert static_assert
extern "C" {
#include "log.h"
#include "context.h"
#include "p2p.h"
#include "pipe.h"
#include "wire.h"
}
#undef _Static_assert

namespace {

std::vector<std::vector<unsigned char>> g_frames;

int fake_ctrl_send(void *, int, const void *hdr, size_t hdr_len, const void *payload, size_t len)
{
    std::vector<unsigned char> f(static_cast<const unsigned char *>(hdr),
                                 static_cast<const unsigned char *>(hdr) + hdr_len);
    if (len)
        f.insert(f.end(), static_cast<const unsigned char *>(payload),
                 static_cast<const unsigned char *>(payload) + len);
    g_frames.push_back(f);
    return WEFT_SUCCESS;
}

void fake_abort(void *, int) {}

class PipeIds : public ::testing::Test {
protected:
    weft_core core;
    weft_p2p *p2p = nullptr;
    weft_transport fake;

    void SetUp() override
    {
        g_frames.clear();
        memset(&core, 0, sizeof(core));
        weft_core_init(&core, 0, 3);
        char err[256];
        ASSERT_EQ(weft_config_load(&core.cfg, nullptr, nullptr, err, sizeof(err)), WEFT_SUCCESS) << err;
        core.cfg.timeout_s = 5;
        ASSERT_EQ(weft_p2p_create(&core, &p2p), WEFT_SUCCESS);
        memset(&fake, 0, sizeof(fake));
        fake.name = "fake";
        fake.ctrl = 1;
        fake.scope = WEFT_TP_SCOPE_ANY;
        fake.ctrl_send = fake_ctrl_send;
        fake.abort_peer = fake_abort;
        for (int peer = 1; peer < 3; peer++) {
            p2p->pipes[peer].carrier.tp = &fake;
            p2p->pipes[peer].eager_limit = p2p->pipes[peer].eager_limit_internal = 16;
        }
    }
    void TearDown() override
    {
        weft_p2p_destroy(p2p);
        weft_core_fini(&core);
    }

    // A send of 100 bytes (above the eager limit 16: an RTS) to peer; its id.
    uint64_t start_rndv_send(int peer, std::vector<char> &buf, weft_request **req)
    {
        buf.assign(100, 'x');
        size_t before = g_frames.size();
        EXPECT_EQ(weft_p2p_isend(p2p, buf.data(), buf.size(), peer, 5, req, "test"), WEFT_SUCCESS);
        EXPECT_EQ(g_frames.size(), before + 1);
        weft_wire_hdr rts;
        memcpy(&rts, g_frames.back().data(), sizeof(rts));
        EXPECT_EQ(rts.type, WEFT_WIRE_RTS);
        return rts.sreq;
    }

    void deliver(int peer, uint8_t type, uint64_t sreq, uint64_t rreq, int status = WEFT_SUCCESS, uint32_t aux = 2)
    {
        weft_wire_hdr h;
        memset(&h, 0, sizeof(h));
        h.type = type;
        h.sreq = sreq;
        h.rreq = rreq;
        h.status = status;
        h.tag = 5;
        h.bytes = 100;
        h.aux = aux;
        weft_pipe_on_frame(&p2p->pipes[peer], &h, sizeof(h));
    }

    void expect_protocol_error(int peer)
    {
        EXPECT_EQ(p2p->pipes[peer].broken, WEFT_ERR_INTERNAL);
        std::string e = weft_error_line(&core);
        EXPECT_NE(e.find("peer " + std::to_string(peer)), std::string::npos) << e;
        EXPECT_NE(e.find("protocol error"), std::string::npos) << e;
    }
};

TEST_F(PipeIds, IdNeverHandedOut)
{
    deliver(1, WEFT_WIRE_CTS, (7ull << 32) | 3, 0);
    expect_protocol_error(1);
    EXPECT_EQ(p2p->pipes[2].broken, 0) << "another pipe broke";
}

TEST_F(PipeIds, ZeroAndHugeIndex)
{
    deliver(1, WEFT_WIRE_FIN, 0, 0);
    expect_protocol_error(1);
    deliver(2, WEFT_WIRE_FIN, (1ull << 32) | 0xfffffff0u, 0);
    expect_protocol_error(2);
}

TEST_F(PipeIds, StaleGenerationAfterReuse)
{
    std::vector<char> buf;
    weft_request *r = nullptr;
    uint64_t id = start_rndv_send(1, buf, &r);
    deliver(1, WEFT_WIRE_FIN, id, 0);   // the receiver pulled it: the send completes
    ASSERT_EQ(p2p->pipes[1].broken, 0) << weft_error_line(&core);
    weft_status_t st;
    ASSERT_EQ(weft_p2p_wait(r, &st), WEFT_SUCCESS);
    // The slot is reused by the next request; the old id must not find it.
    weft_request *r2 = nullptr;
    uint64_t id2 = start_rndv_send(1, buf, &r2);
    EXPECT_EQ((uint32_t)id2, (uint32_t)id) << "the pool reuses the freed slot first";
    EXPECT_NE(id2, id) << "a reused slot keeps its old id";
    deliver(1, WEFT_WIRE_CTS, id, 0);
    expect_protocol_error(1);
    EXPECT_TRUE(weft_p2p_done(r2)) << "breaking the pipe completes its requests";
    EXPECT_EQ(weft_p2p_wait(r2, &st), WEFT_ERR_INTERNAL);
}

TEST_F(PipeIds, RequestOfAnotherPipe)
{
    std::vector<char> buf;
    weft_request *r = nullptr;
    uint64_t id = start_rndv_send(2, buf, &r);
    deliver(1, WEFT_WIRE_FIN, id, 0);   // names peer 2's send on peer 1's pipe
    expect_protocol_error(1);
    EXPECT_EQ(p2p->pipes[2].broken, 0);
    EXPECT_FALSE(weft_p2p_done(r)) << "the other pipe's request was touched";
    deliver(2, WEFT_WIRE_FIN, id, 0);
    EXPECT_TRUE(weft_p2p_done(r));
    weft_status_t st;
    EXPECT_EQ(weft_p2p_wait(r, &st), WEFT_SUCCESS);
}

TEST_F(PipeIds, CtsNamingAnUnknownPath)
{
    std::vector<char> buf;
    weft_request *r = nullptr;
    uint64_t id = start_rndv_send(1, buf, &r);
    deliver(1, WEFT_WIRE_CTS, id, 1, WEFT_SUCCESS, 99);
    expect_protocol_error(1);
    weft_status_t st;
    EXPECT_EQ(weft_p2p_wait(r, &st), WEFT_ERR_INTERNAL);
}

} // namespace

// ---- vectored messages ----

class PipeVectors : public PipeIds {};

TEST_F(PipeVectors, SendAnnouncesItsPiecesInOneRts)
{
    fake.rndv_vectors = 1;
    std::vector<char> a(10, 'a'), b(90, 'b');
    weft_iov iov[3] = {{(uint64_t)(uintptr_t)a.data(), a.size()}, {0, 0}, {(uint64_t)(uintptr_t)b.data(), b.size()}};
    weft_request *r = nullptr;
    ASSERT_EQ(weft_p2p_isendv(p2p, iov, 3, 1, 5, &r, "test"), WEFT_SUCCESS) << weft_error_line(&core);
    ASSERT_EQ(g_frames.size(), 1u);
    weft_wire_hdr rts;
    memcpy(&rts, g_frames.back().data(), sizeof(rts));
    EXPECT_EQ(rts.type, WEFT_WIRE_RTS);
    EXPECT_TRUE(rts.flags & WEFT_WIRE_F_IOV);
    EXPECT_EQ(rts.aux, 3u);
    EXPECT_EQ(rts.addr, (uint64_t)(uintptr_t)iov) << "the receiver reads the sender's list where it lies";
    EXPECT_EQ(rts.bytes, 100u);
    deliver(1, WEFT_WIRE_FIN, rts.sreq, 0);   // pulled: the send completes
    weft_status_t st;
    EXPECT_EQ(weft_p2p_wait(r, &st), WEFT_SUCCESS) << weft_error_line(&core);
}

TEST_F(PipeVectors, RefusedWhereTheCarrierCannotMoveThem)
{
    std::vector<char> a(50, 'a');
    weft_iov iov[1] = {{(uint64_t)(uintptr_t)a.data(), a.size()}};
    weft_request *r = nullptr;
    EXPECT_EQ(weft_p2p_vectors(p2p, 1), 0);
    EXPECT_EQ(weft_p2p_isendv(p2p, iov, 1, 1, 5, &r, "test"), WEFT_ERR_UNSUPPORTED);
    std::string e = weft_error_line(&core);
    EXPECT_NE(e.find("peer 1"), std::string::npos) << e;
    EXPECT_NE(e.find("vectored"), std::string::npos) << e;
    EXPECT_EQ(weft_p2p_irecvv(p2p, iov, 1, 1, 5, &r, "test"), WEFT_ERR_UNSUPPORTED);
    EXPECT_TRUE(g_frames.empty());
    EXPECT_EQ(p2p->pipes[1].broken, 0);
    EXPECT_EQ(p2p->pipes[1].send_seq, 0u) << "a refused send took a sequence number";
}

TEST_F(PipeVectors, BadPiecesAreRefusedAndNothingGoes)
{
    fake.rndv_vectors = 1;
    EXPECT_EQ(weft_p2p_vectors(p2p, 1), 1);
    std::vector<char> a(8, 'a');
    std::vector<weft_iov> many(WEFT_IOV_MAX + 1, weft_iov{(uint64_t)(uintptr_t)a.data(), a.size()});
    weft_iov null_piece[2] = {{(uint64_t)(uintptr_t)a.data(), a.size()}, {0, 16}};
    weft_request *r = nullptr;
    EXPECT_EQ(weft_p2p_isendv(p2p, many.data(), 0, 1, 5, &r, "test"), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_p2p_isendv(p2p, nullptr, 1, 1, 5, &r, "test"), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(weft_p2p_isendv(p2p, many.data(), many.size(), 1, 5, &r, "test"), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_error_line(&core)).find("pieces"), std::string::npos) << weft_error_line(&core);
    EXPECT_EQ(weft_p2p_irecvv(p2p, null_piece, 2, 1, 5, &r, "test"), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(weft_error_line(&core)).find("piece 1"), std::string::npos) << weft_error_line(&core);
    EXPECT_TRUE(g_frames.empty());
    EXPECT_EQ(p2p->pipes[1].broken, 0);
}

TEST_F(PipeVectors, ReceiveScattersAnEagerMessage)
{
    fake.rndv_vectors = 1;
    char x[3], y[5];
    memset(x, 0, sizeof(x));
    memset(y, 0, sizeof(y));
    weft_iov iov[2] = {{(uint64_t)(uintptr_t)x, sizeof(x)}, {(uint64_t)(uintptr_t)y, sizeof(y)}};
    weft_request *r = nullptr;
    ASSERT_EQ(weft_p2p_irecvv(p2p, iov, 2, 1, 5, &r, "test"), WEFT_SUCCESS) << weft_error_line(&core);
    weft_wire_hdr h;
    memset(&h, 0, sizeof(h));
    h.type = WEFT_WIRE_EAGER;
    h.tag = 5;
    h.bytes = 8;
    std::vector<unsigned char> frame(sizeof(h) + 8);
    memcpy(frame.data(), &h, sizeof(h));
    memcpy(frame.data() + sizeof(h), "ABCDEFGH", 8);
    weft_pipe_on_frame(&p2p->pipes[1], frame.data(), frame.size());
    weft_status_t st;
    ASSERT_EQ(weft_p2p_wait(r, &st), WEFT_SUCCESS) << weft_error_line(&core);
    EXPECT_EQ(st.bytes, 8u);
    EXPECT_EQ(std::string(x, 3), "ABC");
    EXPECT_EQ(std::string(y, 5), "DEFGH");
}
