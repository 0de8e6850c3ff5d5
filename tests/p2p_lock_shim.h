#ifndef WEFT_TEST_P2P_LOCK_SHIM_H
#define WEFT_TEST_P2P_LOCK_SHIM_H

struct weft_p2p;

#ifdef __cplusplus
extern "C" {
#endif
/* The mutex itself, whatever WEFT_THREADS says (p2p/context.h). */
void test_p2p_hold_lock(struct weft_p2p *p);
void test_p2p_release_lock(struct weft_p2p *p);
#ifdef __cplusplus
}
#endif

#endif
