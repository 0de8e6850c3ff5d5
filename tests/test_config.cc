/*
 * weft_config_load through a lookup function (no real environment; the
 * tests of the environment itself run in a child process started with the
 * environment they need, tests/child_env.h): the
 * defaults, every variable parsed, malformed values refused with a message
 * "WEFT_X=value: why (expected ...)" (strictness: spaces, '+', hex, empty,
 * 0 where it means nothing), size suffixes, WEFT_TRANSPORTS, WEFT_DEBUG and
 * the default log level, WEFT_EAGER_WINDOW, and the settings that must agree
 * between ranks.
 */
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "config.h"
}
#include "weft.h"
#include "child_env.h"

namespace {

using Env = std::map<std::string, std::string>;

/* The child side of the tests of the environment itself (DefaultLookupIs-
 * Getenv, LogLevelFromEnvironment): this binary started again with
 * WEFT_TEST_CONFIG_PROBE set (and the environment the test gives it)
 * prints the answer on stdout and exits before any test runs. */
[[maybe_unused]] const int config_probe = [] {
    const char *probe = std::getenv("WEFT_TEST_CONFIG_PROBE");
    if (probe == nullptr)
        return 0;
    if (std::strcmp(probe, "tcp_streams") == 0) {
        struct weft_config cfg;
        char err[256] = "";
        if (weft_config_load(&cfg, nullptr, nullptr, err, sizeof(err)) != WEFT_SUCCESS)
            std::printf("refused: %s\n", err);
        else
            std::printf("%d\n", cfg.tcp_streams);
    } else if (std::strcmp(probe, "log_level") == 0) {
        std::printf("%d\n", weft_config_log_level_env());
    } else {
        std::printf("unknown probe %s\n", probe);
    }
    std::fflush(stdout);
    _exit(0);
}();

/* What the probe printed when run with the environment's set (drop: also
 * left out); "" with a failure when it did not run. */
std::string probe(const char *what, const weft_childenv::Vars &set, const std::vector<std::string> &drop = {})
{
    weft_childenv::Vars vars = set;
    vars.push_back({"WEFT_TEST_CONFIG_PROBE", what});
    std::string out, why;
    int rc = weft_childenv::run_self({}, weft_childenv::environment_with(vars, drop), &out, &why);
    EXPECT_EQ(rc, 0) << "the probe " << what << " (" << why << "), stdout: " << out;
    while (!out.empty() && out.back() == '\n')
        out.pop_back();
    return rc == 0 ? out : "";
}

const char *lookup_map(const char *name, void *ctx)
{
    const Env *env = static_cast<const Env *>(ctx);
    auto it = env->find(name);
    return it == env->end() ? nullptr : it->second.c_str();
}

/* Loads env; expects success. */
struct weft_config load_ok(const Env &env)
{
    struct weft_config cfg;
    char err[256] = "";
    int rc = weft_config_load(&cfg, lookup_map, const_cast<Env *>(&env), err, sizeof(err));
    EXPECT_EQ(rc, WEFT_SUCCESS) << err;
    return cfg;
}

/* Loads {name=value}; expects refusal with a message of the form
 * "NAME=value: why (expected ...)". Returns the message. */
std::string expect_rejected(const std::string &name, const std::string &value)
{
    Env env = {{name, value}};
    struct weft_config cfg;
    char err[512] = "";
    int rc = weft_config_load(&cfg, lookup_map, &env, err, sizeof(err));
    EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << name << "=\"" << value << "\" accepted";
    const std::string msg = err;
    const bool quoted = value.empty() || value.find_first_of(" \t\r\n\v\f") != std::string::npos;
    const std::string head = name + "=" + (quoted ? "\"" + value + "\"" : value) + ": ";
    EXPECT_EQ(msg.rfind(head, 0), 0u)
        << name << "=\"" << value << "\": message \"" << msg << "\" does not start with " << head;
    EXPECT_NE(msg.find(" (expected "), std::string::npos)
        << name << "=\"" << value << "\": message \"" << msg << "\" does not say what was expected";
    EXPECT_TRUE(!msg.empty() && msg.back() == ')') << msg;
    return msg;
}

/* Every numeric variable (integers, sizes, seconds) with a value it accepts. */
const std::vector<std::pair<std::string, std::string>> &numeric_variables()
{
    static const std::vector<std::pair<std::string, std::string>> v = {
        {"WEFT_TIMEOUT", "5"},          {"WEFT_VIRTUAL_NODES", "2"},       {"WEFT_SHM_CMA", "1"},
        {"WEFT_SHM_STREAM", "1"},
        {"WEFT_SHM_EAGER", "1024"},     {"WEFT_SHM_COLL_EAGER", "1024"},   {"WEFT_SHM_RING_KB", "1024"},
        {"WEFT_SHM_CHUNK_KB", "64"},    {"WEFT_SHM_CMA_MIN_KB", "64"},     {"WEFT_TCP_STREAMS", "2"},
        {"WEFT_TCP_EAGER", "1024"},     {"WEFT_TCP_CHUNK_KB", "64"},       {"WEFT_SELF_EAGER", "1024"},
        {"WEFT_EAGER_WINDOW", "1048576"}, {"WEFT_SPIN_US", "10"},          {"WEFT_IB_GID_INDEX", "3"},
        {"WEFT_IB_QPS_PER_PEER", "2"},  {"WEFT_IB_TIMEOUT", "14"},         {"WEFT_IB_RETRY_CNT", "3"},
        {"WEFT_IB_CHUNK", "65536"},     {"WEFT_IB_EAGER", "4096"},         {"WEFT_IB_RECV_DEPTH", "16"},
        {"WEFT_IB_SQ_DEPTH", "16"},     {"WEFT_IB_REG_CACHE_MB", "64"},    {"WEFT_IB_GDR", "1"},
        {"WEFT_CUDA_STAGE_CHUNK", "65536"}, {"WEFT_CUDA_STAGE_SLOTS", "2"}, {"WEFT_CUDA_IPC_CACHE", "16"},
        {"WEFT_ALLGATHER_CHUNK_KB", "64"}, {"WEFT_PROGRESS_THREAD", "1"},  {"WEFT_PIPE_INLINE", "4096"},
        {"WEFT_NODE_COLL_STREAM_KB", "64"},
    };
    return v;
}

TEST(Config, Defaults)
{
    struct weft_config cfg = load_ok({});
    EXPECT_EQ(cfg.timeout_s, 300.0);
    EXPECT_EQ(cfg.log_level, WEFT_LOG_WARN) << "a failed create must say why without WEFT_DEBUG";
    EXPECT_EQ(cfg.eager_window, 4u << 20);
    EXPECT_STREQ(cfg.allgather_algo, "auto");
    EXPECT_EQ(cfg.allgather_chunk, 1u << 20);
    EXPECT_STREQ(cfg.transports, "") << "every transport allowed";
    EXPECT_STREQ(cfg.ibverbs_lib, "libibverbs.so.1");
    EXPECT_STREQ(cfg.ib_hca, "");
    EXPECT_EQ(cfg.ib_gid_index, -1);
    EXPECT_EQ(cfg.ib_qps_per_peer, 1);
    EXPECT_GE(cfg.ib_eager_limit, 64u) << "a rendezvous message is never below 64 bytes (no tiny RDMA writes)";
    EXPECT_STREQ(cfg.cuda_lib, "libcudart.so");
    EXPECT_EQ(cfg.virtual_nodes, 0);
    EXPECT_EQ(cfg.shm_cma, 1);
    EXPECT_EQ(cfg.shm_stream, 1);
    EXPECT_EQ(cfg.tcp_streams, 4);
    EXPECT_STREQ(cfg.tcp_if, "");
    EXPECT_GT(cfg.shm_eager_limit, 0u);
    EXPECT_GT(cfg.tcp_eager_limit, 0u);
    EXPECT_GT(cfg.self_eager_limit, 0u);
    EXPECT_GT(cfg.shm_chunk, 0u);
    EXPECT_GT(cfg.tcp_chunk, 0u);
    /* An eager message fits a ring record, and a chunk fits the ring. */
    EXPECT_LT(cfg.shm_eager_limit, cfg.shm_ring_bytes / 4);
    EXPECT_LE(cfg.shm_chunk, cfg.shm_ring_bytes / 2);
    EXPECT_GE(cfg.spin_us, 0);
    EXPECT_EQ(cfg.progress_thread, 0) << "message-pipe callbacks run in weft_progress unless asked";
    EXPECT_EQ(cfg.pipe_inline, 4u << 10);
    EXPECT_EQ(cfg.node_coll_stream, 32u << 10) << "node-local copies from 32 KiB streamed";
}

/* In a process whose environment has WEFT_TCP_STREAMS=3 (the probe). */
TEST(Config, DefaultLookupIsGetenv)
{
    const std::string got = probe("tcp_streams", {{"WEFT_TCP_STREAMS", "3"}});
    ASSERT_EQ(got.rfind("refused", 0), std::string::npos) << got;
    EXPECT_EQ(got, "3");
}

TEST(Config, EveryVariableParsed)
{
    struct weft_config cfg = load_ok({
        {"WEFT_TIMEOUT", "2.5"},
        {"WEFT_DEBUG", "info"},
        {"WEFT_TRANSPORTS", "tcp"},
        {"WEFT_VIRTUAL_NODES", "2"},
        {"WEFT_SHM_CMA", "0"},
        {"WEFT_SHM_RING_KB", "4096"},
        {"WEFT_SHM_EAGER", "8k"},
        {"WEFT_SHM_CHUNK_KB", "128"},
        {"WEFT_SHM_CMA_MIN_KB", "1024"},
        {"WEFT_TCP_STREAMS", "7"},
        {"WEFT_TCP_IF", "lo"},
        {"WEFT_TCP_EAGER", "12345"},
        {"WEFT_TCP_CHUNK_KB", "64"},
        {"WEFT_SELF_EAGER", "1m"},
        {"WEFT_SPIN_US", "0"},
        {"WEFT_EAGER_WINDOW", "8m"},
        {"WEFT_IBVERBS_LIB", "/opt/my libs/libibverbs.so.1"},
        {"WEFT_IB_HCA", "mlx5_0:1,mlx5_1,roce-dev.2:2"},
        {"WEFT_IB_GID_INDEX", "3"},
        {"WEFT_IB_QPS_PER_PEER", "2"},
        {"WEFT_IB_TIMEOUT", "14"},
        {"WEFT_IB_RETRY_CNT", "0"},
        {"WEFT_IB_CHUNK", "64k"},
        {"WEFT_IB_EAGER", "64"},
        {"WEFT_IB_RECV_DEPTH", "2"},
        {"WEFT_IB_SQ_DEPTH", "16384"},
        {"WEFT_IB_REG_CACHE_MB", "0"},
        {"WEFT_IB_GDR", "auto"},
        {"WEFT_TOPO_XML", "/tmp/topo.xml"},
        {"WEFT_CUDA_LIB", "libcudart.so.12"},
        {"WEFT_CUDA_STAGE_CHUNK", "256k"},
        {"WEFT_CUDA_STAGE_SLOTS", "8"},
        {"WEFT_CUDA_IPC_CACHE", "1"},
        {"WEFT_ALLGATHER_ALGO", "Bruck"},
        {"WEFT_ALLGATHER_CHUNK_KB", "256"},
        {"WEFT_PROGRESS_THREAD", "1"},
        {"WEFT_PIPE_INLINE", "4k"},
    });
    EXPECT_EQ(cfg.timeout_s, 2.5);
    EXPECT_EQ(cfg.log_level, WEFT_LOG_INFO);
    EXPECT_STREQ(cfg.transports, "tcp");
    EXPECT_EQ(cfg.virtual_nodes, 2);
    EXPECT_EQ(cfg.shm_cma, 0);
    EXPECT_EQ(cfg.shm_ring_bytes, 4096u * 1024);
    EXPECT_EQ(cfg.shm_eager_limit, 8192u);
    EXPECT_EQ(cfg.shm_chunk, 128u * 1024);
    EXPECT_EQ(cfg.shm_cma_min, 1024u * 1024);
    EXPECT_EQ(cfg.tcp_streams, 7);
    EXPECT_STREQ(cfg.tcp_if, "lo");
    EXPECT_EQ(cfg.tcp_eager_limit, 12345u);
    EXPECT_EQ(cfg.tcp_chunk, 64u * 1024);
    EXPECT_EQ(cfg.self_eager_limit, 1u << 20);
    EXPECT_EQ(cfg.spin_us, 0);
    EXPECT_EQ(cfg.eager_window, 8u << 20);
    EXPECT_STREQ(cfg.ibverbs_lib, "/opt/my libs/libibverbs.so.1");
    EXPECT_STREQ(cfg.ib_hca, "mlx5_0:1,mlx5_1,roce-dev.2:2");
    EXPECT_EQ(cfg.ib_gid_index, 3);
    EXPECT_EQ(cfg.ib_qps_per_peer, 2);
    EXPECT_EQ(cfg.ib_timeout, 14);
    EXPECT_EQ(cfg.ib_retry_cnt, 0);
    EXPECT_EQ(cfg.ib_chunk, 64u << 10);
    EXPECT_EQ(cfg.ib_eager_limit, 64u);
    EXPECT_EQ(cfg.ib_recv_depth, 2);
    EXPECT_EQ(cfg.ib_sq_depth, 16384);
    EXPECT_EQ(cfg.ib_reg_cache, 0u);
    EXPECT_EQ(cfg.ib_gdr, -1);
    EXPECT_STREQ(cfg.topo_xml, "/tmp/topo.xml");
    EXPECT_STREQ(cfg.cuda_lib, "libcudart.so.12");
    EXPECT_EQ(cfg.cuda_stage_chunk, 256u << 10);
    EXPECT_EQ(cfg.cuda_stage_slots, 8);
    EXPECT_EQ(cfg.cuda_ipc_cache, 1);
    EXPECT_STREQ(cfg.allgather_algo, "bruck") << "stored in the spelling the collectives compare";
    EXPECT_EQ(cfg.allgather_chunk, 256u << 10);
    EXPECT_EQ(cfg.progress_thread, 1);
    EXPECT_EQ(cfg.pipe_inline, 4096u);
}

/* The cases of issue 10 that used to be accepted, with the exact message. */
TEST(Config, KnownBadValuesRefused)
{
    EXPECT_EQ(expect_rejected("WEFT_ALLGATHER_CHUNK_KB", "abc"),
              "WEFT_ALLGATHER_CHUNK_KB=abc: not a size (expected a size from 1k to 1g: a number of KiB, "
              "or one with suffix k, m or g)");
    EXPECT_EQ(expect_rejected("WEFT_ALLGATHER_CHUNK_KB", "0"),
              "WEFT_ALLGATHER_CHUNK_KB=0: 0 is not allowed here (expected a size from 1k to 1g: a number of "
              "KiB, or one with suffix k, m or g)");
    EXPECT_EQ(expect_rejected("WEFT_TIMEOUT", " 5"),
              "WEFT_TIMEOUT=\" 5\": leading or trailing space (expected seconds from 0 to 1000000000, "
              "fractions allowed, 0 = never)");
    EXPECT_EQ(expect_rejected("WEFT_TIMEOUT", "0x10"),
              "WEFT_TIMEOUT=0x10: hexadecimal is not accepted (expected seconds from 0 to 1000000000, "
              "fractions allowed, 0 = never)");
    EXPECT_EQ(expect_rejected("WEFT_TCP_STREAMS", "0"),
              "WEFT_TCP_STREAMS=0: 0 is not allowed here (expected an integer in [1, 64])");
}

/* One rule for every number: the digits and nothing else. */
TEST(Config, EveryNumberIsStrict)
{
    for (const auto &var : numeric_variables()) {
        const std::string &name = var.first, &good = var.second;
        (void)load_ok({{name, good}});
        const std::vector<std::string> bads = {"", " " + good, good + " ", "\t" + good, good + "\n", "+" + good,
                                               "0x10", "0X1f", "abc", good + "x", "1e3", "--1", "-"};
        for (const std::string &bad : bads)
            expect_rejected(name, bad);
        const std::string msg = expect_rejected(name, " " + good);
        EXPECT_NE(msg.find("leading or trailing space"), std::string::npos) << msg;
        EXPECT_NE(expect_rejected(name, "0x10").find("hexadecimal"), std::string::npos) << name;
        EXPECT_NE(expect_rejected(name, "").find(": empty ("), std::string::npos) << name;
    }
}

/* 0 is refused where it would mean nothing... */
TEST(Config, ZeroRefusedWhereMeaningless)
{
    for (const char *name : {"WEFT_SHM_RING_KB", "WEFT_SHM_CHUNK_KB", "WEFT_TCP_STREAMS", "WEFT_TCP_CHUNK_KB",
                             "WEFT_EAGER_WINDOW", "WEFT_IB_QPS_PER_PEER", "WEFT_IB_TIMEOUT", "WEFT_IB_CHUNK",
                             "WEFT_IB_EAGER", "WEFT_IB_RECV_DEPTH", "WEFT_IB_SQ_DEPTH", "WEFT_CUDA_STAGE_CHUNK",
                             "WEFT_CUDA_STAGE_SLOTS", "WEFT_CUDA_IPC_CACHE", "WEFT_ALLGATHER_CHUNK_KB"}) {
        expect_rejected(name, "0");
        expect_rejected(name, "0k");
    }
}

/* ...and accepted where it is documented to mean something. */
TEST(Config, ZeroAcceptedWhereMeaningful)
{
    EXPECT_EQ(load_ok({{"WEFT_VIRTUAL_NODES", "0"}}).virtual_nodes, 0);      /* off */
    EXPECT_EQ(load_ok({{"WEFT_SHM_CMA", "0"}}).shm_cma, 0);                  /* bounce buffers only */
    EXPECT_EQ(load_ok({{"WEFT_SHM_STREAM", "0"}}).shm_stream, 0);            /* streams pulled too */
    EXPECT_EQ(load_ok({{"WEFT_SHM_EAGER", "0"}}).shm_eager_limit, 0u);       /* every message rendezvous */
    EXPECT_EQ(load_ok({{"WEFT_SHM_COLL_EAGER", "0"}}).shm_coll_eager, 0u);
    EXPECT_EQ(load_ok({{"WEFT_SHM_CMA_MIN_KB", "0"}}).shm_cma_min, 0u);      /* CMA from any size */
    EXPECT_EQ(load_ok({{"WEFT_NODE_COLL_STREAM_KB", "0"}}).node_coll_stream, 0u);  /* never streamed */
    EXPECT_EQ(load_ok({{"WEFT_NODE_COLL_STREAM_KB", "1m"}}).node_coll_stream, 1u << 20);
    EXPECT_EQ(load_ok({{"WEFT_TCP_EAGER", "0"}}).tcp_eager_limit, 0u);
    EXPECT_EQ(load_ok({{"WEFT_SELF_EAGER", "0"}}).self_eager_limit, 0u);
    EXPECT_EQ(load_ok({{"WEFT_SPIN_US", "0"}}).spin_us, 0);                  /* never spin */
    EXPECT_EQ(load_ok({{"WEFT_PIPE_INLINE", "0"}}).pipe_inline, 0u);         /* every buffer on the data lane */
    EXPECT_EQ(load_ok({{"WEFT_IB_RETRY_CNT", "0"}}).ib_retry_cnt, 0);
    EXPECT_EQ(load_ok({{"WEFT_IB_REG_CACHE_MB", "0"}}).ib_reg_cache, 0u);    /* no caching */
    EXPECT_EQ(load_ok({{"WEFT_IB_GID_INDEX", "0"}}).ib_gid_index, 0);
    EXPECT_EQ(load_ok({{"WEFT_IB_GDR", "0"}}).ib_gdr, 0);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "0"}}).log_level, WEFT_LOG_NONE);
}

