/*
 * A comm's last error kept in parts (code, rank, peer, op, text) and
 * formatted once: "rank R: [op: ]text (why)" is the same line the library
 * always printed, the reason without rank and code is read from the parts
 * (no layer takes a line apart), and an error passed on keeps its parts.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "weft.h"

extern "C" {
#include "core.h"
#include "log.h"
}

namespace {

struct Core {
    struct weft_core core;
    Core(int rank)
    {
        std::memset(&core, 0, sizeof(core));
        weft_core_init(&core, rank, 4);
    }
    ~Core() { weft_core_fini(&core); }
};

TEST(ErrorRecord, NoneYet)
{
    Core c(2);
    struct weft_error e;
    weft_error_get(&c.core, &e);
    EXPECT_EQ(WEFT_SUCCESS, e.code);
    EXPECT_STREQ("", weft_error_line(&c.core));
}

TEST(ErrorRecord, KeptInPartsFormattedOnce)
{
    Core c(2);
    EXPECT_EQ(WEFT_ERR_TIMEOUT, weft_set_error(&c.core, WEFT_ERR_TIMEOUT, "weft_wait: receive from peer %d", 3));
    struct weft_error e;
    weft_error_get(&c.core, &e);
    EXPECT_EQ(WEFT_ERR_TIMEOUT, e.code);
    EXPECT_EQ(2, e.rank);
    EXPECT_EQ(-1, e.peer);
    EXPECT_STREQ("", e.op);
    EXPECT_STREQ("weft_wait: receive from peer 3", e.text);
    EXPECT_EQ("rank 2: weft_wait: receive from peer 3 (" + std::string(weft_strerror(WEFT_ERR_TIMEOUT)) + ")",
              weft_error_line(&c.core));

    EXPECT_EQ(WEFT_ERR_TRANSPORT,
              weft_set_error_at(&c.core, WEFT_ERR_TRANSPORT, "weft_comm_split", 1, "peer %d went away", 1));
    weft_error_get(&c.core, &e);
    EXPECT_EQ(1, e.peer);
    EXPECT_STREQ("weft_comm_split", e.op);
    EXPECT_STREQ("peer 1 went away", e.text) << "the text does not repeat the op";
    EXPECT_EQ("rank 2: weft_comm_split: peer 1 went away (" + std::string(weft_strerror(WEFT_ERR_TRANSPORT)) + ")",
              weft_error_line(&c.core));
    char reason[256];
    weft_error_reason(&e, reason, sizeof(reason));
    EXPECT_STREQ("weft_comm_split: peer 1 went away", reason);
    char line[256];
    weft_error_format(&e, 0, line, sizeof(line));
    EXPECT_EQ("weft_comm_split: peer 1 went away (" + std::string(weft_strerror(WEFT_ERR_TRANSPORT)) + ")", line);
}

TEST(ErrorRecord, PassedOnWithItsParts)
{
    Core from(1), to(3);
    weft_set_error_at(&from.core, WEFT_ERR_MISMATCH, "weft_allreduce", 0, "sizes differ");
    struct weft_error e;
    weft_error_get(&from.core, &e);
    weft_error_put(&to.core, &e);
    EXPECT_STREQ(weft_error_line(&from.core), std::string(weft_error_line(&to.core)).c_str())
        << "the rank that decided it is kept";
}

TEST(ErrorRecord, NoCommGoesToTheThread)
{
    weft_set_error_at(nullptr, WEFT_ERR_INVALID_ARG, "weft_comm_init", -1, "id is NULL");
    EXPECT_EQ("weft_comm_init: id is NULL (" + std::string(weft_strerror(WEFT_ERR_INVALID_ARG)) + ")",
              weft_last_error());
    struct weft_error e;
    weft_error_thread_get(&e);
    EXPECT_STREQ("weft_comm_init", e.op);
    EXPECT_EQ(-1, e.rank);
}

}  // namespace
