/*
 * The unique-id bootstrap (bootstrap_uid.c): weft_get_unique_id opens a
 * root listener and serves one meeting from a detached thread;
 * weft_comm_init's ranks meet there and relay the set-up exchange through it.
 */
#ifndef WEFT_BOOTSTRAP_UID_H
#define WEFT_BOOTSTRAP_UID_H

#include <stddef.h>

#include "comm.h"

/* weft_get_unique_id: listener + root thread; *id written only on success.
 * Errors are recorded with no comm (weft_last_error). */
int weft_uid_make(weft_unique_id_t *id, const struct weft_settings *settings);
/* 0 when id looks like one weft_uid_make wrote (magic, version, address
 * family, zero tail); otherwise WEFT_ERR_INVALID_ARG with the reason in why. */
int weft_uid_check(const weft_unique_id_t *id, char *why, size_t len);
/* weft_comm_init after its argument checks: collective over the nranks
 * processes given id. */
int weft_comm_init_uid(const weft_unique_id_t *id, int nranks, int rank, const struct weft_settings *settings,
                       struct weft_comm **out);

#endif
