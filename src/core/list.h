/*
 * Intrusive lists: the one list library of weft (no other file links
 * nodes by hand). An object embeds a node and is found from it with
 * weft_container_of, so linking allocates nothing.
 *
 *   struct weft_list   doubly linked, circular around a head node: O(1)
 *                      append, prepend and removal of any element (queues
 *                      a request leaves from the middle, LRU lists).
 *   struct weft_queue  singly linked FIFO with a tail pointer: O(1) push at
 *                      the tail and pop at the head (message queues).
 */
#ifndef WEFT_LIST_H
#define WEFT_LIST_H

#include <stddef.h>

#define weft_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* ---- doubly linked ---- */

struct weft_list { struct weft_list *prev, *next; };

static inline void weft_list_init(struct weft_list *head) { head->prev = head->next = head; }
static inline int  weft_list_empty(const struct weft_list *head) { return head->next == head; }
/* A node that is on no list (after weft_list_del or weft_list_init). */
static inline int  weft_list_linked(const struct weft_list *n) { return n->next != NULL && n->next != n; }

static inline void weft_list_insert_(struct weft_list *n, struct weft_list *prev, struct weft_list *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}
static inline void weft_list_add_tail(struct weft_list *head, struct weft_list *n) { weft_list_insert_(n, head->prev, head); }
static inline void weft_list_add_head(struct weft_list *head, struct weft_list *n) { weft_list_insert_(n, head, head->next); }
/* Unlinks n; it then reads as not linked. */
static inline void weft_list_del(struct weft_list *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}
static inline struct weft_list *weft_list_first(const struct weft_list *head) { return weft_list_empty(head) ? NULL : head->next; }
/* Unlinks and returns the first node, NULL when empty. */
static inline struct weft_list *weft_list_pop(struct weft_list *head)
{
    struct weft_list *n = weft_list_first(head);
    if (n)
        weft_list_del(n);
    return n;
}

/* for (node over list), safe against removing node inside the loop */
#define weft_list_for_each(node, head) \
    for (struct weft_list *node = (head)->next, *node##_next_ = node->next; node != (head); \
         node = node##_next_, node##_next_ = node->next)

/* ---- singly linked FIFO ---- */

struct weft_qnode { struct weft_qnode *next; };
struct weft_queue { struct weft_qnode *head, **tailp; };

static inline void weft_queue_init(struct weft_queue *q) { q->head = NULL; q->tailp = &q->head; }
static inline int  weft_queue_empty(const struct weft_queue *q) { return q->head == NULL; }
static inline struct weft_qnode *weft_queue_head(const struct weft_queue *q) { return q->head; }
static inline void weft_queue_push(struct weft_queue *q, struct weft_qnode *n)
{
    n->next = NULL;
    *q->tailp = n;
    q->tailp = &n->next;
}
/* At the head: a LIFO (free lists, where the most recently freed object is
 * the one still in cache). */
static inline void weft_queue_push_head(struct weft_queue *q, struct weft_qnode *n)
{
    n->next = q->head;
    if (q->head == NULL)
        q->tailp = &n->next;
    q->head = n;
}
static inline struct weft_qnode *weft_queue_pop(struct weft_queue *q)
{
    struct weft_qnode *n = q->head;
    if (n) {
        q->head = n->next;
        if (q->head == NULL)
            q->tailp = &q->head;
        n->next = NULL;
    }
    return n;
}

#define weft_queue_for_each(node, q) for (struct weft_qnode *node = (q)->head; node; node = node->next)

#endif
