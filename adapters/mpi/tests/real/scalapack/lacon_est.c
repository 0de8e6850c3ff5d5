/*
 * Preloaded into Debian 12's ScaLAPACK testers by run_scalapack.sh: the
 * fix of ScaLAPACK's own bug in P?LACON (Reference-ScaLAPACK issue #121,
 * fixed upstream by pull request #122, after the 2.2.1 Debian 12 ships).
 *
 * P?LACON, the 1-norm estimator behind the condition estimates (P?GECON,
 * P?POCON) and the iterative refinement (P?GERFS, P?PORFS), is called by
 * reverse communication: the caller calls it again and again with the same
 * arguments. 2.2.1 copies its output argument EST into its working
 * estimate on every entry, before EST was ever written, and later branches
 * on that estimate ("has the estimate stopped growing?"). EST is an
 * uninitialised local of the caller: each rank branches on whatever its
 * stack held, so the ranks of one grid may take different branches, call
 * different collectives, and the tester reports "On entry to PSGETRS
 * parameter number 1 had an illegal value" or hangs. valgrind shows the
 * read under plain Open MPI ("Conditional jump or move depends on
 * uninitialised value(s) at pslacon_ ... created by a stack allocation at
 * psgerfs_"), where xsllt and xdllt hang at np 4 without this file; the
 * stack a preloaded library leaves behind changes what is read, which is
 * how it showed first under the weft drop-in (docs/mpi.md).
 *
 * Upstream's fix sets EST to zero on every entry; doing that before
 * calling the real routine is the same thing. ScaLAPACK calls P?LACON
 * through the PLT, so this definition is the one its callers reach.
 * The Fortran interfaces (every argument by reference):
 *   PSLACON/PDLACON(N, V, IV, JV, DESCV, X, IX, JX, DESCX, ISGN, EST, KASE)
 *   PCLACON/PZLACON(N, V, IV, JV, DESCV, X, IX, JX, DESCX, EST, KASE)
 * with EST REAL (S, C) or DOUBLE PRECISION (D, Z).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*lacon12_fn)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                           void *, void *);
typedef void (*lacon11_fn)(void *, void *, void *, void *, void *, void *, void *, void *, void *, void *,
                           void *);

/* The next definition of name (ScaLAPACK's); none is a broken install. */
static void *real_routine(const char *name)
{
    void *sym = dlsym(RTLD_NEXT, name);
    if (sym == NULL) {
        fprintf(stderr, "lacon_est: %s not found after this library (%s)\n", name, dlerror());
        abort();
    }
    return sym;
}

#define LACON12(name, est_type)                                                                             \
    void name(void *n, void *v, void *iv, void *jv, void *descv, void *x, void *ix, void *jx, void *descx,   \
              void *isgn, void *est, void *kase);                                                            \
    void name(void *n, void *v, void *iv, void *jv, void *descv, void *x, void *ix, void *jx, void *descx,   \
              void *isgn, void *est, void *kase)                                                             \
    {                                                                                                       \
        static lacon12_fn real;                                                                             \
        if (real == NULL) {                                                                                 \
            void *sym = real_routine(#name);                                                                \
            memcpy(&real, &sym, sizeof(real));                                                              \
        }                                                                                                   \
        *(est_type *)est = 0;                                                                               \
        real(n, v, iv, jv, descv, x, ix, jx, descx, isgn, est, kase);                                       \
    }

#define LACON11(name, est_type)                                                                             \
    void name(void *n, void *v, void *iv, void *jv, void *descv, void *x, void *ix, void *jx, void *descx,   \
              void *est, void *kase);                                                                        \
    void name(void *n, void *v, void *iv, void *jv, void *descv, void *x, void *ix, void *jx, void *descx,   \
              void *est, void *kase)                                                                         \
    {                                                                                                       \
        static lacon11_fn real;                                                                             \
        if (real == NULL) {                                                                                 \
            void *sym = real_routine(#name);                                                                \
            memcpy(&real, &sym, sizeof(real));                                                              \
        }                                                                                                   \
        *(est_type *)est = 0;                                                                               \
        real(n, v, iv, jv, descv, x, ix, jx, descx, est, kase);                                             \
    }

LACON12(pslacon_, float)
LACON12(pdlacon_, double)
LACON11(pclacon_, float)
LACON11(pzlacon_, double)