TEST(Config, OutOfRangeIsRefusedNotClamped)
{
    EXPECT_NE(expect_rejected("WEFT_TCP_STREAMS", "65").find("above the maximum"), std::string::npos);
    EXPECT_NE(expect_rejected("WEFT_IB_GID_INDEX", "-2").find("below the minimum"), std::string::npos);
    EXPECT_NE(expect_rejected("WEFT_SHM_RING_KB", "63").find("below the minimum"), std::string::npos);
    EXPECT_NE(expect_rejected("WEFT_VIRTUAL_NODES", "99999999999999999999").find("above the maximum"),
              std::string::npos);
    EXPECT_NE(expect_rejected("WEFT_SHM_CMA_MIN_KB", "99999999999999999999").find("above the maximum"),
              std::string::npos);
    EXPECT_NE(expect_rejected("WEFT_TIMEOUT", "1000000001").find("above the maximum"), std::string::npos);
    /* Bounds are exact. */
    EXPECT_EQ(load_ok({{"WEFT_TCP_STREAMS", "64"}}).tcp_streams, 64);
    EXPECT_EQ(load_ok({{"WEFT_TCP_STREAMS", "1"}}).tcp_streams, 1);
    EXPECT_EQ(load_ok({{"WEFT_ALLGATHER_CHUNK_KB", "1"}}).allgather_chunk, 1024u);
    EXPECT_EQ(load_ok({{"WEFT_ALLGATHER_CHUNK_KB", "1g"}}).allgather_chunk, 1u << 30);
    expect_rejected("WEFT_ALLGATHER_CHUNK_KB", "1048577");
    EXPECT_EQ(load_ok({{"WEFT_ALLGATHER_CHUNK_KB", "010"}}).allgather_chunk, 10u << 10) << "decimal, not octal";
}

