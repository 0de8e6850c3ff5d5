/*
 * Registration cache (see regcache.h for the contract and the policies).
 *
 * Lookup structure. Live entries (those acquire may still return) sit in a
 * treap ordered by (addr, end, entry address), each node augmented with the
 * largest end address in its subtree -- an interval tree. Entries may
 * overlap (see the overlap policy in regcache.h), so "is [s, e) inside some
 * entry" is "among entries with addr <= s, does one reach e", which the
 * augmentation answers in one root-to-leaf descent: O(log n) expected, no
 * allocation, no syscall. A repeated transfer from the same buffer is that
 * descent plus an O(1) unlink from the LRU list. A linear scan was not an
 * option: with the default 1 GiB cap and rendezvous-sized buffers the cache
 * can hold thousands of entries, and the lookup runs on every large message.
 * A treap (random priorities) rather than a red-black tree because it needs
 * no rebalancing cases: insert and remove are a few rotations, and the
 * augmentation is recomputed at each node touched.
 *
 * Lists (core/list.h). Idle cached entries (refs 0, live, not user-pinned)
 * are on the LRU list, least recently released first; eviction takes its
 * head. Every registered entry -- live or dead -- is on the all-entries list
 * so destroy finds the in-flight dead ones too; unlinking is O(1).
 */
#include "regcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "list.h"
#include "weft.h"

struct rc_entry {
    struct weft_reg   r;          /* first: a struct weft_reg * is a struct rc_entry * */
    struct rc_entry  *left, *right;
    uintptr_t         max_end;    /* largest addr + len in this subtree */
    uint32_t          prio;       /* treap heap priority (max at the root) */
    int               in_tree;    /* live: acquire may return it */
    struct weft_list  lru;        /* on rc->lru while idle (linked = on it) */
    struct weft_list  all;        /* on rc->all while registered */
};

struct weft_regcache {
    struct weft_reg_ops        ops;
    size_t                     cap;
    uintptr_t                  page;
    struct rc_entry           *root;
    struct weft_list           lru;   /* idle entries, least recently released first */
    struct weft_list           all;   /* every registered entry */
    uint32_t                   seed;
    struct weft_regcache_stats st;
};

static struct rc_entry *E(struct weft_reg *r) { return (struct rc_entry *)r; }
static uintptr_t end_of(const struct rc_entry *n) { return n->r.addr + n->r.len; }

static void set_why(char *why, size_t whylen, const char *msg)
{
    if (why != NULL && whylen > 0)
        snprintf(why, whylen, "%s", msg);
}

/* [addr, addr+len) rounded out to whole pages as [*s, *e); len 0 counts as
 * one byte. Nonzero when the range wraps or reaches the last page of the
 * address space (whose end is not representable; nothing real lives there). */
static int page_range(const struct weft_regcache *rc, const void *addr, size_t len, uintptr_t *s, uintptr_t *e)
{
    uintptr_t a = (uintptr_t)addr, last, last_page;

    if (len == 0)
        len = 1;
    if (len - 1 > UINTPTR_MAX - a)
        return -1;
    last = a + (len - 1);
    last_page = last & ~(rc->page - 1);
    if (last_page > UINTPTR_MAX - rc->page)
        return -1;
    *s = a & ~(rc->page - 1);
    *e = last_page + rc->page;
    return 0;
}

/* ---- treap ---------------------------------------------------------------- */

static uint32_t next_prio(struct weft_regcache *rc)
{
    uint32_t x = rc->seed; /* xorshift32 */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    rc->seed = x;
    return x;
}

static void fix(struct rc_entry *n)
{
    uintptr_t m = end_of(n);
    if (n->left != NULL && n->left->max_end > m)
        m = n->left->max_end;
    if (n->right != NULL && n->right->max_end > m)
        m = n->right->max_end;
    n->max_end = m;
}

static int key_less(const struct rc_entry *a, const struct rc_entry *b)
{
    if (a->r.addr != b->r.addr)
        return a->r.addr < b->r.addr;
    if (a->r.len != b->r.len)
        return a->r.len < b->r.len;
    return (uintptr_t)a < (uintptr_t)b;
}

static struct rc_entry *rot_right(struct rc_entry *x)
{
    struct rc_entry *y = x->left;
    x->left = y->right;
    y->right = x;
    fix(x);
    fix(y);
    return y;
}

