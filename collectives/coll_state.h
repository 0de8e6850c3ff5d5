/*
 * The collectives' per-comm memory (c->coll_state), released by the comm's
 * destroy through c->coll_state_free.
 */
#ifndef WEFT_COLL_STATE_H
#define WEFT_COLL_STATE_H

#include <stddef.h>
#include "coll.h"

struct coll_shape { size_t bytes; int algo; };

struct coll_state {
    int                topo_ready;
    struct coll_topo   topo;
    /* Allgather shapes (bytes per rank -> algorithm) already logged at
     * WEFT_DEBUG=info, so each is logged once. Kept only at info level. */
    struct coll_shape *shapes;
    size_t             nshapes, cap_shapes;
};

#endif
