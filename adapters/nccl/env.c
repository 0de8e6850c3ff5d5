/*
 * NCCL's environment variables, as users set them out of habit, mapped
 * onto weft's (docs/nccl.md has the table). Read once per process, before
 * the first comm is made, into settings every comm and unique id of this
 * library is made with (weft_config_t): the process environment is never
 * written, so no thread of the host races with it. A WEFT_* variable the
 * user set wins over the NCCL_* one that would map to it. Every other NCCL_* variable is named once at info
 * level as ignored, so nobody believes a knob took effect when it did not.
 *
 * NCCL_DEBUG also drives this library's own lines, in NCCL's shape
 * ("host:pid:tid [dev] NCCL INFO ...", on stdout as NCCL prints them).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nccl_adapter.h"

extern char **environ;

static int g_level = NCCLW_LOG_NONE;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The WEFT_* settings the NCCL_* variables map to: written once under
 * g_once, read-only after. */
static char g_names[NCCLW_MAX_SETTINGS][32];
static char g_values[NCCLW_MAX_SETTINGS][256];
static weft_setting_t g_settings[NCCLW_MAX_SETTINGS];
static size_t g_nsettings;

const char *nccl_version_text(void)
{
    static char text[96];
    if (text[0] == '\0')
        snprintf(text, sizeof(text), "weft %d.%d.%d, NCCL %d.%d.%d API", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
                 WEFT_VERSION_PATCH, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    return text;
}

static void once(void);

/* Only the mapping's once: print_notes (run under the other once) logs. */
int nccl_log_level(void)
{
    pthread_once(&g_once, once);
    return g_level;
}

static void vlog(int level, int device, const char *fmt, va_list ap)
{
    char host[64] = "?", msg[1200];
    const char *tag = level == NCCLW_LOG_WARN ? "WARN" : level == NCCLW_LOG_TRACE ? "TRACE" : "INFO";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    vsnprintf(msg, sizeof(msg), fmt, ap);
    /* One fprintf per line: lines of several threads do not interleave. */
    fprintf(stdout, "%s:%d:%ld [%d] NCCL %s %s\n", host, (int)getpid(), (long)syscall(SYS_gettid), device, tag, msg);
    fflush(stdout);
}

void nccl_log(int level, int device, const char *fmt, ...)
{
    va_list ap;
    if (nccl_log_level() < level)
        return;
    va_start(ap, fmt);
    vlog(level, device, fmt, ap);
    va_end(ap);
}

/* NCCL_DEBUG's names (case-insensitive, as NCCL takes them). */
static int parse_level(const char *v)
{
    if (v == NULL || *v == '\0')
        return NCCLW_LOG_NONE;
    if (strcasecmp(v, "VERSION") == 0) return NCCLW_LOG_VERSION;
    if (strcasecmp(v, "WARN") == 0)    return NCCLW_LOG_WARN;
    if (strcasecmp(v, "INFO") == 0)    return NCCLW_LOG_INFO;
    if (strcasecmp(v, "TRACE") == 0)   return NCCLW_LOG_TRACE;
    return NCCLW_LOG_NONE;
}

/* Lines decided before the level is known are kept and printed after. */
static char g_notes[16][400];
static int  g_nnotes;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    if (g_nnotes >= (int)(sizeof(g_notes) / sizeof(g_notes[0])))
        return;
    va_start(ap, fmt);
    vsnprintf(g_notes[g_nnotes++], sizeof(g_notes[0]), fmt, ap);
    va_end(ap);
}

/* weft_var=value in the comms' settings (a later value replaces an
 * earlier one). 0, or -1 when the list is full. */
