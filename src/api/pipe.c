/*
 * The public message-pipe calls: argument checks, then p2p/msgpipe/msgpipe.c
 * (which checks handles: a closed or unknown pipe is refused there).
 * A message's or allocation's shape is checked here, before anything is
 * queued, so a bad one corrupts nothing.
 */
#include "check.h"
#include "comm.h"
#include "log.h"
#include "msgpipe.h"

/* The comm a pipe belongs to, for errors; NULL: the handle is not live
 * (msgpipe.c says so). */
static struct weft_core *core_of(const weft_pipe_t *pipe)
{
    return pipe ? weft_msgpipe_core(pipe) : NULL;
}

int weft_pipe_open(weft_comm_t *c, int peer, int id, weft_pipe_t **pipe)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_pipe_open: comm is NULL");
    int rc = weft_check_live(c, "weft_pipe_open");
    if (rc != WEFT_SUCCESS)
        return rc;
    if (pipe == NULL)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "weft_pipe_open: pipe (the output) is NULL");
    if (peer < 0 || peer >= c->core.size)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "weft_pipe_open: peer %d is not a rank of this comm of "
                              "%d ranks", peer, c->core.size);
    if (id < 0 || id >= WEFT_PIPE_ID_MAX)
        return weft_set_error(&c->core, WEFT_ERR_INVALID_ARG, "weft_pipe_open: id %d is outside [0, %d)", id,
                              WEFT_PIPE_ID_MAX);
    return weft_msgpipe_open(c->pipes, peer, id, pipe);
}

/* One buffer of a message: data NULL only when empty, metadata NULL only
 * when it has none. */
static int check_buffer(struct weft_core *core, const char *what, size_t i, const void *data, size_t bytes,
                        const void *meta, size_t meta_bytes)
{
    if (data == NULL && bytes > 0)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: %s %zu has data NULL with %zu bytes", what,
                              i, bytes);
    if (meta == NULL && meta_bytes > 0)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: %s %zu has metadata NULL with %zu bytes",
                              what, i, meta_bytes);
    return WEFT_SUCCESS;
}

int weft_pipe_write(weft_pipe_t *pipe, const weft_pipe_message_t *msg, weft_pipe_cb_t cb, void *arg)
{
    struct weft_core *core = core_of(pipe);
    int rc;

    if (core == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_pipe_write: the pipe handle is %s",
                              pipe ? "unknown or was closed" : "NULL");
    if (msg == NULL)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: msg is NULL");
    if (msg->metadata == NULL && msg->metadata_bytes > 0)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: metadata NULL with %zu bytes",
                              msg->metadata_bytes);
    if ((msg->payloads == NULL && msg->num_payloads > 0) || (msg->tensors == NULL && msg->num_tensors > 0))
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: %s NULL with a count of %zu",
                              msg->payloads == NULL && msg->num_payloads > 0 ? "payloads" : "tensors",
                              msg->payloads == NULL && msg->num_payloads > 0 ? msg->num_payloads : msg->num_tensors);
    for (size_t i = 0; i < msg->num_payloads; i++) {
        const weft_pipe_payload_t *b = &msg->payloads[i];
        if ((rc = check_buffer(core, "payload", i, b->data, b->bytes, b->metadata, b->metadata_bytes)) != WEFT_SUCCESS)
            return rc;
    }
    for (size_t i = 0; i < msg->num_tensors; i++) {
        const weft_pipe_tensor_t *t = &msg->tensors[i];
        if ((rc = check_buffer(core, "tensor", i, t->data, t->bytes, t->metadata, t->metadata_bytes)) != WEFT_SUCCESS)
            return rc;
        if (t->device < WEFT_PIPE_HOST || t->target_device < WEFT_PIPE_ANY)
            return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_write: tensor %zu has device %d and target "
                                  "device %d (WEFT_PIPE_HOST = -1, WEFT_PIPE_ANY = -2, or a CUDA device >= 0)", i,
                                  t->device, t->target_device);
    }
    return weft_msgpipe_write(pipe, msg, cb, arg);
}

int weft_pipe_read_descriptor(weft_pipe_t *pipe, weft_pipe_descriptor_cb_t cb, void *arg)
{
    struct weft_core *core = core_of(pipe);
    if (core == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_pipe_read_descriptor: the pipe handle is %s",
                              pipe ? "unknown or was closed" : "NULL");
    if (cb == NULL)
        return weft_set_error(core, WEFT_ERR_INVALID_ARG, "weft_pipe_read_descriptor: cb is NULL (the descriptor "
                              "would have nowhere to go)");
    return weft_msgpipe_read_descriptor(pipe, cb, arg);
}

int weft_pipe_read(weft_pipe_t *pipe, const weft_pipe_allocation_t *alloc, weft_pipe_cb_t cb, void *arg)
{
    struct weft_core *core = core_of(pipe);
    if (core == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_pipe_read: the pipe handle is %s",
                              pipe ? "unknown or was closed" : "NULL");
    /* A missing allocation fails the read of the next message like a wrong
     * one does (weft.h): reading is what was asked, and it cannot be done. */
    static const weft_pipe_allocation_t none = { 0, NULL, 0, NULL };
    if (alloc == NULL)
        alloc = &none;   /* counts 0: refused by the descriptor check unless the message is empty */
    return weft_msgpipe_read(pipe, alloc, cb, arg);
}

int weft_pipe_close(weft_pipe_t *pipe)
{
    if (pipe == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_pipe_close: pipe is NULL");
    return weft_msgpipe_close(pipe);
}

int weft_pipe_peer(const weft_pipe_t *pipe)
{
    int peer, id;
    return pipe && weft_msgpipe_info(pipe, &peer, &id) == 0 ? peer : -1;
}

int weft_pipe_id(const weft_pipe_t *pipe)
{
    int peer, id;
    return pipe && weft_msgpipe_info(pipe, &peer, &id) == 0 ? id : -1;
}

int weft_progress(weft_comm_t *c)
{
    if (c == NULL)
        return weft_set_error(NULL, WEFT_ERR_INVALID_ARG, "weft_progress: comm is NULL");
    /* On a revoked comm it still runs: the pipes' pending operations end
     * there (WEFT_ERR_REVOKED), and their callbacks run only here. */
    if (__atomic_load_n(&c->core.aborted, __ATOMIC_ACQUIRE))
        return weft_check_aborted_fail(c, "weft_progress");
    return weft_msgpipes_progress(c->pipes);
}
