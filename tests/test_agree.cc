/*
 * Creation's agreements (src/comm/comm.c): every rank contributes its code
 * and rank as one number, the bootstrap returns the max, and each rank reads
 * back the worst code and the lowest rank that had it. What comes back has
 * crossed the bootstrap (the unique id's root relays it over TCP), so a
 * damaged value must be refused, never turned into an error code no one
 * knows or a rank the comm does not have (issue 28, item 7: a damaged frame
 * once made every rank return code 134217728 naming "rank 4294967295").
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "weft.h"

extern "C" {
#include "comm.h"
}

namespace {

TEST(Agree, TheWorstCodeWinsThenTheLowestRank)
{
    const int size = 6;
    std::vector<long long> v;
    int codes[size] = {WEFT_SUCCESS, WEFT_ERR_TIMEOUT, WEFT_ERR_TRANSPORT, WEFT_ERR_TIMEOUT, WEFT_SUCCESS,
                       WEFT_ERR_NO_MEMORY};
    for (int r = 0; r < size; r++)
        v.push_back(weft_agree_encode(codes[r], r));
    long long max = *std::max_element(v.begin(), v.end());
    int code = -1, rank = -2;
    ASSERT_EQ(0, weft_agree_decode(max, size, &code, &rank));
    EXPECT_EQ(WEFT_ERR_TIMEOUT, code) << "the highest code";
    EXPECT_EQ(1, rank) << "the lowest rank with it";

    EXPECT_EQ(0, weft_agree_encode(WEFT_SUCCESS, 3));
    ASSERT_EQ(0, weft_agree_decode(0, size, &code, &rank));
    EXPECT_EQ(WEFT_SUCCESS, code);
    EXPECT_EQ(-1, rank);
    for (int c = WEFT_ERR_INVALID_ARG; c <= WEFT_ERR_REVOKED; c++)
        for (int r : {0, size - 1}) {
            ASSERT_EQ(0, weft_agree_decode(weft_agree_encode(c, r), size, &code, &rank)) << c << " " << r;
            EXPECT_EQ(c, code);
            EXPECT_EQ(r, rank);
        }
}

TEST(Agree, ADamagedValueIsRefusedNotReadAsACodeOrARank)
{
    const int size = 4;
    int code = 77, rank = 77;
    /* The value of that report: code 134217728, rank 4294967295. */
    const long long seen = 134217728ll << 32;
    EXPECT_EQ(-1, weft_agree_decode(seen, size, &code, &rank));
    EXPECT_EQ(-1, weft_agree_decode(-5, size, &code, &rank)) << "negative";
    EXPECT_EQ(-1, weft_agree_decode(weft_agree_encode(WEFT_ERR_REVOKED + 1, 0), size, &code, &rank))
        << "a code past the last";
    EXPECT_EQ(-1, weft_agree_decode(weft_agree_encode(WEFT_ERR_TIMEOUT, size), size, &code, &rank))
        << "a rank the comm does not have";
    EXPECT_EQ(-1, weft_agree_decode(5, size, &code, &rank)) << "code 0 with a rank: success carries none";
    EXPECT_EQ(-1, weft_agree_decode(LLONG_MAX, size, &code, &rank));
    EXPECT_EQ(77, code) << "outputs set only on success";
    EXPECT_EQ(77, rank);
}

}  // namespace
