/*
 * Device signal slots (see signals.h).
 */
#include "signals.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudawrap.h"
#include "devcopy.h"
#include "log.h"
#include "weft.h"

#ifdef WEFT_HAVE_CUDA_HEADERS

/* Events of weft's stream after host writes, in write order; a ring: the
 * oldest is waited for (weft's stream never waits on anything, so that is
 * bounded) before it is recorded again. */
#define SIG_EVENTS 64

enum { SLOT_FREE = 0, SLOT_TAKEN, SLOT_WRITTEN, SLOT_RETIRED };

struct weft_signals {
    pthread_mutex_t mu;
    void           *area;       /* device memory, WEFT_SIGNAL_AREA_BYTES */
    int             device;
    cudaIpcMemHandle_t handle;
    int             have_handle;
    uint32_t       *value;      /* [slots]: last value handed out per slot */
    uint8_t        *state;      /* [slots] */
    uint64_t       *wseq;       /* [slots]: SLOT_WRITTEN: the host write's number */
    uint32_t        next;       /* next slot to hand out (ring) */
    uint64_t        writes;     /* host writes so far (numbered from 1) */
    uint64_t        done;       /* every host write up to this one has executed */
    cudaEvent_t     ev[SIG_EVENTS];
    uint64_t        ev_seq[SIG_EVENTS];   /* the write each event follows (0: unused) */
};

static const struct weft_cuda *cu(void) { return weft_cuda_get(); }

static struct weft_signals *sig(struct weft_core *core) { return core ? core->signals : NULL; }

int weft_signals_init(struct weft_core *core, char *why, size_t whylen)
{
    const struct weft_cuda *c = cu();
    struct weft_signals *s;
    cudaError_t e;

    if (core->signals != NULL)
        return WEFT_SUCCESS;
    if (!core->cuda || c == NULL) {
        snprintf(why, whylen, "no CUDA in this comm");
        return WEFT_ERR_UNSUPPORTED;
    }
    s = calloc(1, sizeof(*s));
    if (s)
        s->value = calloc(WEFT_SIGNAL_SLOTS, sizeof(*s->value));
    if (s && s->value)
        s->state = calloc(WEFT_SIGNAL_SLOTS, sizeof(*s->state));
    if (s && s->state)
        s->wseq = calloc(WEFT_SIGNAL_SLOTS, sizeof(*s->wseq));
    if (s == NULL || s->wseq == NULL) {
        if (s) {
            free(s->value);
            free(s->state);
        }
        free(s);
        snprintf(why, whylen, "no memory for the signal slots");
        return WEFT_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&s->mu, NULL);
    if ((e = c->GetDevice(&s->device)) != cudaSuccess || (e = c->Malloc(&s->area, WEFT_SIGNAL_AREA_BYTES)) != cudaSuccess) {
        c->GetLastError();
        snprintf(why, whylen, "cudaMalloc of %u bytes of signal slots failed: %s", WEFT_SIGNAL_AREA_BYTES,
                 c->GetErrorString(e));
        goto fail;
    }
    /* Zeroed on the device and waited for (fresh device memory holds stale
     * data on a GPU; a pageable cudaMemcpy would return before landing). */
    e = c->MemsetAsync(s->area, 0, WEFT_SIGNAL_SLOTS * sizeof(uint32_t), NULL);
    if (e == cudaSuccess)
        e = c->StreamSynchronize(NULL);
    if (e == cudaSuccess)
        e = c->IpcGetMemHandle(&s->handle, s->area);
    if (e != cudaSuccess) {
        c->GetLastError();
        snprintf(why, whylen, "the signal slots could not be zeroed or exported: %s", c->GetErrorString(e));
        c->Free(s->area);
        c->GetLastError();
        goto fail;
    }
    s->have_handle = 1;
    core->signals = s;
    return WEFT_SUCCESS;
fail:
    pthread_mutex_destroy(&s->mu);
    free(s->value);
    free(s->state);
    free(s->wseq);
    free(s);
    return WEFT_ERR_TRANSPORT;
}

