/*
 * Allgather algorithms. Each function gets validated arguments (see coll.h):
 * bytes > 0, more than one rank, sendbuf in place (== recvbuf + rank*bytes)
 * or not overlapping recvbuf. Block b of recvbuf is rank b's data:
 * recvbuf + b*bytes. All offsets are size_t, so totals above 4 GiB work.
 */
#include <stdlib.h>
#include <string.h>
#include "coll.h"
#include "comm.h"
#include "devcopy.h"
#include "log.h"

static int coll_nomem(struct coll_op *op, size_t what_bytes)
{
    return weft_set_error(op->c, WEFT_ERR_NO_MEMORY, "%s: no memory for %zu bytes of scratch",
                          op->what, what_bytes);
}

/* Copies this rank's block into place unless the call is in place (host or
 * device memory, src/devcopy.c). */
static int copy_own_block(const struct coll_op *op, const void *sendbuf, char *recvbuf, int rank, size_t bytes)
{
    char *dst = recvbuf + (size_t)rank * bytes;
    if ((const char *)sendbuf != dst)
        return weft_devcopy(op->c, dst, sendbuf, bytes, op->what);
    return WEFT_SUCCESS;
}

/*
 * Generic pipelined ring (see coll.h). m members in a circle; at step s
 * (1..m-1) member p receives from its left neighbour the data that started
 * at member p-s and passes it on to the right, except the data of p+1, which
 * has then gone all the way round. Every contribution is cut into chunks, and
 * a chunk is forwarded as soon as it arrived, so sending chunk k while
 * receiving chunk k+1 keeps both links of a member busy:
 *
 *     member:     0        1        2        3
 *     step 1:   [0]---->  [1]---->  [2]---->  [3]----> (to 0)
 *     step 2:   [3]---->  [0]---->  [1]---->  [2]---->
 *     step 3:   [2]---->  [3]---->  [0]---->  [1]---->
 *               (block [x] = data of member x; chunk c of a block is
 *                forwarded while chunk c+1 of the same block arrives)
 *
 * Every receive is posted before the first send, straight into its final
 * place in buf, so the sender's rendezvous finds its receive waiting and no
 * data is copied twice.
 */
