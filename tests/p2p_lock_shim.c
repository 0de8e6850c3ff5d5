/*
 * For test_engine.cc: holds and releases a p2p context's lock from the
 * test, as another thread of weft's would (context.h is C only).
 */
#include "p2p_lock_shim.h"

#include "context.h"

void test_p2p_hold_lock(struct weft_p2p *p)
{
    pthread_mutex_lock(&p->lock);
}

void test_p2p_release_lock(struct weft_p2p *p)
{
    pthread_mutex_unlock(&p->lock);
}