void weft_signals_fini(struct weft_core *core)
{
    const struct weft_cuda *c = cu();
    struct weft_signals *s = sig(core);
    if (s == NULL)
        return;
    for (int i = 0; i < SIG_EVENTS; i++)
        if (s->ev[i] && c->EventDestroy(s->ev[i]) != cudaSuccess)
            c->GetLastError();
    /* cudaFree waits for weft's stream's writes into it. */
    if (c->Free(s->area) != cudaSuccess)
        c->GetLastError();
    pthread_mutex_destroy(&s->mu);
    free(s->value);
    free(s->state);
    free(s->wseq);
    free(s);
    core->signals = NULL;
}

int weft_signals_export(struct weft_core *core, uintptr_t *base, int *device, void *handle)
{
    struct weft_signals *s = sig(core);
    if (s == NULL || !s->have_handle)
        return WEFT_ERR_UNSUPPORTED;
    *base = (uintptr_t)s->area;
    *device = s->device;
    memcpy(handle, &s->handle, sizeof(s->handle));
    return WEFT_SUCCESS;
}

int weft_signals_device(struct weft_core *core)
{
    struct weft_signals *s = sig(core);
    return s ? s->device : -1;
}

/* s->mu held. Advances s->done over the events that have passed, oldest
 * first (a later one passing implies the earlier ones did). */
static void writes_retire(struct weft_signals *s)
{
    const struct weft_cuda *c = cu();
    while (s->done < s->writes) {
        uint64_t w = s->done + 1;
        int i = -1;
        /* The first event after write w: the event of w itself, or later. */
        for (uint64_t k = w; k <= s->writes && i < 0; k++)
            if (s->ev_seq[k % SIG_EVENTS] == k)
                i = (int)(k % SIG_EVENTS);
        if (i < 0)
            return;
        cudaError_t e = c->EventQuery(s->ev[i]);
        if (e == cudaErrorNotReady)
            return;
        if (e != cudaSuccess)
            c->GetLastError();   /* a failed stream: the write is not coming */
        s->done = s->ev_seq[i];
    }
}