TEST(Config, TimeoutForms)
{
    EXPECT_EQ(load_ok({{"WEFT_TIMEOUT", "0.25"}}).timeout_s, 0.25);
    EXPECT_EQ(load_ok({{"WEFT_TIMEOUT", "1000000000"}}).timeout_s, 1e9);
    for (const char *bad : {".5", "5.", "1e2", "inf", "nan", "5,5", "1.2.3", "- 1", "5 s"})
        expect_rejected("WEFT_TIMEOUT", bad);
}

TEST(Config, EagerWindow)
{
    EXPECT_EQ(load_ok({}).eager_window, 4u << 20);
    EXPECT_EQ(load_ok({{"WEFT_EAGER_WINDOW", "64k"}}).eager_window, 64u << 10);
    EXPECT_EQ(load_ok({{"WEFT_EAGER_WINDOW", "65536"}}).eager_window, 65536u) << "a plain number is bytes";
    EXPECT_EQ(load_ok({{"WEFT_EAGER_WINDOW", "1G"}}).eager_window, 1u << 30);
    EXPECT_EQ(expect_rejected("WEFT_EAGER_WINDOW", "65535"),
              "WEFT_EAGER_WINDOW=65535: below the minimum (expected a size from 64k to 1g: a number of bytes, "
              "or one with suffix k, m or g)");
    expect_rejected("WEFT_EAGER_WINDOW", "63k");
    expect_rejected("WEFT_EAGER_WINDOW", "2g");
    expect_rejected("WEFT_EAGER_WINDOW", "4 m");
}

