/*
 * weft_strerror: every code has its own non-empty text, and a code weft
 * does not know gets a text too (never NULL, never another code's text).
 */
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "weft.h"

namespace {

const int kAllCodes[] = {WEFT_SUCCESS,         WEFT_ERR_INVALID_ARG, WEFT_ERR_TRUNCATE,
                         WEFT_ERR_NO_MEMORY,   WEFT_ERR_UNSUPPORTED, WEFT_ERR_TRANSPORT,
                         WEFT_ERR_TIMEOUT,     WEFT_ERR_MPI,         WEFT_ERR_INTERNAL,
                         WEFT_ERR_MISMATCH,    WEFT_ERR_ABORTED,     WEFT_ERR_CLOSED,
                         WEFT_ERR_REVOKED};

TEST(Strerror, EveryCodeHasItsOwnText)
{
    std::set<std::string> seen;
    for (int code : kAllCodes) {
        const char *s = weft_strerror(code);
        ASSERT_NE(s, nullptr) << "code " << code;
        EXPECT_GT(std::string(s).size(), 3u) << "code " << code;
        EXPECT_TRUE(seen.insert(s).second) << "code " << code << " shares its text \"" << s << "\"";
    }
}

TEST(Strerror, TextsSayWhatTheCodeMeans)
{
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_TRUNCATE)).find("trunc"), std::string::npos);
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_TIMEOUT)).find("time"), std::string::npos);
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_MPI)).find("MPI"), std::string::npos);
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_INVALID_ARG)).find("argument"), std::string::npos);
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_NO_MEMORY)).find("memory"), std::string::npos);
    EXPECT_NE(std::string(weft_strerror(WEFT_ERR_REVOKED)).find("revoke"), std::string::npos);
}

TEST(Strerror, UnknownCodes)
{
    std::set<std::string> known;
    for (int code : kAllCodes)
        known.insert(weft_strerror(code));
    for (int code : {-1, -11, WEFT_ERR_REVOKED + 1, 12345, INT32_MIN}) {
        const char *s = weft_strerror(code);
        ASSERT_NE(s, nullptr) << "code " << code;
        EXPECT_FALSE(std::string(s).empty()) << "code " << code;
        EXPECT_EQ(known.count(s), 0u) << "unknown code " << code << " reads like a known one: " << s;
    }
}

} // namespace
