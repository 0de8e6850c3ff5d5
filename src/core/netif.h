/*
 * Which local IPv4 address a listener binds to, as WEFT_TCP_IF says: shared
 * by the tcp transport's listener and the unique id's root (src/comm/), so
 * both land on the same interface. Callers word their own messages.
 */
#ifndef WEFT_NETIF_H
#define WEFT_NETIF_H

#include <stddef.h>
#include <netinet/in.h>

enum weft_netif_result {
    WEFT_NETIF_OK = 0,          /* *out is the address WEFT_TCP_IF names, or the first UP non-loopback one */
    WEFT_NETIF_LOOPBACK,        /* want empty and no UP non-loopback IPv4 interface: *out = 127.0.0.1 */
    WEFT_NETIF_NO_MATCH,        /* want is neither an IPv4 literal nor an interface with an IPv4 address */
    WEFT_NETIF_GETIFADDRS       /* getifaddrs failed; errno says why */
};

/* want: WEFT_TCP_IF's value (interface name or IPv4 literal; "" = choose).
 * *out is written for WEFT_NETIF_OK and WEFT_NETIF_LOOPBACK only. */
enum weft_netif_result weft_netif_resolve_ipv4(const char *want, struct in_addr *out);

/* The name of the interface that holds addr ("lo", "eth0"): 0, or -1 when
 * none does or getifaddrs failed. */
int weft_netif_name_of(const struct in_addr *addr, char *name, size_t len);

#endif