TEST(Config, NamesAndPaths)
{
    const std::string too_long(300, 'x');
    /* Empty means the default where the default is "unset". */
    EXPECT_STREQ(load_ok({{"WEFT_TCP_IF", ""}}).tcp_if, "");
    EXPECT_STREQ(load_ok({{"WEFT_IB_HCA", ""}}).ib_hca, "");
    EXPECT_STREQ(load_ok({{"WEFT_TOPO_XML", ""}}).topo_xml, "");
    EXPECT_STREQ(load_ok({{"WEFT_ALLGATHER_ALGO", ""}}).allgather_algo, "auto");
    EXPECT_STREQ(load_ok({{"WEFT_TCP_IF", "10.1.0.7"}}).tcp_if, "10.1.0.7");
    for (const char *ok : {"mlx5_0", "mlx5_0:1", "mlx5_0:1,mlx5_1:2", "emu_2,mlx5_1", "dev:255"})
        EXPECT_STREQ(load_ok({{"WEFT_IB_HCA", ok}}).ib_hca, ok);
    const std::pair<const char *, const char *> bad[] = {
        {"WEFT_TCP_IF", " eth0"},          {"WEFT_TCP_IF", "eth0 "},        {"WEFT_TCP_IF", "eth 0"},
        {"WEFT_IB_HCA", "mlx5_0:"},        {"WEFT_IB_HCA", "mlx5_0:0"},     {"WEFT_IB_HCA", "mlx5_0:256"},
        {"WEFT_IB_HCA", "mlx5_0:x"},       {"WEFT_IB_HCA", "mlx5_0,"},      {"WEFT_IB_HCA", ",mlx5_0"},
        {"WEFT_IB_HCA", "mlx5_0;mlx5_1"},  {"WEFT_IB_HCA", "mlx5_0, mlx5_1"}, {"WEFT_IB_HCA", ":1"},
        {"WEFT_IB_HCA", "mlx5_0:0x1"},     {"WEFT_IBVERBS_LIB", ""},        {"WEFT_IBVERBS_LIB", " libx.so"},
        {"WEFT_CUDA_LIB", ""},             {"WEFT_CUDA_LIB", "libcudart.so "}, {"WEFT_TOPO_XML", " /t.xml"},
        {"WEFT_ALLGATHER_ALGO", "ringg"},  {"WEFT_ALLGATHER_ALGO", " ring"}, {"WEFT_ALLGATHER_ALGO", "ring,rd"},
        {"WEFT_IB_GDR", "yes"},            {"WEFT_IB_GDR", " auto"},        {"WEFT_IB_GDR", ""},
        {"WEFT_TRANSPORTS", " shm"},       {"WEFT_TRANSPORTS", "shm, tcp"},
        {"WEFT_TOPO_XML", too_long.c_str()},
    };
    for (const auto &b : bad)
        expect_rejected(b.first, b.second);
    EXPECT_NE(expect_rejected("WEFT_ALLGATHER_ALGO", "ringg").find("auto, ring, rd, bruck, direct or hier"),
              std::string::npos);
}