static struct rc_entry *rot_left(struct rc_entry *x)
{
    struct rc_entry *y = x->right;
    x->right = y->left;
    y->left = x;
    fix(x);
    fix(y);
    return y;
}

static struct rc_entry *tree_insert(struct rc_entry *root, struct rc_entry *n)
{
    if (root == NULL)
        return n;
    if (key_less(n, root)) {
        root->left = tree_insert(root->left, n);
        fix(root);
        if (root->left->prio > root->prio)
            root = rot_right(root);
    } else {
        root->right = tree_insert(root->right, n);
        fix(root);
        if (root->right->prio > root->prio)
            root = rot_left(root);
    }
    return root;
}

/* Joins two treaps, every key of a below every key of b. */
static struct rc_entry *tree_merge(struct rc_entry *a, struct rc_entry *b)
{
    if (a == NULL)
        return b;
    if (b == NULL)
        return a;
    if (a->prio > b->prio) {
        a->right = tree_merge(a->right, b);
        fix(a);
        return a;
    }
    b->left = tree_merge(a, b->left);
    fix(b);
    return b;
}

static struct rc_entry *tree_remove(struct rc_entry *root, struct rc_entry *n)
{
    if (root == NULL)
        return NULL; /* not reached: n is in the tree */
    if (root == n)
        return tree_merge(n->left, n->right);
    if (key_less(n, root))
        root->left = tree_remove(root->left, n);
    else
        root->right = tree_remove(root->right, n);
    fix(root);
    return root;
}

/* Some node of the subtree with end >= e, given sub->max_end >= e. */
static struct rc_entry *any_reaching(struct rc_entry *n, uintptr_t e)
{
    while (end_of(n) < e)
        n = (n->left != NULL && n->left->max_end >= e) ? n->left : n->right;
    return n;
}

/* A live entry containing [s, e): addr <= s and end >= e. All of a node's
 * left subtree starts no later than the node, so once a node starts at or
 * before s its whole left subtree qualifies on the start and only max_end
 * decides; otherwise only the left subtree can qualify. */
static struct rc_entry *find_containing(struct rc_entry *n, uintptr_t s, uintptr_t e)
{
    while (n != NULL) {
        if (n->r.addr > s) {
            n = n->left;
            continue;
        }
        if (end_of(n) >= e)
            return n;
        if (n->left != NULL && n->left->max_end >= e)
            return any_reaching(n->left, e);
        n = n->right;
    }
    return NULL;
}

/* A live entry sharing a page with [s, e). Classic interval-tree search: if
 * the left subtree reaches past s but holds no overlap, its entry reaching
 * past s starts at or after e, and so does everything to the right. */
static struct rc_entry *find_overlapping(struct rc_entry *n, uintptr_t s, uintptr_t e)
{
    while (n != NULL) {
        if (n->max_end <= s)
            return NULL;
        if (n->r.addr < e && end_of(n) > s)
            return n;
        n = (n->left != NULL && n->left->max_end > s) ? n->left : n->right;
    }
    return NULL;
}

/* A live entry inside [s, e) (addr >= s, end <= e), not user-pinned, and
 * idle (want_idle) or in flight (!want_idle). Visits only subtrees that can
 * start inside [s, e) and reach past s. */
static struct rc_entry *find_inside(struct rc_entry *n, uintptr_t s, uintptr_t e, int want_idle)
{
    struct rc_entry *f;

    if (n == NULL || n->max_end <= s)
        return NULL;
    if (n->r.addr >= s && (f = find_inside(n->left, s, e, want_idle)) != NULL)
        return f;
    if (n->r.addr >= e)
        return NULL;
    if (n->r.addr >= s && end_of(n) <= e && !n->r.user_pinned && (n->r.refs == 0) == (want_idle != 0))
        return n;
    return find_inside(n->right, s, e, want_idle);
}

/* ---- lists and entry life ---------------------------------------------------- */

static void lru_unlink(struct weft_regcache *rc, struct rc_entry *n)
{
    (void)rc;
    if (weft_list_linked(&n->lru))
        weft_list_del(&n->lru);
}

static void lru_push_tail(struct weft_regcache *rc, struct rc_entry *n)
{
    weft_list_add_tail(&rc->lru, &n->lru);
}

static void untree(struct weft_regcache *rc, struct rc_entry *n)
{
    if (n->in_tree) {
        rc->root = tree_remove(rc->root, n);
        n->left = n->right = NULL;
        n->in_tree = 0;
    }
}

