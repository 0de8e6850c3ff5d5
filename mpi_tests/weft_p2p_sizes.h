/*
 * Message sizes the p2p tests cover: the fixed edge sizes of the issue plus
 * every protocol boundary of the configuration the library will read
 * (eager thresholds of each transport, chunk sizes, the CMA switch-over),
 * each -1, exact and +1. The thresholds come from weft_config_load (src/core/config.c
 * is compiled into the test binary), so the tests follow the defaults and
 * any WEFT_* override in the environment.
 */
#ifndef WEFT_P2P_SIZES_H
#define WEFT_P2P_SIZES_H

#include <algorithm>
#include <cstdio>
#include <vector>

/* config.h is a C header without extern "C" of its own. */
extern "C" {
#include "config.h"
}

namespace weft_mpitest {

inline struct weft_config loaded_config()
{
    struct weft_config cfg;
    char err[256] = "";
    if (weft_config_load(&cfg, nullptr, nullptr, err, sizeof(err)) != 0) {
        std::fprintf(stderr, "weft_config_load: %s\n", err);
        std::abort();
    }
    return cfg;
}

/* Sorted, unique; max_bytes drops the sizes above it (0 = keep all). */
inline std::vector<size_t> protocol_sizes(size_t max_bytes = 0)
{
    const struct weft_config cfg = loaded_config();
    std::vector<size_t> s = {0, 1, 7, 31, 32, 4095, 4096, 4097, 16384 - 1, 16384, 16384 + 1,
                             65536 - 1, 65536, 65536 + 1, (1u << 20) + 3, 64u << 20};
    const size_t edges[] = {cfg.shm_eager_limit, cfg.tcp_eager_limit, cfg.self_eager_limit,
                            cfg.shm_chunk,       cfg.tcp_chunk,       2 * cfg.shm_chunk,
                            2 * cfg.tcp_chunk,   cfg.shm_cma_min};
    for (size_t e : edges) {
        if (e > 1)
            s.push_back(e - 1);
        s.push_back(e);
        s.push_back(e + 1);
    }
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    if (max_bytes)
        s.erase(std::remove_if(s.begin(), s.end(), [&](size_t v) { return v > max_bytes; }), s.end());
    return s;
}

/* The largest eager threshold of any transport: a message above it goes
 * through rendezvous whatever transport the pair uses. */
inline size_t max_eager_limit()
{
    const struct weft_config cfg = loaded_config();
    return std::max({cfg.shm_eager_limit, cfg.tcp_eager_limit, cfg.self_eager_limit});
}

inline size_t min_eager_limit()
{
    const struct weft_config cfg = loaded_config();
    return std::min({cfg.shm_eager_limit, cfg.tcp_eager_limit, cfg.self_eager_limit});
}

/* The largest size that is eager on every transport, minus one; with an
 * eager limit set to 0 (WEFT_*_EAGER=0) there is none, and 0 stands in
 * instead of wrapping around to SIZE_MAX. */
inline size_t just_below_min_eager()
{
    const size_t e = min_eager_limit();
    return e ? e - 1 : 0;
}

} // namespace weft_mpitest

#endif