TEST(Config, Threads)
{
    EXPECT_STREQ(load_ok({}).threads, "multiple");
    EXPECT_STREQ(load_ok({{"WEFT_THREADS", ""}}).threads, "multiple");
    EXPECT_STREQ(load_ok({{"WEFT_THREADS", "serialized"}}).threads, "serialized");
    EXPECT_STREQ(load_ok({{"WEFT_THREADS", "Serialized"}}).threads, "serialized");
    EXPECT_TRUE(weft_config_reads("WEFT_THREADS")) << "a comm's own setting";
    for (const char *bad : {"single", "serialised", "1", " serialized"})
        EXPECT_NE(expect_rejected("WEFT_THREADS", bad).find("multiple or serialized"), std::string::npos) << bad;
}

TEST(Config, TimeoutZeroMeansNever)
{
    EXPECT_EQ(load_ok({{"WEFT_TIMEOUT", "0"}}).timeout_s, 0.0);
    EXPECT_EQ(load_ok({{"WEFT_TIMEOUT", "2"}}).timeout_s, 2.0);
}

TEST(Config, MalformedValuesNameTheVariable)
{
    const std::pair<const char *, const char *> bad[] = {
        {"WEFT_TIMEOUT", "abc"},        {"WEFT_TIMEOUT", "-1"},          {"WEFT_TIMEOUT", "5s"},
        {"WEFT_TIMEOUT", ""},           {"WEFT_DEBUG", "loud"},          {"WEFT_DEBUG", "infos"},
        {"WEFT_TRANSPORTS", "shm;tcp"}, {"WEFT_TRANSPORTS", "shm,,x"},   {"WEFT_TRANSPORTS", ""},
        {"WEFT_VIRTUAL_NODES", "-2"},   {"WEFT_VIRTUAL_NODES", "two"},   {"WEFT_VIRTUAL_NODES", "2x"},
        {"WEFT_SHM_CMA", "2"},          {"WEFT_SHM_CMA", "yes"},         {"WEFT_SHM_CMA", ""},
        {"WEFT_SHM_STREAM", "2"},       {"WEFT_SHM_STREAM", "on"},
        {"WEFT_SHM_EAGER", "-5"},       {"WEFT_SHM_EAGER", "12q"},       {"WEFT_SHM_EAGER", "1kk"},
        {"WEFT_SHM_EAGER", "2g"},       {"WEFT_SHM_RING_KB", "1"},       {"WEFT_SHM_RING_KB", "x"},
        {"WEFT_SHM_CHUNK_KB", "0"},     {"WEFT_SHM_CMA_MIN_KB", "lots"}, {"WEFT_TCP_STREAMS", "0"},
        {"WEFT_TCP_STREAMS", "65"},     {"WEFT_TCP_STREAMS", "four"},    {"WEFT_TCP_EAGER", "1t"},
        {"WEFT_TCP_EAGER", "99999999999999999999999"},                   {"WEFT_TCP_CHUNK_KB", "1"},
        {"WEFT_SELF_EAGER", " "},       {"WEFT_SPIN_US", "-1"},          {"WEFT_SPIN_US", "1.5"},
        {"WEFT_IB_GID_INDEX", "-2"},    {"WEFT_IB_GID_INDEX", "256"},    {"WEFT_IB_QPS_PER_PEER", "0"},
        {"WEFT_IB_QPS_PER_PEER", "17"}, {"WEFT_IB_TIMEOUT", "0"},        {"WEFT_IB_RETRY_CNT", "8"},
        {"WEFT_IB_CHUNK", "1"},         {"WEFT_IB_EAGER", "10"},         {"WEFT_IB_RECV_DEPTH", "1"},
        {"WEFT_IB_SQ_DEPTH", "x"},      {"WEFT_IB_REG_CACHE_MB", "lots"},
        {"WEFT_TCP_IF", "an-interface-name-that-is-much-longer-than-sixty-three-characters-in-all"},
    };
    for (const auto &b : bad)
        expect_rejected(b.first, b.second);
}