/* Deregisters n and forgets it. n is idle (refs 0) or the cache is going. */
static void entry_free(struct weft_regcache *rc, struct rc_entry *n)
{
    untree(rc, n);
    lru_unlink(rc, n);
    if (rc->ops.dereg != NULL)
        rc->ops.dereg(rc->ops.ctx, n->r.handle);
    weft_list_del(&n->all);
    rc->st.pinned_bytes -= n->r.len;
    rc->st.entries--;
    free(n);
}

/* Evicts idle entries, least recently used first, until `need` more bytes
 * fit under the cap or nothing is evictable. need 0: back under the cap. */
static void evict_for(struct weft_regcache *rc, size_t need)
{
    while (!weft_list_empty(&rc->lru) &&
           (rc->st.pinned_bytes > rc->cap || need > rc->cap - rc->st.pinned_bytes)) {
        entry_free(rc, weft_container_of(weft_list_first(&rc->lru), struct rc_entry, lru));
        rc->st.evictions++;
    }
}

/* Registers [s, e) as a new entry, on the all-entries list, in no index. */
static int entry_new(struct weft_regcache *rc, uintptr_t s, uintptr_t e, struct rc_entry **out, char *why,
                     size_t whylen)
{
    char local[256];
    struct rc_entry *n = calloc(1, sizeof(*n));

    if (n == NULL) {
        set_why(why, whylen, "out of memory for a registration cache entry");
        return WEFT_ERR_NO_MEMORY;
    }
    local[0] = '\0';
    if (rc->ops.reg(rc->ops.ctx, s, (size_t)(e - s), &n->r.handle, &n->r.lkey, &n->r.rkey, local,
                    sizeof(local)) != 0) {
        local[sizeof(local) - 1] = '\0';
        set_why(why, whylen, local[0] != '\0' ? local : "memory registration failed (no reason given)");
        free(n);
        return WEFT_ERR_TRANSPORT;
    }
    n->r.addr = s;
    n->r.len = (size_t)(e - s);
    n->max_end = e;
    n->prio = next_prio(rc);
    weft_list_init(&n->lru);
    weft_list_add_head(&rc->all, &n->all);
    rc->st.pinned_bytes += n->r.len;
    rc->st.entries++;
    *out = n;
    return WEFT_SUCCESS;
}

/* A new live entry for [s, e), after making room: idle unpinned entries
 * inside [s, e) are redundant once it exists, so they go first (they count
 * as evictions); then the LRU makes room under the cap. On success the
 * in-flight unpinned entries inside [s, e) are retired: marked dead, taken
 * out of the index, deregistered at their last release. */
static int insert_new(struct weft_regcache *rc, uintptr_t s, uintptr_t e, struct rc_entry **out, char *why,
                      size_t whylen)
{
    struct rc_entry *n, *old;
    int err;

    while ((old = find_inside(rc->root, s, e, 1)) != NULL) {
        entry_free(rc, old);
        rc->st.evictions++;
    }
    evict_for(rc, (size_t)(e - s));
    if ((err = entry_new(rc, s, e, &n, why, whylen)) != WEFT_SUCCESS)
        return err;
    while ((old = find_inside(rc->root, s, e, 0)) != NULL) {
        untree(rc, old);
        old->r.dead = 1;
    }
    rc->root = tree_insert(rc->root, n);
    n->in_tree = 1;
    *out = n;
    return WEFT_SUCCESS;
}

/* ---- the interface ------------------------------------------------------------ */

int weft_regcache_create(const struct weft_reg_ops *ops, size_t cap_bytes, struct weft_regcache **out)
{
    struct weft_regcache *rc;
    long pg = sysconf(_SC_PAGESIZE);

    if (ops == NULL || ops->reg == NULL || out == NULL)
        return WEFT_ERR_INVALID_ARG;
    if ((rc = calloc(1, sizeof(*rc))) == NULL)
        return WEFT_ERR_NO_MEMORY;
    rc->ops = *ops;
    rc->cap = cap_bytes;
    weft_list_init(&rc->lru);
    weft_list_init(&rc->all);
    rc->page = (pg > 0 && ((unsigned long)pg & ((unsigned long)pg - 1)) == 0) ? (uintptr_t)pg : 4096;
    rc->seed = 0x9e3779b9u ^ (uint32_t)((uintptr_t)rc >> 4);
    if (rc->seed == 0)
        rc->seed = 1;
    *out = rc;
    return WEFT_SUCCESS;
}

