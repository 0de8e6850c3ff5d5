/*
 * Linked into the test and benchmark programs of a WEFT_SANITIZE build only
 * (CMakeLists.txt): dlclose() that keeps the library mapped.
 *
 * Why: LeakSanitizer reports allocations that Open MPI, PMIx and hwloc make
 * in components they dlopen and keep until exit; scripts/lsan.supp suppresses
 * them by module name (mca_*, libpmix, ...). When the component has been
 * dlclose()d by exit its frames are "<unknown module>" and match nothing, and
 * the only way left to suppress them was the slow DWARF unwinder on every
 * malloc (fast_unwind_on_malloc=0) so that the stack reached libmpi: ~35% of
 * the sanitizer pass's time. With the modules mapped, the caller's module is
 * the first frame and the fast unwinder is enough.
 *
 * Returning 0 without unmapping is what dlclose() may do anyway (the loader
 * keeps a library that is still referenced); weft's code does not depend on
 * a library going away. Never part of libweft or an installed program.
 */
int dlclose(void *handle);

int dlclose(void *handle)
{
    (void)handle;
    return 0;
}