TEST(Config, EagerLimitMustFitTheRing)
{
    Env env = {{"WEFT_SHM_RING_KB", "64"}, {"WEFT_SHM_EAGER", "32k"}};
    struct weft_config cfg;
    char err[256] = "";
    EXPECT_EQ(weft_config_load(&cfg, lookup_map, &env, err, sizeof(err)), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(err).find("WEFT_SHM_EAGER"), std::string::npos) << err;
}

TEST(Config, CollectiveEagerLimit)
{
    struct weft_config cfg;
    char err[256] = "";
    {
        Env env = {{"WEFT_SHM_COLL_EAGER", "16k"}};
        ASSERT_EQ(weft_config_load(&cfg, lookup_map, &env, err, sizeof(err)), WEFT_SUCCESS) << err;
        EXPECT_EQ(cfg.shm_coll_eager, 16384u);
    }
    {
        /* The default shrinks to fit a small ring instead of failing... */
        Env env = {{"WEFT_SHM_RING_KB", "64"}};
        ASSERT_EQ(weft_config_load(&cfg, lookup_map, &env, err, sizeof(err)), WEFT_SUCCESS) << err;
        EXPECT_LE(cfg.shm_coll_eager + 256, cfg.shm_ring_bytes / 4);
    }
    {
        /* ...but a value the user set that does not fit is an error. */
        Env env = {{"WEFT_SHM_RING_KB", "64"}, {"WEFT_SHM_COLL_EAGER", "32k"}};
        EXPECT_EQ(weft_config_load(&cfg, lookup_map, &env, err, sizeof(err)), WEFT_ERR_INVALID_ARG);
        EXPECT_NE(std::string(err).find("WEFT_SHM_COLL_EAGER"), std::string::npos) << err;
    }
}

TEST(Config, SizeSuffixes)
{
    size_t v = 0;
    EXPECT_EQ(weft_parse_size("0", &v), 0);
    EXPECT_EQ(v, 0u);
    EXPECT_EQ(weft_parse_size("17", &v), 0);
    EXPECT_EQ(v, 17u);
    EXPECT_EQ(weft_parse_size("4k", &v), 0);
    EXPECT_EQ(v, 4096u);
    EXPECT_EQ(weft_parse_size("4K", &v), 0);
    EXPECT_EQ(v, 4096u);
    EXPECT_EQ(weft_parse_size("3m", &v), 0);
    EXPECT_EQ(v, 3u << 20);
    EXPECT_EQ(weft_parse_size("5g", &v), 0);
    EXPECT_EQ(v, (size_t)5 << 30);
    EXPECT_EQ(weft_parse_size("2kb", &v), 0);
    EXPECT_EQ(v, 2048u);

    v = 99;
    for (const char *bad : {"", "k", "-1", "1.5k", "4x", "4kk", "4 k", "0x10", "99999999999999999999",
                            "20000000000g"}) {
        EXPECT_NE(weft_parse_size(bad, &v), 0) << "\"" << bad << "\" accepted";
        EXPECT_EQ(v, 99u) << "\"" << bad << "\" wrote the output";
    }
    EXPECT_NE(weft_parse_size(nullptr, &v), 0);
}

TEST(Config, SizeVariablesInTheirUnit)
{
    /* A plain number of a *_KB variable is KiB; with a suffix it is absolute. */
    EXPECT_EQ(load_ok({{"WEFT_SHM_CHUNK_KB", "64"}}).shm_chunk, 64u << 10);
    EXPECT_EQ(load_ok({{"WEFT_SHM_CHUNK_KB", "64k"}}).shm_chunk, 64u << 10);
    EXPECT_EQ(load_ok({{"WEFT_TCP_CHUNK_KB", "1m"}}).tcp_chunk, 1u << 20);
    /* A plain number of a byte-sized variable is bytes. */
    EXPECT_EQ(load_ok({{"WEFT_TCP_EAGER", "1000"}}).tcp_eager_limit, 1000u);
    EXPECT_EQ(load_ok({{"WEFT_SELF_EAGER", "0"}}).self_eager_limit, 0u);
}