void weft_regcache_destroy(struct weft_regcache *rc)
{
    if (rc == NULL)
        return;
    while (!weft_list_empty(&rc->all))
        entry_free(rc, weft_container_of(weft_list_first(&rc->all), struct rc_entry, all));
    free(rc);
}

int weft_regcache_acquire(struct weft_regcache *rc, const void *addr, size_t len, struct weft_reg **out,
                          char *why, size_t whylen)
{
    struct rc_entry *n;
    uintptr_t s, e;
    int err;

    if (rc == NULL || out == NULL) {
        set_why(why, whylen, "no registration cache or no output pointer");
        return WEFT_ERR_INVALID_ARG;
    }
    if (page_range(rc, addr, len, &s, &e) != 0) {
        set_why(why, whylen, "the range wraps around the address space");
        return WEFT_ERR_INVALID_ARG;
    }
    if ((n = find_containing(rc->root, s, e)) != NULL) {
        lru_unlink(rc, n);
        n->r.refs++;
        rc->st.hits++;
        *out = &n->r;
        return WEFT_SUCCESS;
    }
    rc->st.misses++;
    if (rc->cap == 0) {
        /* Not cached: in no index (so dead from birth), gone at its release. */
        if ((err = entry_new(rc, s, e, &n, why, whylen)) != WEFT_SUCCESS)
            return err;
        n->r.dead = 1;
    } else if ((err = insert_new(rc, s, e, &n, why, whylen)) != WEFT_SUCCESS) {
        return err;
    }
    n->r.refs = 1;
    *out = &n->r;
    return WEFT_SUCCESS;
}

void weft_regcache_release(struct weft_regcache *rc, struct weft_reg *r)
{
    struct rc_entry *n;

    if (rc == NULL || r == NULL || r->refs <= 0)
        return;
    n = E(r);
    if (--r->refs > 0)
        return;
    if (r->dead) {
        entry_free(rc, n);
        return;
    }
    if (!r->user_pinned)
        lru_push_tail(rc, n);
    evict_for(rc, 0); /* back under the cap after an over-cap spell */
}

int weft_regcache_pin(struct weft_regcache *rc, const void *addr, size_t len, char *why, size_t whylen)
{
    struct rc_entry *n;
    uintptr_t s, e;
    int err;

    if (rc == NULL) {
        set_why(why, whylen, "no registration cache");
        return WEFT_ERR_INVALID_ARG;
    }
    if (page_range(rc, addr, len, &s, &e) != 0) {
        set_why(why, whylen, "the range wraps around the address space");
        return WEFT_ERR_INVALID_ARG;
    }
    if ((n = find_containing(rc->root, s, e)) != NULL) {
        lru_unlink(rc, n);
        n->r.user_pinned = 1;
        rc->st.hits++;
        return WEFT_SUCCESS;
    }
    rc->st.misses++;
    if ((err = insert_new(rc, s, e, &n, why, whylen)) != WEFT_SUCCESS)
        return err;
    n->r.user_pinned = 1;
    return WEFT_SUCCESS;
}

int weft_regcache_invalidate(struct weft_regcache *rc, const void *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr, s, e, last;
    struct rc_entry *n;
    int count = 0;

    if (rc == NULL)
        return 0;
    /* Clamped rather than refused: the last page is never registered. */
    last = (len == 0) ? a : (len - 1 > UINTPTR_MAX - a) ? UINTPTR_MAX : a + (len - 1);
    s = a & ~(rc->page - 1);
    e = last & ~(rc->page - 1);
    e = (e > UINTPTR_MAX - rc->page) ? e : e + rc->page;
    while (s < e && (n = find_overlapping(rc->root, s, e)) != NULL) {
        untree(rc, n);
        lru_unlink(rc, n);
        if (n->r.refs == 0)
            entry_free(rc, n);
        else
            n->r.dead = 1;
        count++;
    }
    rc->st.invalidations += (uint64_t)count;
    return count;
}

void weft_regcache_get_stats(const struct weft_regcache *rc, struct weft_regcache_stats *st)
{
    if (st == NULL)
        return;
    if (rc == NULL) {
        memset(st, 0, sizeof(*st));
        return;
    }
    *st = rc->st;
}
