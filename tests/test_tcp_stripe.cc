// Striping math of the TCP transport (p2p/transport/tcp/tcp_stripe.h): which bytes of a
// message each data socket carries, in which order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

extern "C" {
#include "tcp_stripe.h"
}

namespace {

struct Piece { uint64_t msg_off, len; unsigned sock; uint64_t share_off; };

// Walks every socket's share from start to end with weft_stripe_locate and
// returns the pieces; checks each piece stays inside one chunk that belongs
// to the socket that carries it.
std::vector<Piece> walk(uint64_t n, uint64_t chunk, unsigned streams)
{
    std::vector<Piece> out;
    for (unsigned s = 0; s < streams; s++) {
        uint64_t share = weft_stripe_share(n, chunk, streams, s);
        uint64_t off = 0;
        while (off < share) {
            uint64_t mo = 0, len = 0;
            weft_stripe_locate(n, chunk, streams, s, off, &mo, &len);
            EXPECT_GT(len, 0u);
            EXPECT_LE(mo + len, n);
            EXPECT_EQ((mo / chunk) % streams, s) << "chunk on the wrong socket";
            EXPECT_EQ(mo / chunk, (mo + len - 1) / chunk) << "piece crosses a chunk boundary";
            out.push_back({mo, len, s, off});
            off += len;
        }
        EXPECT_EQ(off, share);
    }
    return out;
}

// The pieces of all sockets tile [0, n) exactly once.
void expect_tiles(std::vector<Piece> pieces, uint64_t n)
{
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece &a, const Piece &b) { return a.msg_off < b.msg_off; });
    uint64_t next = 0;
    for (const Piece &p : pieces) {
        ASSERT_EQ(p.msg_off, next) << "gap or overlap at message offset " << next;
        next += p.len;
    }
    EXPECT_EQ(next, n);
}

uint64_t total_share(uint64_t n, uint64_t chunk, unsigned streams)
{
    uint64_t sum = 0;
    for (unsigned s = 0; s < streams; s++)
        sum += weft_stripe_share(n, chunk, streams, s);
    return sum;
}

}  // namespace

TEST(TcpStripe, EmptyMessageHasNoChunksAndNoShares)
{
    EXPECT_EQ(weft_stripe_chunks(0, 4096), 0u);
    for (unsigned streams = 1; streams <= 8; streams++)
        for (unsigned s = 0; s < streams; s++)
            EXPECT_EQ(weft_stripe_share(0, 4096, streams, s), 0u);
}

TEST(TcpStripe, OneByteGoesOnSocketZeroOnly)
{
    for (unsigned streams = 1; streams <= 8; streams++) {
        EXPECT_EQ(weft_stripe_share(1, 4096, streams, 0), 1u);
        for (unsigned s = 1; s < streams; s++)
            EXPECT_EQ(weft_stripe_share(1, 4096, streams, s), 0u) << "streams " << streams;
        uint64_t mo = 99, len = 99;
        weft_stripe_locate(1, 4096, streams, 0, 0, &mo, &len);
        EXPECT_EQ(mo, 0u);
        EXPECT_EQ(len, 1u);
    }
}

TEST(TcpStripe, SizesAroundOneChunk)
{
    const uint64_t chunk = 64 << 10;
    for (unsigned streams = 1; streams <= 8; streams++) {
        // chunk - 1 and chunk: one chunk, all on socket 0.
        EXPECT_EQ(weft_stripe_share(chunk - 1, chunk, streams, 0), chunk - 1);
        EXPECT_EQ(weft_stripe_share(chunk, chunk, streams, 0), chunk);
        // chunk + 1: the second chunk (1 byte) goes to socket 1, or back to
        // socket 0 when there is only one.
        if (streams == 1) {
            EXPECT_EQ(weft_stripe_share(chunk + 1, chunk, 1, 0), chunk + 1);
        } else {
            EXPECT_EQ(weft_stripe_share(chunk + 1, chunk, streams, 0), chunk);
            EXPECT_EQ(weft_stripe_share(chunk + 1, chunk, streams, 1), 1u);
        }
        for (uint64_t n : {chunk - 1, chunk, chunk + 1}) {
            EXPECT_EQ(total_share(n, chunk, streams), n);
            expect_tiles(walk(n, chunk, streams), n);
        }
    }
}

TEST(TcpStripe, ManyChunksRoundRobinAndTile)
{
    const uint64_t chunk = 4096;
    for (unsigned streams = 1; streams <= 8; streams++) {
        for (uint64_t n : {uint64_t(7) * chunk + 3, uint64_t(8) * chunk, uint64_t(100) * chunk - 1,
                           uint64_t(1000003)}) {
            EXPECT_EQ(total_share(n, chunk, streams), n) << "n " << n << " streams " << streams;
            std::vector<Piece> pieces = walk(n, chunk, streams);
            // Within one socket the pieces come in increasing message order,
            // so sender and receiver walk the same sequence.
            for (size_t i = 1; i < pieces.size(); i++)
                if (pieces[i].sock == pieces[i - 1].sock)
                    EXPECT_GT(pieces[i].msg_off, pieces[i - 1].msg_off);
            expect_tiles(pieces, n);
        }
    }
}

TEST(TcpStripe, SharesDifferByAtMostOneChunk)
{
    // Balanced load: no socket carries more than one chunk more than another.
    const uint64_t chunk = 512 << 10;
    for (unsigned streams = 1; streams <= 8; streams++) {
        uint64_t n = (uint64_t(64) << 20) + 12345;
        uint64_t lo = UINT64_MAX, hi = 0;
        for (unsigned s = 0; s < streams; s++) {
            uint64_t sh = weft_stripe_share(n, chunk, streams, s);
            lo = std::min(lo, sh);
            hi = std::max(hi, sh);
        }
        EXPECT_LE(hi - lo, chunk);
    }
}

TEST(TcpStripe, MessagesAbove4GiB)
{
    const uint64_t n = (uint64_t(5) << 30) + 123;   // 5 GiB + 123 bytes
    for (uint64_t chunk : {uint64_t(512) << 10, uint64_t(1) << 30}) {
        for (unsigned streams = 1; streams <= 8; streams++) {
            EXPECT_EQ(total_share(n, chunk, streams), n);
            expect_tiles(walk(n, chunk, streams), n);
            // The short last chunk belongs to socket (nchunks - 1) % streams
            // and its last byte is the message's last byte.
            uint64_t last = weft_stripe_chunks(n, chunk) - 1;
            unsigned s = unsigned(last % streams);
            uint64_t share = weft_stripe_share(n, chunk, streams, s);
            uint64_t mo = 0, len = 0;
            weft_stripe_locate(n, chunk, streams, s, share - 1, &mo, &len);
            EXPECT_EQ(mo, n - 1);
            EXPECT_EQ(len, 1u);
        }
    }
}