TEST(Config, Transports)
{
    /* The form is checked here; which names exist is the registry's
     * (tests/test_registry.cc). */
    for (const char *ok : {"shm,tcp", "shm,ib", "tcp", "self", "TCP,Shm", "tcp,tcp", "rdma"})
        EXPECT_EQ(weft_parse_transports(ok), 0) << "\"" << ok << "\" refused";
    for (const char *bad : {"", "shm;tcp", "shm,,x", "shm,", ",shm", "sh m"})
        EXPECT_NE(weft_parse_transports(bad), 0) << "\"" << bad << "\" accepted";
    EXPECT_STREQ(load_ok({{"WEFT_TRANSPORTS", "shm"}}).transports, "shm");
}

TEST(Config, DebugLevels)
{
    EXPECT_EQ(load_ok({}).log_level, WEFT_LOG_WARN);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "none"}}).log_level, WEFT_LOG_NONE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "0"}}).log_level, WEFT_LOG_NONE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "warn"}}).log_level, WEFT_LOG_WARN);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "info"}}).log_level, WEFT_LOG_INFO);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "trace"}}).log_level, WEFT_LOG_TRACE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "TRACE"}}).log_level, WEFT_LOG_TRACE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", ""}}).log_level, WEFT_LOG_NONE);
    EXPECT_LT(WEFT_LOG_NONE, WEFT_LOG_WARN);
    EXPECT_LT(WEFT_LOG_WARN, WEFT_LOG_INFO);
    EXPECT_LT(WEFT_LOG_INFO, WEFT_LOG_TRACE);
    for (const char *bad : {"loud", " warn", "warn ", "1", "warning"})
        expect_rejected("WEFT_DEBUG", bad);
}

/* The level used before any comm, or when create refuses the configuration:
 * warn unless WEFT_DEBUG names a valid level, so a refused WEFT_DEBUG=loud is
 * still printed. Each case in a process of its own with that environment
 * (the probe); the same rules for WEFT_DEBUG in a comm's settings, which a
 * refused create looks up first. */
TEST(Config, LogLevelFromEnvironment)
{
    const std::pair<const char *, int> cases[] = {
        {nullptr, WEFT_LOG_WARN}, {"loud", WEFT_LOG_WARN}, {" info", WEFT_LOG_WARN}, {"none", WEFT_LOG_NONE},
        {"", WEFT_LOG_NONE},      {"info", WEFT_LOG_INFO}, {"TRACE", WEFT_LOG_TRACE}, {"warn", WEFT_LOG_WARN},
    };
    for (const auto &c : cases) {
        weft_childenv::Vars set;
        if (c.first)
            set.push_back({"WEFT_DEBUG", c.first});
        const std::string got = probe("log_level", set, {"WEFT_DEBUG"});
        EXPECT_EQ(got, std::to_string(c.second)) << "WEFT_DEBUG=" << (c.first ? c.first : "(unset)");
        if (!c.first)
            continue;
        const char *names[] = {"WEFT_DEBUG"};
        const char *values[] = {c.first};
        struct weft_settings *s = nullptr;
        char err[256] = "";
        ASSERT_EQ(WEFT_SUCCESS, weft_settings_make(names, values, 1, &s, err, sizeof(err))) << err;
        EXPECT_EQ(weft_config_log_level(s), c.second) << "settings' WEFT_DEBUG=" << c.first;
        weft_settings_free(s);
    }
}

/* The settings compared between ranks at create: each is read from its own
 * variable (changing the variable changes that value and no other), and
 * formats as a user would write it. */
TEST(Config, AgreedSettings)
{
    const std::map<std::string, std::pair<std::string, std::string>> change = {
        /* variable: a value other than the default, and how it formats */
        {"WEFT_VIRTUAL_NODES", {"3", "3"}},           {"WEFT_SHM_RING_KB", {"2048", "2m"}},
        {"WEFT_SHM_EAGER", {"1000", "1000"}},         {"WEFT_SHM_COLL_EAGER", {"16k", "16k"}},
        {"WEFT_SHM_CHUNK_KB", {"128", "128k"}},       {"WEFT_TCP_STREAMS", {"2", "2"}},
        {"WEFT_TCP_EAGER", {"32k", "32k"}},           {"WEFT_TCP_CHUNK_KB", {"256", "256k"}},
        {"WEFT_IB_EAGER", {"4k", "4k"}},              {"WEFT_EAGER_WINDOW", {"1g", "1g"}},
        {"WEFT_ALLGATHER_ALGO", {"RING", "ring"}},    {"WEFT_ALLGATHER_CHUNK_KB", {"64", "64k"}},
        {"WEFT_ALLREDUCE_ALGO", {"rabenseifner", "rabenseifner"}},
        {"WEFT_REDUCE_SCATTER_ALGO", {"Halving", "halving"}},
        {"WEFT_REDUCE_ALGO", {"binomial", "binomial"}},
        {"WEFT_ALLTOALL_ALGO", {"bruck", "bruck"}},   {"WEFT_REDUCE_CHUNK_KB", {"64", "64k"}},
        {"WEFT_NODE_COLL_KB", {"0", "0"}},            {"WEFT_NODE_COLL_LARGE_KB", {"256", "256k"}},
    };
    ASSERT_EQ((size_t)WEFT_CONFIG_AGREED_COUNT, change.size());
    std::set<std::string> names;
    for (int i = 0; i < WEFT_CONFIG_AGREED_COUNT; i++)
        names.insert(weft_config_agreed_name(i));
    EXPECT_EQ(names.size(), change.size()) << "a setting listed twice";

    int64_t base[WEFT_CONFIG_AGREED_COUNT];
    struct weft_config dflt = load_ok({});
    weft_config_agreed_values(&dflt, base);
    char buf[64];
    for (int i = 0; i < WEFT_CONFIG_AGREED_COUNT; i++) {
        const std::string name = weft_config_agreed_name(i);
        ASSERT_TRUE(change.count(name)) << name << " is compared but not covered here";
        const auto &c = change.at(name);
        struct weft_config cfg = load_ok({{name, c.first}});
        int64_t v[WEFT_CONFIG_AGREED_COUNT];
        weft_config_agreed_values(&cfg, v);
        for (int j = 0; j < WEFT_CONFIG_AGREED_COUNT; j++)
            EXPECT_EQ(v[j] != base[j], j == i) << name << "=" << c.first << " and " << weft_config_agreed_name(j);
        weft_config_agreed_format(i, v[i], buf, sizeof(buf));
        EXPECT_EQ(std::string(buf), c.second) << name;
    }
    /* Per-host and per-rank settings are not compared. */
    for (const char *local : {"WEFT_TIMEOUT", "WEFT_DEBUG", "WEFT_TCP_IF", "WEFT_TOPO_XML", "WEFT_IBVERBS_LIB",
                              "WEFT_CUDA_LIB", "WEFT_IB_HCA", "WEFT_SPIN_US", "WEFT_SHM_CMA",
                              "WEFT_SHM_STREAM"})
        EXPECT_FALSE(names.count(local)) << local << " may differ between ranks";
}

