// Vectored messages as transports see them (p2p/transport/tp_iov.h): the
// struct iovec list of any byte range of a list of pieces, and copies into
// and out of a transfer's data at any offset, across piece boundaries,
// with empty pieces among them -- what the shm ring push (pieces of the
// message at offsets) and the CMA pull (a partial process_vm_readv resumed
// where it stopped) rely on. Checked against a plain buffer holding the
// same bytes end to end.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#define _Static_assert static_assert
extern "C" {
#include "tp_iov.h"
}
#undef _Static_assert

namespace {

// Pieces of the given lengths cut from one backing store (with gaps between
// them, so a copy that ran past a piece's end would show).
struct Pieces {
    std::vector<unsigned char> store;
    std::vector<weft_iov> iov;
    explicit Pieces(const std::vector<size_t> &lens)
    {
        size_t total = 0;
        for (size_t l : lens)
            total += l + 3;
        store.assign(total, 0xEE);
        size_t at = 0;
        for (size_t l : lens) {
            iov.push_back({(uint64_t)(uintptr_t)(store.data() + at), l});
            at += l + 3;
        }
    }
    // The bytes end to end.
    std::vector<unsigned char> flat() const
    {
        std::vector<unsigned char> v;
        for (auto &p : iov)
            v.insert(v.end(), (const unsigned char *)(uintptr_t)p.base,
                     (const unsigned char *)(uintptr_t)p.base + p.len);
        return v;
    }
    size_t gaps_touched() const
    {
        size_t n = 0;
        for (size_t i = 0; i < iov.size(); i++) {
            const unsigned char *end = (const unsigned char *)(uintptr_t)iov[i].base + iov[i].len;
            for (int g = 0; g < 3; g++)
                n += end[g] != 0xEE;
        }
        return n;
    }
};

const std::vector<std::vector<size_t>> kShapes = {
    {1}, {7, 0, 9}, {0, 0, 5}, {4096, 1, 4097, 0, 13}, {100, 100, 100, 100, 100, 100, 100, 100},
};

TEST(TpIov, CopyInAndOutAtEveryOffsetAndLength)
{
    for (const auto &shape : kShapes) {
        Pieces p(shape);
        size_t total = weft_tp_iov_bytes(p.iov.data(), p.iov.size());
        weft_tp_xfer x;
        memset(&x, 0, sizeof(x));
        x.iov = p.iov.data();
        x.niov = (uint32_t)p.iov.size();
        x.bytes = total;
        size_t step = total > 600 ? 97 : 1;
        for (size_t off = 0; off <= total; off += step)
            for (size_t len = 0; off + len <= total; len += step) {
                std::vector<unsigned char> src(len + 1);   // + 1: data() is never NULL
                for (size_t i = 0; i < len; i++)
                    src[i] = (unsigned char)(off * 31 + i * 7 + 1);
                std::vector<unsigned char> before = p.flat();
                weft_tp_copy_in(&x, off, src.data(), len);
                std::vector<unsigned char> after = p.flat();
                ASSERT_EQ(after.size(), total);
                for (size_t i = 0; i < total; i++) {
                    unsigned char want = i >= off && i < off + len ? src[i - off] : before[i];
                    ASSERT_EQ(after[i], want) << "copy_in off " << off << " len " << len << " byte " << i;
                }
                std::vector<unsigned char> back(len + 1, 0x55);
                weft_tp_copy_out(&x, off, back.data(), len);
                ASSERT_EQ(memcmp(back.data(), src.data(), len), 0) << "copy_out off " << off << " len " << len;
                ASSERT_EQ(back[len], 0x55) << "copy_out wrote past len";
            }
        EXPECT_EQ(p.gaps_touched(), 0u) << "a copy ran past a piece";
    }
}

TEST(TpIov, RangeCoversExactlyTheBytesAsked)
{
    for (const auto &shape : kShapes) {
        Pieces p(shape);
        for (size_t i = 0; i < p.store.size(); i++)
            p.store[i] = (unsigned char)(i * 13 + 5);
        std::vector<unsigned char> flat = p.flat();
        size_t total = flat.size();
        for (size_t off = 0; off <= total; off += total > 600 ? 89 : 1)
            for (size_t len = 0; off + len <= total; len += total > 600 ? 89 : 1) {
                struct iovec out[WEFT_IOV_MAX];
                int n = weft_tp_iov_range(p.iov.data(), p.iov.size(), off, len, out, WEFT_IOV_MAX);
                std::vector<unsigned char> got;
                for (int k = 0; k < n; k++) {
                    ASSERT_GT(out[k].iov_len, 0u) << "an empty entry";
                    got.insert(got.end(), (unsigned char *)out[k].iov_base,
                               (unsigned char *)out[k].iov_base + out[k].iov_len);
                }
                ASSERT_EQ(got.size(), len) << "off " << off;
                ASSERT_TRUE(std::equal(got.begin(), got.end(), flat.begin() + (long)off)) << "off " << off << " len " << len;
            }
    }
    // A short list: max entries, then it stops (the caller asks again from where it stopped).
    Pieces p({10, 10, 10});
    struct iovec out[2];
    EXPECT_EQ(weft_tp_iov_range(p.iov.data(), 3, 5, 25, out, 2), 2);
    EXPECT_EQ(out[0].iov_len + out[1].iov_len, 15u);
}

TEST(TpIov, OneBufferTransfersCopyPlainly)
{
    std::vector<unsigned char> buf(64, 0);
    weft_tp_xfer x;
    memset(&x, 0, sizeof(x));
    x.buf = buf.data();
    x.bytes = buf.size();
    const char msg[] = "abcdef";
    weft_tp_copy_in(&x, 10, msg, 6);
    EXPECT_EQ(memcmp(buf.data() + 10, msg, 6), 0);
    char back[6];
    weft_tp_copy_out(&x, 10, back, 6);
    EXPECT_EQ(memcmp(back, msg, 6), 0);
}

}  // namespace