static int put(const char *weft_var, const char *value)
{
    for (size_t i = 0; i < g_nsettings; i++)
        if (strcmp(g_names[i], weft_var) == 0) {
            snprintf(g_values[i], sizeof(g_values[i]), "%s", value);
            return 0;
        }
    if (g_nsettings >= NCCLW_MAX_SETTINGS)
        return -1;
    snprintf(g_names[g_nsettings], sizeof(g_names[0]), "%s", weft_var);
    snprintf(g_values[g_nsettings], sizeof(g_values[0]), "%s", value);
    g_settings[g_nsettings].name = g_names[g_nsettings];
    g_settings[g_nsettings].value = g_values[g_nsettings];
    g_nsettings++;
    return 0;
}

/* weft_var=value in the comms' settings, unless the user set weft_var. */
static void map_to(const char *nccl_var, const char *nccl_value, const char *weft_var, const char *value)
{
    const char *user = getenv(weft_var);
    if (user != NULL) {
        note("%s=%s ignored: %s=%s is set and wins", nccl_var, nccl_value, weft_var, user);
        return;
    }
    if (put(weft_var, value) == 0)   /* the later NCCL_* wins */
        note("%s=%s -> %s=%s", nccl_var, nccl_value, weft_var, value);
}

size_t nccl_env_settings(const weft_setting_t **settings)
{
    pthread_once(&g_once, once);
    *settings = g_settings;
    return g_nsettings;
}

/* The first entry of an NCCL interface/HCA list, '=' (exact match) dropped;
 * NULL for an exclusion list ('^'), which weft has no form for. */
static const char *first_entry(const char *v, char *buf, size_t len, int whole_list)
{
    if (v[0] == '^')
        return NULL;
    if (v[0] == '=')
        v++;
    snprintf(buf, len, "%s", v);
    if (!whole_list) {
        char *comma = strchr(buf, ',');
        if (comma)
            *comma = '\0';
    }
    return buf;
}

static int truthy(const char *v)
{
    return v != NULL && (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0);
}

static const char *const mapped[] = {
    "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_SHM_DISABLE",
    "NCCL_NET_GDR_LEVEL", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT",
    "NCCL_IB_QPS_PER_CONNECTION",
};

