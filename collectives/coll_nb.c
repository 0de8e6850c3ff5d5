/* Non-blocking collectives (in progress). */
#include "coll_impl.h"
#include "core.h"
#include "log.h"
#include "weft.h"

int coll_nb_slot_free(struct weft_coll *cc, uint32_t seq)
{
    (void)cc; (void)seq;
    return WEFT_SUCCESS;
}

int weft_coll_istart(struct weft_coll *cc, const struct weft_coll_args *a, weft_request_t **req)
{
    (void)a; (void)req;
    return weft_set_error(cc->core, WEFT_ERR_UNSUPPORTED, "non-blocking collectives: not built yet");
}
