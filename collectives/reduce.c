/* STUB: replaced by the reduce algorithms (issue 11, in progress). */
#include "coll_impl.h"
#include "core.h"
#include "log.h"
#include "weft.h"

int coll_reduce_start(struct weft_coll *cc, const struct weft_coll_args *a, weft_coll_tag_fn tag, uint32_t seq,
                    struct weft_coll_op **op)
{
    (void)a; (void)tag; (void)seq;
    *op = NULL;
    return weft_set_error(cc->core, WEFT_ERR_UNSUPPORTED, "reduce: not built yet");
}
