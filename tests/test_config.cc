/*
 * weft_config_load through a lookup function (no real environment): the
 * defaults, every variable parsed, malformed values refused with a message
 * that names the variable, size suffixes, WEFT_TRANSPORTS and WEFT_DEBUG.
 */
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

extern "C" {
#include "config.h"
}
#include "weft.h"

namespace {

using Env = std::map<std::string, std::string>;

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

/* Loads {name=value}; expects refusal with a message naming the variable. */
void expect_rejected(const std::string &name, const std::string &value)
{
    Env env = {{name, value}};
    struct weft_config cfg;
    char err[256] = "";
    int rc = weft_config_load(&cfg, lookup_map, &env, err, sizeof(err));
    EXPECT_EQ(rc, WEFT_ERR_INVALID_ARG) << name << "=\"" << value << "\" accepted";
    EXPECT_NE(std::string(err).find(name), std::string::npos)
        << name << "=\"" << value << "\": message \"" << err << "\" does not name the variable";
}

TEST(Config, Defaults)
{
    struct weft_config cfg = load_ok({});
    EXPECT_EQ(cfg.timeout_s, 300.0);
    EXPECT_EQ(cfg.log_level, WEFT_LOG_NONE);
    EXPECT_STREQ(cfg.transports, "") << "every transport allowed";
    EXPECT_STREQ(cfg.ibverbs_lib, "libibverbs.so.1");
    EXPECT_STREQ(cfg.ib_hca, "");
    EXPECT_EQ(cfg.ib_gid_index, -1);
    EXPECT_EQ(cfg.ib_qps_per_peer, 1);
    EXPECT_GE(cfg.ib_eager_limit, 64u) << "a rendezvous message is never below 64 bytes (no tiny RDMA writes)";
    EXPECT_STREQ(cfg.cuda_lib, "libcudart.so");
    EXPECT_EQ(cfg.virtual_nodes, 0);
    EXPECT_EQ(cfg.shm_cma, 1);
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
}

TEST(Config, DefaultLookupIsGetenv)
{
    setenv("WEFT_TCP_STREAMS", "3", 1);
    struct weft_config cfg;
    char err[256] = "";
    ASSERT_EQ(weft_config_load(&cfg, nullptr, nullptr, err, sizeof(err)), WEFT_SUCCESS) << err;
    unsetenv("WEFT_TCP_STREAMS");
    EXPECT_EQ(cfg.tcp_streams, 3);
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
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "none"}}).log_level, WEFT_LOG_NONE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "warn"}}).log_level, WEFT_LOG_WARN);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "info"}}).log_level, WEFT_LOG_INFO);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "trace"}}).log_level, WEFT_LOG_TRACE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", "TRACE"}}).log_level, WEFT_LOG_TRACE);
    EXPECT_EQ(load_ok({{"WEFT_DEBUG", ""}}).log_level, WEFT_LOG_NONE);
    EXPECT_LT(WEFT_LOG_NONE, WEFT_LOG_WARN);
    EXPECT_LT(WEFT_LOG_WARN, WEFT_LOG_INFO);
    EXPECT_LT(WEFT_LOG_INFO, WEFT_LOG_TRACE);
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