int weft_signals_take(struct weft_core *core, uint32_t *slot, uint32_t *value, uintptr_t *addr)
{
    struct weft_signals *s = sig(core);
    if (s == NULL)
        return -1;
    pthread_mutex_lock(&s->mu);
    uint32_t i = s->next;
    if (s->state[i] == SLOT_WRITTEN && s->wseq[i] > s->done)
        writes_retire(s);
    if (s->state[i] == SLOT_TAKEN || s->state[i] == SLOT_RETIRED ||
        (s->state[i] == SLOT_WRITTEN && s->wseq[i] > s->done)) {
        if (s->state[i] == SLOT_RETIRED)
            s->next = (i + 1) % WEFT_SIGNAL_SLOTS;   /* step over it */
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->next = (i + 1) % WEFT_SIGNAL_SLOTS;
    s->state[i] = SLOT_TAKEN;
    s->value[i]++;
    if (s->value[i] == 0)
        s->value[i] = 1;   /* 0 is "no signal" on the wire */
    *slot = i;
    *value = s->value[i];
    *addr = (uintptr_t)s->area + (uintptr_t)i * sizeof(uint32_t);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int weft_signals_complete(struct weft_core *core, uint32_t slot, uint32_t value, int peer_wrote)
{
    const struct weft_cuda *c = cu();
    struct weft_signals *s = sig(core);
    int rc = WEFT_SUCCESS;
    if (s == NULL || slot >= WEFT_SIGNAL_SLOTS)
        return WEFT_ERR_INTERNAL;
    pthread_mutex_lock(&s->mu);
    if (peer_wrote) {
        s->state[slot] = SLOT_FREE;
        pthread_mutex_unlock(&s->mu);
        return WEFT_SUCCESS;
    }
    CUstream st = (CUstream)weft_devcopy_stream(core);
    CUdeviceptr word = (CUdeviceptr)((uintptr_t)s->area + (uintptr_t)slot * sizeof(uint32_t));
    CUresult r = st ? c->cuStreamWriteValue32(st, word, value, 0) : CUDA_ERROR_INVALID_HANDLE;
    if (r != CUDA_SUCCESS) {
        const char *es = NULL;
        if (c->cuGetErrorString(r, &es) != CUDA_SUCCESS)
            es = NULL;
        rc = weft_set_error(core, WEFT_ERR_TRANSPORT, "stream-ordered receive: writing signal slot %u (value %u) "
                            "on weft's CUDA stream failed: %s; its stream stays blocked", slot, value,
                            es ? es : "unknown error");
        s->state[slot] = SLOT_FREE;   /* nothing will write it late */
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    /* An event after the write, so the slot is handed out again only once
     * it executed. The ring's oldest is waited for first if still pending:
     * weft's stream waits for nothing, so that is bounded. */
    uint64_t w = ++s->writes;
    int i = (int)(w % SIG_EVENTS);
    if (s->ev_seq[i] != 0 && s->ev_seq[i] > s->done) {
        if (c->EventSynchronize(s->ev[i]) != cudaSuccess)
            c->GetLastError();
        if (s->ev_seq[i] > s->done)
            s->done = s->ev_seq[i];
    }
    cudaError_t e = s->ev[i] ? cudaSuccess : c->EventCreateWithFlags(&s->ev[i], cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = c->EventRecord(s->ev[i], (cudaStream_t)st);
    if (e == cudaSuccess) {
        s->ev_seq[i] = w;
    } else {
        /* Without an event, wait for the write itself. */
        c->GetLastError();
        if (c->StreamSynchronize((cudaStream_t)st) != cudaSuccess)
            c->GetLastError();
        s->ev_seq[i] = 0;
        s->done = w;
    }
    s->state[slot] = SLOT_WRITTEN;
    s->wseq[slot] = w;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void weft_signals_drop(struct weft_core *core, uint32_t slot)
{
    struct weft_signals *s = sig(core);
    if (s == NULL || slot >= WEFT_SIGNAL_SLOTS)
        return;
    pthread_mutex_lock(&s->mu);
    s->state[slot] = SLOT_FREE;
    pthread_mutex_unlock(&s->mu);
}

void weft_signals_abandon(struct weft_core *core, uint32_t slot, uint32_t value)
{
    struct weft_signals *s = sig(core);
    if (s == NULL || slot >= WEFT_SIGNAL_SLOTS)
        return;
    (void)weft_signals_complete(core, slot, value, 0);
    pthread_mutex_lock(&s->mu);
    s->state[slot] = SLOT_RETIRED;
    pthread_mutex_unlock(&s->mu);
}

#else /* !WEFT_HAVE_CUDA_HEADERS */

int weft_signals_init(struct weft_core *core, char *why, size_t whylen)
{
    (void)core;
    snprintf(why, whylen, "weft was built without CUDA");
    return WEFT_ERR_UNSUPPORTED;
}
void weft_signals_fini(struct weft_core *core) { (void)core; }
int  weft_signals_export(struct weft_core *core, uintptr_t *base, int *device, void *handle)
{
    (void)core; (void)base; (void)device; (void)handle;
    return WEFT_ERR_UNSUPPORTED;
}
int  weft_signals_device(struct weft_core *core) { (void)core; return -1; }
int  weft_signals_take(struct weft_core *core, uint32_t *slot, uint32_t *value, uintptr_t *addr)
{
    (void)core; (void)slot; (void)value; (void)addr;
    return -1;
}
int  weft_signals_complete(struct weft_core *core, uint32_t slot, uint32_t value, int peer_wrote)
{
    (void)core; (void)slot; (void)value; (void)peer_wrote;
    return WEFT_ERR_INTERNAL;
}
void weft_signals_drop(struct weft_core *core, uint32_t slot) { (void)core; (void)slot; }
void weft_signals_abandon(struct weft_core *core, uint32_t slot, uint32_t value)
{
    (void)core; (void)slot; (void)value;
}

#endif