static void apply_once(void)
{
    const char *v;
    char buf[512];
    int drop_ib = 0, drop_shm = 0;

    v = getenv("NCCL_DEBUG");
    g_level = parse_level(v);
    if (v != NULL && *v != '\0') {
        static const char *const weft_level[] = {"", "", "warn", "info", "trace"};
        if (g_level >= NCCLW_LOG_WARN)
            map_to("NCCL_DEBUG", v, "WEFT_DEBUG", weft_level[g_level]);
        else if (g_level == NCCLW_LOG_NONE)
            note("NCCL_DEBUG=%s ignored: expected VERSION, WARN, INFO or TRACE", v);
    }
    if ((v = getenv("NCCL_SOCKET_IFNAME")) != NULL) {
        const char *e = first_entry(v, buf, sizeof(buf), 0);
        if (e && *e)
            map_to("NCCL_SOCKET_IFNAME", v, "WEFT_TCP_IF", e);
        else
            note("NCCL_SOCKET_IFNAME=%s ignored: weft takes one interface name, not an exclusion list", v);
    }
    if ((v = getenv("NCCL_IB_HCA")) != NULL) {
        const char *e = first_entry(v, buf, sizeof(buf), 1);
        if (e && *e)
            map_to("NCCL_IB_HCA", v, "WEFT_IB_HCA", e);
        else
            note("NCCL_IB_HCA=%s ignored: weft takes a device[:port] list, not an exclusion list", v);
    }
    if ((v = getenv("NCCL_IB_DISABLE")) != NULL && truthy(v))
        drop_ib = 1;
    if ((v = getenv("NCCL_NET")) != NULL && strcasecmp(v, "Socket") == 0)
        drop_ib = 1;
    if ((v = getenv("NCCL_SHM_DISABLE")) != NULL && truthy(v))
        drop_shm = 1;
    if (drop_ib || drop_shm) {
        char list[64];
        snprintf(list, sizeof(list), "self%s,tcp%s", drop_shm ? "" : ",shm", drop_ib ? "" : ",ib");
        map_to(drop_ib && drop_shm ? "NCCL_IB_DISABLE/NCCL_NET/NCCL_SHM_DISABLE"
               : drop_ib           ? "NCCL_IB_DISABLE/NCCL_NET"
                                   : "NCCL_SHM_DISABLE",
               "(set)", "WEFT_TRANSPORTS", list);
    }
    if ((v = getenv("NCCL_NET_GDR_LEVEL")) != NULL) {
        if (strcasecmp(v, "LOC") == 0 || strcmp(v, "0") == 0)
            map_to("NCCL_NET_GDR_LEVEL", v, "WEFT_IB_GDR", "0");
        else
            note("NCCL_NET_GDR_LEVEL=%s: weft decides GPUDirect RDMA per NIC (WEFT_IB_GDR=auto)", v);
    }
    if ((v = getenv("NCCL_IB_GID_INDEX")) != NULL)
        map_to("NCCL_IB_GID_INDEX", v, "WEFT_IB_GID_INDEX", v);
    if ((v = getenv("NCCL_IB_TIMEOUT")) != NULL)
        map_to("NCCL_IB_TIMEOUT", v, "WEFT_IB_TIMEOUT", v);
    if ((v = getenv("NCCL_IB_RETRY_CNT")) != NULL)
        map_to("NCCL_IB_RETRY_CNT", v, "WEFT_IB_RETRY_CNT", v);
    if ((v = getenv("NCCL_IB_QPS_PER_CONNECTION")) != NULL)
        map_to("NCCL_IB_QPS_PER_CONNECTION", v, "WEFT_IB_QPS_PER_PEER", v);

    /* An NCCL communicator is called from several threads at once (a
     * framework's watchdog polls ncclCommGetAsyncError and may call
     * ncclCommAbort while another thread is inside a collective), so its
     * weft comm keeps its lock whatever WEFT_THREADS says (docs/api.md). */
    if ((v = getenv("WEFT_THREADS")) != NULL && strcasecmp(v, "multiple") != 0)
        note("WEFT_THREADS=%s ignored: an NCCL communicator may be called from several threads at once", v);
    (void)put("WEFT_THREADS", "multiple");

    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        int known = 0;
        if (strncmp(*e, "NCCL_", 5) != 0)
            continue;
        for (size_t i = 0; i < sizeof(mapped) / sizeof(mapped[0]) && !known; i++)
            known = strlen(mapped[i]) == n && strncmp(mapped[i], *e, n) == 0;
        if (!known)
            note("%.*s=%s ignored (no weft equivalent)", (int)n, *e, eq ? eq + 1 : "");
    }
}

static void print_notes(void)
{
    if (g_level >= NCCLW_LOG_VERSION) {
        char host[64] = "?";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        fprintf(stdout, "%s:%d:%ld [-1] NCCL INFO NCCL version %d.%d.%d+weft%d.%d.%d (libnccl.so.2 of weft)\n", host,
                (int)getpid(), (long)syscall(SYS_gettid), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, WEFT_VERSION_MAJOR,
                WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
        fflush(stdout);
    }
    for (int i = 0; i < g_nnotes; i++)
        nccl_log(NCCLW_LOG_INFO, -1, "%s", g_notes[i]);
}

static void once(void)
{
    apply_once();
}

void nccl_env_apply(void)
{
    static pthread_once_t print_once = PTHREAD_ONCE_INIT;
    pthread_once(&g_once, once);
    pthread_once(&print_once, print_notes);
}

/* Deprecated in NCCL (declared by its header, so exported here too):
 * NCCL_DEBUG is read again, e.g. after the application changed it. The
 * WEFT_* mapping is not redone: comms made since kept what they read. */
NCCL_API(void, ncclResetDebugInit, void)
{
    nccl_env_apply();
    __atomic_store_n(&g_level, parse_level(getenv("NCCL_DEBUG")), __ATOMIC_RELAXED);
}
