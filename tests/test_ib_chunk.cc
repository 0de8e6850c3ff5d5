/*
 * How the ib transport cuts a rendezvous message into RDMA writes
 * (p2p/transport/ib/ib_chunk.h): the writes tile the message exactly, none is larger
 * than the chunk size or smaller than 32 bytes, and the number of QPs that
 * end with an immediate is what the receiver waits for.
 */
#include <gtest/gtest.h>

#include <cstdint>

extern "C" {
#include "ib_chunk.h"
}

namespace {

void check_layout(uint64_t bytes, uint64_t max)
{
    uint64_t n = ib_chunk_count(bytes, max), next = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t off = 0, len = 0;
        ib_chunk_at(bytes, max, k, &off, &len);
        ASSERT_EQ(off, next) << "bytes " << bytes << " max " << max << " chunk " << k;
        ASSERT_LE(len, max) << "bytes " << bytes << " max " << max << " chunk " << k;
        ASSERT_GE(len, (uint64_t)IB_CHUNK_MIN) << "bytes " << bytes << " max " << max << " chunk " << k;
        next = off + len;
    }
    ASSERT_EQ(next, bytes) << "bytes " << bytes << " max " << max;
}

TEST(IbChunk, WritesTileTheMessageWithinBounds)
{
    /* Every rendezvous size (>= 65 bytes) around chunk boundaries. */
    const uint64_t maxes[] = { 64, 100, 4096, 16384, 65536 };
    for (uint64_t max : maxes)
        for (uint64_t bytes = 65; bytes < 5 * max + 70; bytes += (bytes % max < 40 || bytes % max > max - 40) ? 1 : 7)
            check_layout(bytes, max);
    check_layout((uint64_t)9 << 30, (uint64_t)1 << 30);
    check_layout(((uint64_t)4 << 30) + 1, (uint64_t)1 << 20);
}

TEST(IbChunk, ShortTailSplitsTheLastTwoEvenly)
{
    uint64_t off, len;
    /* 2 full chunks + 10 bytes: the last full one and the tail become 2053 + 2053. */
    ASSERT_EQ(ib_chunk_count(2 * 4096 + 10, 4096), 3u);
    ib_chunk_at(2 * 4096 + 10, 4096, 1, &off, &len);
    EXPECT_EQ(off, 4096u);
    EXPECT_EQ(len, 2053u);
    ib_chunk_at(2 * 4096 + 10, 4096, 2, &off, &len);
    EXPECT_EQ(off, 4096u + 2053u);
    EXPECT_EQ(len, 2053u);
}

TEST(IbChunk, QpsUsedIsTheNumberOfImmediates)
{
    EXPECT_EQ(ib_chunk_qps_used(100, 4096, 4), 1u);
    EXPECT_EQ(ib_chunk_qps_used(3 * 4096, 4096, 4), 3u);
    EXPECT_EQ(ib_chunk_qps_used(9 * 4096, 4096, 4), 4u);
    EXPECT_EQ(ib_chunk_qps_used(9 * 4096, 4096, 1), 1u);
    /* The sender marks chunk k as last on its QP when k + nqp >= n: exactly
     * ib_chunk_qps_used of them. */
    for (unsigned nqp = 1; nqp <= 16; nqp++)
        for (uint64_t n = 1; n < 40; n++) {
            unsigned imm = 0;
            for (uint64_t k = 0; k < n; k++)
                imm += k + nqp >= n;
            EXPECT_EQ(imm, ib_chunk_qps_used(n * 4096, 4096, nqp)) << "n " << n << " nqp " << nqp;
        }
}

}  // namespace
