/*
 * MPI datatypes as weft sees them: bytes.
 *
 * weft moves contiguous bytes. count elements of a type whose extent
 * equals its size and whose true extent equals its size have no holes:
 * they are one run starting at buf + true lower bound, handed to weft as
 * they are. Anything else (vector, indexed, struct with gaps, resized) is
 * packed by MPI into a contiguous buffer of exactly the type signature's
 * bytes, moved, and unpacked through the type map -- a local copy on each
 * side, as MPI's own collectives do for such types. Ranks may describe the
 * same bytes with different types (the signatures match): each rank packs
 * or not on its own, the bytes on the wire are the same.
 *
 * Reductions are served only for predefined types weft reduces and
 * predefined ops weft has (weft.h); everything else is MPI's (colls.c).
 */
#include <stdint.h>
#include <stdlib.h>

#include "weft_mpi.h"

/* The predefined types programs pass most, with what the calls below
 * would ask MPI about them (3-4 queries, ~30 ns a call), asked once at
 * set-up (wmpi_types_init): their size, whether count of them are one
 * contiguous run, and the weft type they reduce as (-1: none). Predefined
 * handles never change or go away, so the answers hold for the run. */
struct known_type {
    MPI_Datatype type;
    size_t       size;
    int          contiguous;
    int          reduce_as;
};
static struct known_type known[24];
static int nknown;

static const struct known_type *known_type(MPI_Datatype t)
{
    for (int i = 0; i < nknown; i++)
        if (known[i].type == t)
            return &known[i];
    return NULL;
}

static int reduce_type_asked(MPI_Datatype t, weft_dtype_t *out);

void wmpi_types_init(void)
{
    /* The order is the lookup's: the commonest first. */
    const MPI_Datatype common[] = {
        MPI_FLOAT, MPI_DOUBLE, MPI_INT, MPI_BYTE, MPI_CHAR, MPI_LONG, MPI_UNSIGNED_LONG, MPI_LONG_LONG,
        MPI_UNSIGNED, MPI_UNSIGNED_CHAR, MPI_SIGNED_CHAR, MPI_SHORT, MPI_UNSIGNED_SHORT, MPI_UNSIGNED_LONG_LONG,
        MPI_INT8_T, MPI_UINT8_T, MPI_INT32_T, MPI_UINT32_T, MPI_INT64_T, MPI_UINT64_T,
    };
    _Static_assert(sizeof(common) / sizeof(common[0]) <= sizeof(known) / sizeof(known[0]), "room for each");
    nknown = 0;
    for (size_t i = 0; i < sizeof(common) / sizeof(common[0]); i++) {
        MPI_Datatype t = common[i];
        MPI_Count size = 0, lb = 0, extent = 0, tlb = 0, textent = 0;
        weft_dtype_t dt;
        if (t == MPI_DATATYPE_NULL || known_type(t) != NULL || PMPI_Type_size_x(t, &size) != MPI_SUCCESS ||
            size <= 0 || PMPI_Type_get_extent_x(t, &lb, &extent) != MPI_SUCCESS ||
            PMPI_Type_get_true_extent_x(t, &tlb, &textent) != MPI_SUCCESS)
            continue;
        known[nknown].type = t;
        known[nknown].size = (size_t)size;
        known[nknown].contiguous = lb == 0 && tlb == 0 && extent == size && textent == size;
        known[nknown].reduce_as = reduce_type_asked(t, &dt) ? (int)dt : -1;
        nknown++;
    }
}

int wmpi_type_bytes(MPI_Datatype type, long long count, size_t *bytes)
{
    MPI_Count size = 0;
    const struct known_type *k = known_type(type);

    if (k != NULL && count >= 0) {
        if (count > 0 && k->size > SIZE_MAX / (uint64_t)count)
            return -1;
        *bytes = k->size * (size_t)count;
        return 0;
    }
    if (count < 0 || type == MPI_DATATYPE_NULL || PMPI_Type_size_x(type, &size) != MPI_SUCCESS ||
        size == MPI_UNDEFINED || size < 0)
        return -1;
    if (count > 0 && (uint64_t)size > SIZE_MAX / (uint64_t)count)
        return -1;
    *bytes = (size_t)size * (size_t)count;
    return 0;
}

int wmpi_layout(const void *buf, long long count, MPI_Datatype type, const void **start, size_t *bytes)
{
    MPI_Count size = 0, lb = 0, extent = 0, tlb = 0, textent = 0;
    const struct known_type *k = known_type(type);

    if (k != NULL && k->contiguous && count >= 0) {
        if (count > 0 && k->size > SIZE_MAX / (uint64_t)count)
            return 0;
        *bytes = k->size * (size_t)count;
        *start = buf;
        return 1;
    }
    if (wmpi_type_bytes(type, count, bytes) != 0)
        return 0;
    if (PMPI_Type_size_x(type, &size) != MPI_SUCCESS || PMPI_Type_get_extent_x(type, &lb, &extent) != MPI_SUCCESS ||
        PMPI_Type_get_true_extent_x(type, &tlb, &textent) != MPI_SUCCESS)
        return 0;
    /* One element has no holes (true extent == size) and the next one
     * starts right after it (extent == size). */
    if (count > 1 && extent != size)
        return 0;
    if (size > 0 && textent != size)
        return 0;
    *start = (const char *)buf + tlb;
    return 1;
}

