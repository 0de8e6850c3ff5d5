/*
 * The transports of this build, by id.
 */
#include "transport.h"

const struct weft_transport *weft_transport_get(int id)
{
    switch (id) {
    case WEFT_TP_SELF: return &weft_transport_self;
    case WEFT_TP_SHM:  return &weft_transport_shm;
    case WEFT_TP_TCP:  return &weft_transport_tcp;
#ifdef WEFT_HAVE_VERBS_HEADERS
    case WEFT_TP_IB:   return &weft_transport_ib;
#endif
    default:           return NULL;
    }
}
