/*
 * Internal entry points for code inside the library (collectives): the same
 * as weft_isend/weft_irecv but tags may be negative. Negative tags are the
 * library's own lanes, so collective traffic never matches a user message.
 */
#ifndef WEFT_API_INTERNAL_H
#define WEFT_API_INTERNAL_H

#include "weft.h"

int weft_isend_internal(weft_comm_t *c, const void *buf, size_t bytes, int peer, int tag, weft_request_t **req);
int weft_irecv_internal(weft_comm_t *c, void *buf, size_t bytes, int peer, int tag, weft_request_t **req);

#endif