int wmpi_pack(const void *buf, int count, MPI_Datatype type, MPI_Comm comm, void **out, size_t *bytes)
{
    size_t n;
    int room = 0, pos = 0, rc;
    void *p;

    if (wmpi_type_bytes(type, count, &n) != 0)
        return MPI_ERR_TYPE;
    if ((rc = PMPI_Pack_size(count, type, comm, &room)) != MPI_SUCCESS)
        return rc;
    if ((size_t)room < n)
        return MPI_ERR_INTERN;
    if ((p = malloc(room > 0 ? (size_t)room : 1)) == NULL)
        return MPI_ERR_NO_MEM;
    if ((rc = PMPI_Pack(buf, count, type, p, room, &pos, comm)) != MPI_SUCCESS) {
        free(p);
        return rc;
    }
    /* Native packing of a homogeneous job is the signature's bytes; any
     * other size would not line up with what the peers send. */
    if ((size_t)pos != n) {
        free(p);
        return MPI_ERR_INTERN;
    }
    *out = p;
    *bytes = n;
    return MPI_SUCCESS;
}

int wmpi_unpack(const void *packed, size_t bytes, void *buf, int count, MPI_Datatype type, MPI_Comm comm)
{
    int pos = 0;

    if (bytes > INT32_MAX)
        return MPI_ERR_COUNT;
    return PMPI_Unpack(packed, (int)bytes, &pos, buf, count, type, comm);
}

/* Fortran types that C code passes too (libraries written in C for Fortran
 * users, e.g. the BLACS, sum MPI_INTEGER): by the size this MPI gives them
 * (0 when it was built without Fortran). */
static int fortran_type(MPI_Datatype t, weft_dtype_t *out)
{
    int size = 0, is_int;

    if (t == MPI_INTEGER || t == MPI_INTEGER4 || t == MPI_INTEGER8)
        is_int = 1;
    else if (t == MPI_REAL || t == MPI_DOUBLE_PRECISION || t == MPI_REAL4 || t == MPI_REAL8)
        is_int = 0;
    else
        return 0;
    if (PMPI_Type_size(t, &size) != MPI_SUCCESS)
        return 0;
    if (is_int && (size == 4 || size == 8))
        *out = size == 4 ? WEFT_INT32 : WEFT_INT64;
    else if (!is_int && (size == 4 || size == 8))
        *out = size == 4 ? WEFT_FLOAT32 : WEFT_FLOAT64;
    else
        return 0;
    return 1;
}

int wmpi_reduce_type(MPI_Datatype t, weft_dtype_t *out)
{
    const struct known_type *k = known_type(t);

    if (k == NULL)
        return reduce_type_asked(t, out);
    if (k->reduce_as < 0)
        return 0;
    *out = (weft_dtype_t)k->reduce_as;
    return 1;
}

/* The same, asking MPI. */
static int reduce_type_asked(MPI_Datatype t, weft_dtype_t *out)
{
    int ni, na, nd, combiner;

    if (t == MPI_DATATYPE_NULL || PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner) != MPI_SUCCESS ||
        combiner != MPI_COMBINER_NAMED)
        return 0;
    /* By size, for the C integer types whose width the platform picks. */
    if (t == MPI_INT8_T || t == MPI_SIGNED_CHAR)
        *out = WEFT_INT8;
    else if (t == MPI_UINT8_T || t == MPI_UNSIGNED_CHAR)
        *out = WEFT_UINT8;
    else if (t == MPI_INT32_T || (t == MPI_INT && sizeof(int) == 4) || (t == MPI_LONG && sizeof(long) == 4))
        *out = WEFT_INT32;
    else if (t == MPI_UINT32_T || (t == MPI_UNSIGNED && sizeof(unsigned) == 4) ||
             (t == MPI_UNSIGNED_LONG && sizeof(unsigned long) == 4))
        *out = WEFT_UINT32;
    else if (t == MPI_INT64_T || t == MPI_LONG_LONG_INT || t == MPI_LONG_LONG ||
             (t == MPI_LONG && sizeof(long) == 8) || (t == MPI_AINT && sizeof(MPI_Aint) == 8) ||
             (t == MPI_OFFSET && sizeof(MPI_Offset) == 8) || (t == MPI_COUNT && sizeof(MPI_Count) == 8))
        *out = WEFT_INT64;
    else if (t == MPI_UINT64_T || t == MPI_UNSIGNED_LONG_LONG ||
             (t == MPI_UNSIGNED_LONG && sizeof(unsigned long) == 8))
        *out = WEFT_UINT64;
    else if (t == MPI_FLOAT)
        *out = WEFT_FLOAT32;
    else if (t == MPI_DOUBLE)
        *out = WEFT_FLOAT64;
    else
        return fortran_type(t, out);
    return 1;
}

int wmpi_reduce_op(MPI_Op op, weft_op_t *out)
{
    if (op == MPI_SUM)
        *out = WEFT_SUM;
    else if (op == MPI_PROD)
        *out = WEFT_PROD;
    else if (op == MPI_MIN)
        *out = WEFT_MIN;
    else if (op == MPI_MAX)
        *out = WEFT_MAX;
    else
        return 0;
    return 1;
}