int coll_ring(const struct coll_op *op, int phase, const int *members, int m, int my_pos,
              const struct coll_seg *segs, const int *seg_first, char *buf,
              const void *own_src, int full_pos, size_t chunk)
{
    int left = members[(my_pos + m - 1) % m];
    int right = members[(my_pos + 1) % m];
    int last_pos = (my_pos + 1) % m;   /* its data is received last and not forwarded */
    int i_am_full = (my_pos == full_pos);
    int right_is_full = (last_pos == full_pos);
    size_t nchunks = 0, nsend = 0;
    int rc;

    for (int p = 0; p < m; p++) {
        size_t k = 0;
        for (int s = seg_first[p]; s < seg_first[p + 1]; s++)
            k += (segs[s].len + chunk - 1) / chunk;
        if (p != my_pos)
            nchunks += k;
        if (p != last_pos && !right_is_full)
            nsend += k;
    }
    size_t nrecv = i_am_full ? 0 : nchunks;

    struct ring_chunk { char *ptr; size_t len; int step; int fwd; } *list = NULL;
    struct coll_reqs recvs, sends;
    recvs.n = sends.n = 0;
    if ((rc = coll_reqs_init(op, &recvs, nrecv)) != WEFT_SUCCESS)
        return rc;
    if ((rc = coll_reqs_init(op, &sends, nsend)) != WEFT_SUCCESS)
        goto out_recvs;
    if (nchunks > 0 && !(list = malloc(nchunks * sizeof *list))) {
        rc = weft_set_error(op->c, WEFT_ERR_NO_MEMORY, "%s: no memory for %zu chunk records",
                            op->what, nchunks);
        goto out_sends;
    }

    /* The chunks that reach us, in the order the left neighbour sends them;
     * every receive is posted now. */
    size_t i = 0;
    for (int step = 1; step < m; step++) {
        int p = (my_pos - step + m) % m;
        for (int s = seg_first[p]; s < seg_first[p + 1]; s++) {
            for (size_t off = 0; off < segs[s].len; off += chunk) {
                size_t len = segs[s].len - off < chunk ? segs[s].len - off : chunk;
                list[i].ptr = buf + segs[s].off + off;
                list[i].len = len;
                list[i].step = step;
                list[i].fwd = (p != last_pos) && !right_is_full;
                i++;
                if (i_am_full)
                    continue;
                weft_request_t *r;
                rc = coll_irecv(op, step, buf + segs[s].off + off, len, left, phase, &r);
                if (rc != WEFT_SUCCESS)
                    goto out_drain;
                coll_reqs_add(&recvs, r, left);
            }
        }
    }

    /* Our own contribution goes out first (from own_src when not in place). */
    for (int s = seg_first[my_pos]; s < seg_first[my_pos + 1] && !right_is_full; s++) {
        const char *src = own_src ? (const char *)own_src : buf + segs[s].off;
        for (size_t off = 0; off < segs[s].len; off += chunk) {
            size_t len = segs[s].len - off < chunk ? segs[s].len - off : chunk;
            weft_request_t *r;
            rc = coll_isend(op, 0, src + off, len, right, phase, &r);
            if (rc != WEFT_SUCCESS)
                goto out_drain;
            coll_reqs_add(&sends, r, right);
        }
    }
    if (own_src) {
        const struct coll_seg *own = &segs[seg_first[my_pos]];
        if ((const char *)own_src != buf + own->off &&
            (rc = weft_devcopy(op->c, buf + own->off, own_src, own->len, op->what)) != WEFT_SUCCESS)
            goto out_drain;
    }

    /* Forward each chunk as soon as it is in (a full member has it already). */
    for (size_t k = 0; k < nchunks; k++) {
        if (!i_am_full) {
            weft_request_t *r = recvs.r[k];
            rc = coll_wait(op, list[k].step, r, left, "receive");
            if (rc != WEFT_SUCCESS) {
                /* Requests after k are still pending: drain them. */
                memmove(recvs.r, recvs.r + k + 1, (nrecv - k - 1) * sizeof *recvs.r);
                recvs.n = nrecv - k - 1;
                goto out_drain;
            }
        }
        if (list[k].fwd) {
            weft_request_t *s;
            rc = coll_isend(op, list[k].step, list[k].ptr, list[k].len, right, phase, &s);
            if (rc != WEFT_SUCCESS) {
                if (!i_am_full) {
                    memmove(recvs.r, recvs.r + k + 1, (nrecv - k - 1) * sizeof *recvs.r);
                    recvs.n = nrecv - k - 1;
                }
                goto out_drain;
            }
            coll_reqs_add(&sends, s, right);
        }
    }
    recvs.n = 0;
    rc = coll_reqs_waitall(op, m - 1, &sends);
    goto out_list;

out_drain:
    coll_reqs_drain(&recvs);
    coll_reqs_drain(&sends);
out_list:
    free(list);
out_sends:
    coll_reqs_fini(&sends);
out_recvs:
    coll_reqs_fini(&recvs);
    return rc;
}

/*
 * Ring allgather: n-1 steps, each rank sends and receives (n-1)/n of the
 * total, the bandwidth optimum; pipelined in chunks (coll_ring above).
 *
 *     rank:    0     1     2     3        after step 3 every rank has
 *     step 1:  0->   1->   2->   3->      [0 1 2 3]
 *     step 2:  3->   0->   1->   2->
 *     step 3:  2->   3->   0->   1->
 */
int weft_allgather_ring(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    struct coll_op op;
    coll_op_begin(&op, c, "allgather ring");
    int n = c->size;
    int *members = malloc((size_t)n * sizeof *members);
    int *first = malloc(((size_t)n + 1) * sizeof *first);
    struct coll_seg *segs = malloc((size_t)n * sizeof *segs);
    int rc;
    if (!members || !first || !segs) {
        rc = coll_nomem(&op, (size_t)n * (2 * sizeof(int) + sizeof *segs));
        goto out;
    }
    for (int p = 0; p < n; p++) {
        members[p] = p;
        first[p] = p;
        segs[p].off = (size_t)p * bytes;
        segs[p].len = bytes;
    }
    first[n] = n;
    rc = coll_ring(&op, 0, members, n, c->rank, segs, first, recvbuf, sendbuf, -1, coll_ring_chunk());
out:
    free(segs);
    free(first);
    free(members);
    return rc;
}

