/*
 * The transports of this build, in priority order: for each pair of ranks
 * the first carrier whose reach() accepts the pair carries its pipe, and
 * the first mover that reaches it moves its device data (transport.h).
 */
#ifndef WEFT_REGISTRY_H
#define WEFT_REGISTRY_H

#include <stddef.h>
#include "transport.h"

/* Number of entries, and entry i (NULL when out of range). */
int weft_registry_count(void);
const struct weft_transport *weft_registry_get(int i);

/* "shm,tcp" (case-insensitive carrier names; "self" is always added) ->
 * bit mask of registry indices; movers are not named by WEFT_TRANSPORTS and
 * always allowed. 0 on success, else -1 with why ("unknown transport 'x'
 * (this build has self, shm, ib, tcp)"). */
int weft_registry_mask(const char *names, unsigned *mask, char *why, size_t whylen);
/* Every entry allowed. */
unsigned weft_registry_mask_all(void);

/* Byte offset of each entry's blob in a rank card and the card's size:
 * the header, then each blob 8-byte aligned, in registry order. */
size_t weft_registry_card_layout(size_t *blob_off);

#endif