TEST(Config, ErrorMessageFitsSmallBuffers)
{
    Env env = {{"WEFT_TCP_STREAMS", "many"}};
    struct weft_config cfg;
    char err[8];
    std::memset(err, 'z', sizeof(err));
    EXPECT_EQ(weft_config_load(&cfg, lookup_map, &env, err, sizeof(err)), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(err[sizeof(err) - 1], '\0') << "message not terminated inside the buffer";
    EXPECT_EQ(weft_config_load(&cfg, lookup_map, &env, nullptr, 0), WEFT_ERR_INVALID_ARG);
}

} // namespace

/* A comm's own settings (weft_config_t): names the loader reads, checked
 * and copied; looked up before the environment. */
namespace {

TEST(Settings, NamesAreTheLoadersOwn)
{
    EXPECT_TRUE(weft_config_reads("WEFT_TIMEOUT"));
    EXPECT_TRUE(weft_config_reads("WEFT_TRANSPORTS"));
    EXPECT_TRUE(weft_config_reads("WEFT_ALLTOALL_ALGO"));
    EXPECT_TRUE(weft_config_reads("WEFT_SHM_COLL_EAGER"));
    EXPECT_FALSE(weft_config_reads("WEFT_NOPE"));
    EXPECT_FALSE(weft_config_reads("weft_timeout")) << "names are upper case, as in the environment";
    EXPECT_FALSE(weft_config_reads("WEFT_EMU_CUDA_MODULES")) << "the emulator's knob is not a comm's setting";
}

TEST(Settings, CopiedCheckedAndLookedUpFirst)
{
    std::string name = "WEFT_SPIN_US", value = "7";
    const char *names[] = {name.c_str(), "WEFT_TIMEOUT"};
    const char *values[] = {value.c_str(), "12.5"};
    struct weft_settings *s = nullptr;
    char err[256] = "";
    ASSERT_EQ(WEFT_SUCCESS, weft_settings_make(names, values, 2, &s, err, sizeof(err))) << err;
    name = "WEFT_XXXXXXXX";   /* the caller's strings may change or go: the copy stays */
    value = "9";
    EXPECT_STREQ("7", weft_settings_lookup("WEFT_SPIN_US", s));
    EXPECT_STREQ("12.5", weft_settings_lookup("WEFT_TIMEOUT", s));
    EXPECT_EQ(getenv("PATH"), weft_settings_lookup("PATH", s)) << "not given: the environment's";
    struct weft_config cfg;
    ASSERT_EQ(WEFT_SUCCESS, weft_config_load(&cfg, weft_settings_lookup, s, err, sizeof(err))) << err;
    EXPECT_EQ(7, cfg.spin_us);
    EXPECT_EQ(12.5, cfg.timeout_s);
    struct weft_settings *d = nullptr;
    ASSERT_EQ(WEFT_SUCCESS, weft_settings_dup(s, &d));
    weft_settings_free(s);
    EXPECT_STREQ("12.5", weft_settings_lookup("WEFT_TIMEOUT", d));
    weft_settings_free(d);

    EXPECT_EQ(WEFT_SUCCESS, weft_settings_make(nullptr, nullptr, 0, &s, err, sizeof(err)));
    EXPECT_EQ(nullptr, s) << "no settings: the environment alone";
    EXPECT_EQ(WEFT_SUCCESS, weft_settings_dup(nullptr, &d));
    EXPECT_EQ(nullptr, d);
}

TEST(Settings, RefusedEntriesAreNamedAndNothingIsMade)
{
    struct weft_settings *s = reinterpret_cast<struct weft_settings *>(0x1);
    char err[256] = "";
    const char *n1[] = {"WEFT_TIMEOUT", "WEFT_TIMEOUT"};
    const char *v1[] = {"1", "2"};
    EXPECT_EQ(WEFT_ERR_INVALID_ARG, weft_settings_make(n1, v1, 2, &s, err, sizeof(err)));
    EXPECT_STREQ("settings[1]: WEFT_TIMEOUT is given twice (also settings[0])", err);
    const char *n2[] = {"WEFT_TIMEOUT", "NCCL_DEBUG"};
    EXPECT_EQ(WEFT_ERR_INVALID_ARG, weft_settings_make(n2, v1, 2, &s, err, sizeof(err)));
    EXPECT_EQ(0, std::string(err).rfind("settings[1]: NCCL_DEBUG is not a setting a comm takes", 0)) << err;
    const char *v3[] = {"1", nullptr};
    const char *n3[] = {"WEFT_TIMEOUT", "WEFT_SPIN_US"};
    EXPECT_EQ(WEFT_ERR_INVALID_ARG, weft_settings_make(n3, v3, 2, &s, err, sizeof(err)));
    EXPECT_STREQ("settings[1]: its value is NULL", err);
    EXPECT_EQ(reinterpret_cast<struct weft_settings *>(0x1), s) << "set only on success";
}

}  // namespace