/*
 * Recursive doubling (power-of-two sizes): log2(n) steps; at step k a rank
 * swaps everything it holds (2^k blocks, contiguous) with rank ^ 2^k.
 *
 *     rank:     0      1      2      3
 *     step 0:   0<---->1      2<---->3        hold [01] [01] [23] [23]
 *     step 1:  01<-----------> 23             hold [0123] everywhere
 *               1<------------------>3
 */
int weft_allgather_rd(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    struct coll_op op;
    coll_op_begin(&op, c, "allgather recursive doubling");
    int n = c->size, me = c->rank, rc = WEFT_SUCCESS;
    char *rb = recvbuf;
    struct coll_reqs q;
    if ((rc = coll_reqs_init(&op, &q, 2)) != WEFT_SUCCESS)
        return rc;

    int step = 0;
    for (int mask = 1; mask < n; mask <<= 1, step++) {
        int partner = me ^ mask;
        size_t my_base = (size_t)(me & ~(mask - 1)) * bytes;
        size_t their_base = (size_t)(partner & ~(mask - 1)) * bytes;
        size_t len = (size_t)mask * bytes;
        weft_request_t *r;
        if ((rc = coll_irecv(&op, step, rb + their_base, len, partner, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, partner);
        /* Step 0 sends straight from sendbuf while the own block is copied. */
        const char *src = (step == 0) ? (const char *)sendbuf : rb + my_base;
        if ((rc = coll_isend(&op, step, src, len, partner, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, partner);
        if (step == 0 && (rc = copy_own_block(&op, sendbuf, rb, me, bytes)) != WEFT_SUCCESS)
            goto fail;
        if ((rc = coll_reqs_waitall(&op, step, &q)) != WEFT_SUCCESS)
            goto out;
    }
    goto out;
fail:
    coll_reqs_drain(&q);
out:
    coll_reqs_fini(&q);
    return rc;
}

/*
 * Bruck: ceil(log2 n) steps for any n. Blocks are kept rotated in a scratch
 * buffer (slot i = block of rank me+i); at step k with d = 2^k a rank sends
 * its first min(d, n-d) slots to me-d and appends the same count received
 * from me+d. A final rotation puts slot i at block me+i.
 *
 *     n = 5, rank 0's slots:   step 0 (d=1)   step 1 (d=2)   step 2 (d=4)
 *                              [0]            [0 1]          [0 1 2 3]
 *                              +[1] from 1    +[2 3] from 2  +[4] from 4
 *                              -> [0 1]       -> [0 1 2 3]   -> [0 1 2 3 4]
 */
int weft_allgather_bruck(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    struct coll_op op;
    coll_op_begin(&op, c, "allgather bruck");
    int n = c->size, me = c->rank, rc = WEFT_SUCCESS;
    size_t total = (size_t)n * bytes;
    char *tmp = malloc(total);
    if (!tmp)
        return coll_nomem(&op, total);
    struct coll_reqs q;
    if ((rc = coll_reqs_init(&op, &q, 2)) != WEFT_SUCCESS)
        goto out_tmp;

    int step = 0;
    for (int d = 1; d < n; d <<= 1, step++) {
        int cnt = d < n - d ? d : n - d;
        int to = (me - d + n) % n, from = (me + d) % n;
        weft_request_t *r;
        if ((rc = coll_irecv(&op, step, tmp + (size_t)d * bytes, (size_t)cnt * bytes, from, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, from);
        const char *src = (step == 0) ? (const char *)sendbuf : tmp;
        if ((rc = coll_isend(&op, step, src, (size_t)cnt * bytes, to, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, to);
        if (step == 0 && (rc = weft_devcopy(c, tmp, sendbuf, bytes, op.what)) != WEFT_SUCCESS)
            goto fail;
        if ((rc = coll_reqs_waitall(&op, step, &q)) != WEFT_SUCCESS)
            goto out;
    }
    /* Slot i holds rank (me+i)%n: slots [0, n-me) -> blocks [me, n), the rest -> [0, me). */
    char *rb = recvbuf;
    rc = weft_devcopy(c, rb + (size_t)me * bytes, tmp, (size_t)(n - me) * bytes, op.what);
    if (rc == WEFT_SUCCESS && me > 0)
        rc = weft_devcopy(c, rb, tmp + (size_t)(n - me) * bytes, (size_t)me * bytes, op.what);
    goto out;
fail:
    coll_reqs_drain(&q);
out:
    coll_reqs_fini(&q);
out_tmp:
    free(tmp);
    return rc;
}

/*
 * Direct: one step; every rank posts a receive from and a send to every
 * other rank at once (staggered: the i-th pair is me-i / me+i so no rank is
 * everybody's first target). Inside a node the copies of all pairs then run
 * in parallel and no rank waits on a chain of others.
 *
 *     rank 0:  --0--> 1, 2, 3      <--1,2,3-- from 1, 2, 3
 *     rank 1:  --1--> 2, 3, 0      ...
 */
int weft_allgather_direct(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    struct coll_op op;
    coll_op_begin(&op, c, "allgather direct");
    int n = c->size, me = c->rank, rc;
    char *rb = recvbuf;
    struct coll_reqs q;
    if ((rc = coll_reqs_init(&op, &q, 2 * (size_t)(n - 1))) != WEFT_SUCCESS)
        return rc;
    for (int i = 1; i < n; i++) {
        int from = (me - i + n) % n;
        weft_request_t *r;
        if ((rc = coll_irecv(&op, 0, rb + (size_t)from * bytes, bytes, from, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, from);
    }
    for (int i = 1; i < n; i++) {
        int to = (me + i) % n;
        weft_request_t *r;
        if ((rc = coll_isend(&op, 0, sendbuf, bytes, to, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, to);
    }
    if ((rc = copy_own_block(&op, sendbuf, rb, me, bytes)) != WEFT_SUCCESS)
        goto fail;
    rc = coll_reqs_waitall(&op, 0, &q);
    goto out;
fail:
    coll_reqs_drain(&q);
out:
    coll_reqs_fini(&q);
    return rc;
}

/*
 * Hierarchical: node-aware, for comms over several nodes (real, or
 * WEFT_VIRTUAL_NODES). The lowest rank of each node is its leader.
 *
 *     node A: a0* a1 a2        node B: b0* b1          (* = leader)
 *
 *     1. gather in node:   a1,a2 --> a0             b1 --> b0
 *     2. leaders' ring:    a0 [a0 a1 a2] ----> b0,  b0 [b0 b1] ----> a0
 *                          (pipelined ring over leaders, coll_ring; each
 *                           node boundary carries every byte once)
 *     3. share in node:    a0 --> a1, a2 (all but their own block)
 *                          b0 --> b1
 *
 * Only leaders cross nodes, so the slow links carry (nodes-1)/nodes of the
 * data once, and inside a node the receivers pull from the leader in parallel.
 */
int weft_allgather_hier(struct weft_comm *c, const void *sendbuf, void *recvbuf, size_t bytes)
{
    struct coll_op op;
    coll_op_begin(&op, c, "allgather hierarchical");
    const struct coll_topo *t = coll_topo_get(c);
    if (!t)
        return WEFT_ERR_NO_MEMORY;
    int n = c->size, me = c->rank, rc;
    int node = t->node_of[me];
    const int *local = t->node_ranks + t->node_first[node];
    int nlocal = t->node_first[node + 1] - t->node_first[node];
    int leader = local[0];
    char *rb = recvbuf;
    size_t total = (size_t)n * bytes;
    int *leaders = NULL, *seg_first = NULL;
    struct coll_seg *segs = NULL;
    struct coll_reqs q;

    if (me != leader) {
        /* 1 + 3: receives of everything but our block first, then our block up. */
        if ((rc = coll_reqs_init(&op, &q, 3)) != WEFT_SUCCESS)
            return rc;
        weft_request_t *r;
        size_t mine = (size_t)me * bytes;
        if (mine > 0) {
            if ((rc = coll_irecv(&op, 3, rb, mine, leader, 2, &r)) != WEFT_SUCCESS)
                goto fail;
            coll_reqs_add(&q, r, leader);
        }
        if (mine + bytes < total) {
            if ((rc = coll_irecv(&op, 3, rb + mine + bytes, total - mine - bytes, leader, 2, &r)) != WEFT_SUCCESS)
                goto fail;
            coll_reqs_add(&q, r, leader);
        }
        if ((rc = coll_isend(&op, 1, sendbuf, bytes, leader, 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, leader);
        if ((rc = copy_own_block(&op, sendbuf, rb, me, bytes)) != WEFT_SUCCESS)
            goto fail;
        rc = coll_reqs_waitall(&op, 3, &q);
        goto out;
    }

    /* Leader. */
    size_t qcap = (size_t)(nlocal - 1) * 3;
    if ((rc = coll_reqs_init(&op, &q, qcap)) != WEFT_SUCCESS)
        return rc;

    /* 1. gather the node's blocks. */
    for (int i = 1; i < nlocal; i++) {
        weft_request_t *r;
        if ((rc = coll_irecv(&op, 1, rb + (size_t)local[i] * bytes, bytes, local[i], 0, &r)) != WEFT_SUCCESS)
            goto fail;
        coll_reqs_add(&q, r, local[i]);
    }
    if ((rc = copy_own_block(&op, sendbuf, rb, me, bytes)) != WEFT_SUCCESS)
        goto fail;
    if ((rc = coll_reqs_waitall(&op, 1, &q)) != WEFT_SUCCESS)
        goto out;

    /* 2. ring over the leaders; node p's data = its runs of consecutive ranks. */
    if (t->nnodes > 1) {
        int nn = t->nnodes;
        leaders = malloc((size_t)nn * sizeof *leaders);
        seg_first = malloc(((size_t)nn + 1) * sizeof *seg_first);
        segs = malloc((size_t)n * sizeof *segs);
        if (!leaders || !seg_first || !segs) {
            rc = coll_nomem(&op, (size_t)n * sizeof *segs);
            goto out;
        }
        int ns = 0;
        for (int p = 0; p < nn; p++) {
            const int *rk = t->node_ranks + t->node_first[p];
            int cnt = t->node_first[p + 1] - t->node_first[p];
            leaders[p] = rk[0];
            seg_first[p] = ns;
            for (int j = 0; j < cnt; j++) {
                if (j > 0 && rk[j] == rk[j - 1] + 1) {
                    segs[ns - 1].len += bytes;
                } else {
                    segs[ns].off = (size_t)rk[j] * bytes;
                    segs[ns].len = bytes;
                    ns++;
                }
            }
        }
        seg_first[nn] = ns;
        rc = coll_ring(&op, 1, leaders, nn, node, segs, seg_first, rb, NULL, -1, coll_ring_chunk());
        if (rc != WEFT_SUCCESS)
            goto out;
    }

    /* 3. every local rank gets everything but its own block. */
    for (int i = 1; i < nlocal; i++) {
        size_t mine = (size_t)local[i] * bytes;
        weft_request_t *r;
        if (mine > 0) {
            if ((rc = coll_isend(&op, 3, rb, mine, local[i], 2, &r)) != WEFT_SUCCESS)
                goto fail;
            coll_reqs_add(&q, r, local[i]);
        }
        if (mine + bytes < total) {
            if ((rc = coll_isend(&op, 3, rb + mine + bytes, total - mine - bytes, local[i], 2, &r)) != WEFT_SUCCESS)
                goto fail;
            coll_reqs_add(&q, r, local[i]);
        }
    }
    rc = coll_reqs_waitall(&op, 3, &q);
    goto out;
fail:
    coll_reqs_drain(&q);
out:
    free(segs);
    free(seg_first);
    free(leaders);
    coll_reqs_fini(&q);
    return rc;
}
