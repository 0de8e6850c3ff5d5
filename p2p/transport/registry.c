/*
 * The registry: every transport of the build, in priority order. Adding a
 * transport is its folder plus one line in WEFT_TRANSPORT_TABLE.
 */
#include "registry.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Carriers first to last as they are preferred (self for the rank itself,
 * shm inside a node, ib across nodes, tcp anywhere), then movers. */
#define WEFT_TRANSPORT_TABLE(X) \
    X(self)                     \
    X(shm)                      \
    X(ib)                       \
    X(tcp)                      \
    X(cuda_ipc)

#define WEFT_DECLARE(name) extern const struct weft_transport weft_transport_##name;
WEFT_TRANSPORT_TABLE(WEFT_DECLARE)
#define WEFT_ENTRY(name) &weft_transport_##name,
static const struct weft_transport *const registry[] = { WEFT_TRANSPORT_TABLE(WEFT_ENTRY) };
#define REGISTRY_N ((int)(sizeof(registry) / sizeof(registry[0])))
_Static_assert(REGISTRY_N <= 16, "transports_mask and struct weft_p2p hold 16 entries");

int weft_registry_count(void) { return REGISTRY_N; }

const struct weft_transport *weft_registry_get(int i)
{
    return i >= 0 && i < REGISTRY_N ? registry[i] : NULL;
}

unsigned weft_registry_mask_all(void)
{
    return (1u << REGISTRY_N) - 1;
}

static unsigned movers_mask(void)
{
    unsigned m = 0;
    for (int i = 0; i < REGISTRY_N; i++)
        if (!registry[i]->ctrl)
            m |= 1u << i;
    return m;
}

int weft_registry_mask(const char *names, unsigned *mask, char *why, size_t whylen)
{
    unsigned m = movers_mask();
    const char *p = names;

    for (int i = 0; i < REGISTRY_N; i++)
        if (registry[i]->scope == WEFT_TP_SCOPE_SELF)
            m |= 1u << i;   /* a rank always reaches itself */
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < REGISTRY_N && !found; i++) {
            if (registry[i]->ctrl && strlen(registry[i]->name) == n && strncasecmp(p, registry[i]->name, n) == 0) {
                m |= 1u << i;
                found = 1;
            }
        }
        if (!found) {
            char have[128] = "";
            for (int i = 0; i < REGISTRY_N; i++)
                if (registry[i]->ctrl)
                    snprintf(have + strlen(have), sizeof(have) - strlen(have), "%s%s", have[0] ? ", " : "",
                             registry[i]->name);
            snprintf(why, whylen, "unknown transport '%.*s' (this build has %s)", (int)(n < 32 ? n : 32), p, have);
            return -1;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    *mask = m;
    return 0;
}

size_t weft_registry_card_layout(size_t *blob_off)
{
    size_t off = (sizeof(struct weft_card_hdr) + 7) & ~(size_t)7;
    for (int i = 0; i < REGISTRY_N; i++) {
        blob_off[i] = off;
        off += (registry[i]->card_bytes + 7) & ~(size_t)7;
    }
    return off;
}
