/*
 * WEFT_TIMEOUT's one rule (deadline.h): the table of every wait's bound.
 */
#include "deadline.h"
#include "config.h"

/* bound = factor x WEFT_TIMEOUT + margin; WEFT_TIMEOUT=0 -> never. */
static const struct {
    const char *name;
    double      factor, margin_s;
} wait_rules[WEFT_WAIT_KINDS] = {
    [WEFT_WAIT_REQUEST]     = { "request without progress", 1.0, 0.0 },
    [WEFT_WAIT_PEER_SILENT] = { "peer on another host silent", 1.0, 0.0 },
    [WEFT_WAIT_STREAM]      = { "stream-ordered operations, none completing", 1.0, 0.0 },
    [WEFT_WAIT_DESTROY]     = { "destroy's drains and final barrier", 1.0, 0.0 },
    [WEFT_WAIT_SHM_PIECE]   = { "shm CMA share of a live peer", 1.0, 0.0 },
    /* More than once: requests waiting on the pair fail first, each after
     * WEFT_TIMEOUT of its own wait, through the pipe's health checks, which
     * name the request and tell a live peer that does not progress from a
     * dead one, and a collective may wait on a few such requests one after
     * the other; this is the backstop that ends a handshake nobody waits on. */
    [WEFT_WAIT_TCP_CONNECT] = { "tcp connection set-up", 2.0, 0.0 },
    [WEFT_WAIT_UID_ROOT]    = { "unique-id root, no rank joining", 1.0, 0.0 },
    /* A little longer than the root's own bound, so that the root, which
     * knows which ranks are missing, speaks first. */
    [WEFT_WAIT_UID_RANK]    = { "unique-id rank, root silent", 1.1, 1.0 },
};

/* bound = min(WEFT_TIMEOUT, cap) when WEFT_TIMEOUT > 0 (cap 0 = none),
 * fallback when it is 0. */
static const struct {
    const char *name;
    double      fallback_s, cap_s;
} keep_rules[WEFT_KEEP_KINDS] = {
    [WEFT_KEEP_TCP_ABANDONED]  = { "tcp sockets that lost a connect race", 60.0, 0.0 },
    /* Destroy does not wait long for transfers of pipes the application
     * left open: what both sides started finishes, the rest is dropped. */
    [WEFT_KEEP_MSGPIPE_LINGER] = { "message pipes finishing in destroy", 2.0, 2.0 },
    /* With WEFT_TIMEOUT=0 the ranks still get a while to read why. */
    [WEFT_KEEP_UID_TELL]       = { "unique-id root telling ranks of a failure", 10.0, 0.0 },
};

double weft_wait_bound(const struct weft_config *cfg, enum weft_wait kind)
{
    double t = cfg->timeout_s;
    if (t <= 0 || (unsigned)kind >= WEFT_WAIT_KINDS)
        return 0;
    return wait_rules[kind].factor * t + wait_rules[kind].margin_s;
}

int weft_wait_expired(const struct weft_config *cfg, enum weft_wait kind, double since, double now)
{
    double bound = weft_wait_bound(cfg, kind);
    return bound > 0 && now - since > bound;
}

int weft_waits_never_fail(const struct weft_config *cfg)
{
    return cfg->timeout_s <= 0;
}

double weft_housekeeping_bound(const struct weft_config *cfg, enum weft_housekeeping kind)
{
    if ((unsigned)kind >= WEFT_KEEP_KINDS)
        return 1.0;
    double t = cfg->timeout_s;
    if (t <= 0)
        return keep_rules[kind].fallback_s;
    return keep_rules[kind].cap_s > 0 && t > keep_rules[kind].cap_s ? keep_rules[kind].cap_s : t;
}

double weft_heartbeat_period(const struct weft_config *cfg)
{
    double t = cfg->timeout_s;
    double hb = t > 0 ? t / 4 : 1.0;
    return hb < 0.1 ? 0.1 : hb;
}

double weft_timeout_setting(const struct weft_config *cfg)
{
    return cfg->timeout_s;
}

const char *weft_wait_rule(enum weft_wait kind, double *factor, double *margin_s)
{
    if ((unsigned)kind >= WEFT_WAIT_KINDS)
        return NULL;
    *factor = wait_rules[kind].factor;
    *margin_s = wait_rules[kind].margin_s;
    return wait_rules[kind].name;
}

const char *weft_housekeeping_rule(enum weft_housekeeping kind, double *fallback_s, double *cap_s)
{
    if ((unsigned)kind >= WEFT_KEEP_KINDS)
        return NULL;
    *fallback_s = keep_rules[kind].fallback_s;
    *cap_s = keep_rules[kind].cap_s;
    return keep_rules[kind].name;
}
