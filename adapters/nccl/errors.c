/*
 * Result codes and last errors of the NCCL face, and the calls weft does
 * not implement. A failing call records its text here once, where the
 * failure is decided; ncclGetLastError returns this thread's (NCCL ignores
 * the comm argument too).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nccl_adapter.h"

static __thread char t_last[1024];

static void record(const char *text)
{
    snprintf(t_last, sizeof(t_last), "%s", text);
    nccl_log(NCCLW_LOG_WARN, -1, "%s", t_last);
}

ncclResult_t nccl_fail(const struct ncclComm *c, ncclResult_t rc, const char *fn, const char *fmt, ...)
{
    char msg[768], text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c != NULL && c->state != COMM_INITING && c->nranks > 0)
        snprintf(text, sizeof(text), "%s: rank %d of %d: %s", fn, c->rank, c->nranks, msg);
    else
        snprintf(text, sizeof(text), "%s: %s", fn, msg);
    record(text);
    return rc;
}

ncclResult_t nccl_code_of_weft(int err)
{
    switch (err) {
    case WEFT_SUCCESS:          return ncclSuccess;
    case WEFT_ERR_INVALID_ARG:  return ncclInvalidArgument;
    case WEFT_ERR_TRUNCATE:     return ncclInvalidUsage;
    case WEFT_ERR_NO_MEMORY:    return ncclSystemError;
    case WEFT_ERR_UNSUPPORTED:  return ncclInvalidUsage;
    case WEFT_ERR_TRANSPORT:    return ncclRemoteError;
    case WEFT_ERR_TIMEOUT:      return ncclRemoteError;
    case WEFT_ERR_MPI:          return ncclSystemError;
    case WEFT_ERR_MISMATCH:     return ncclInvalidUsage;
    case WEFT_ERR_ABORTED:      return ncclRemoteError;
    case WEFT_ERR_REVOKED:      return ncclRemoteError;
    default:                    return ncclInternalError;   /* INTERNAL, CLOSED, unknown */
    }
}

ncclResult_t nccl_from_weft(const struct ncclComm *c, int err, const char *fn)
{
    char text[1024];
    const char *why = c != NULL && c->w != NULL ? weft_comm_last_error(c->w) : weft_last_error();
    /* weft's text already names the rank (and the peer) and ends with the
     * code's meaning. */
    if (why == NULL || why[0] == '\0')
        snprintf(text, sizeof(text), "%s: %s", fn, weft_strerror(err));
    else
        snprintf(text, sizeof(text), "%s: %s", fn, why);
    record(text);
    return nccl_code_of_weft(err);
}

ncclResult_t nccl_refuse(const char *fn, const char *what)
{
    return nccl_fail(NULL, ncclInvalidUsage, fn, "not implemented by weft's NCCL library (%s)%s%s", nccl_version_text(),
                     what && *what ? ": " : "", what ? what : "");
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:            return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:      return "internal error - please report this issue to the weft developers";
    case ncclInvalidArgument:    return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:       return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:        return "remote process exited or there was a network error";
    case ncclInProgress:         return "NCCL operation in progress";
    default:                     return "unknown result code";
    }
}

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm)
{
    (void)comm;
    return t_last;
}

/* ---- calls weft refuses: the documented code and text, nothing touched ---- */

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
         int winFlags)
{
    (void)comm; (void)buff; (void)size; (void)win; (void)winFlags;
    return nccl_refuse("ncclCommWindowRegister", "symmetric memory windows");
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win)
{
    (void)comm; (void)win;
    return nccl_refuse("ncclCommWindowDeregister", "symmetric memory windows");
}

NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo)
{
    (void)simInfo;
    return nccl_refuse("ncclGroupSimulateEnd", "the group stays open; end it with ncclGroupEnd");
}
