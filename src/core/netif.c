/*
 * WEFT_TCP_IF resolution (netif.h). One place, so that the tcp transport's
 * listener and the unique id's root cannot drift apart in what they accept.
 */
#include "netif.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

enum weft_netif_result weft_netif_resolve_ipv4(const char *want, struct in_addr *out)
{
    struct in_addr lit;

    if (want[0] != '\0' && inet_pton(AF_INET, want, &lit) == 1) {
        *out = lit;
        return WEFT_NETIF_OK;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return WEFT_NETIF_GETIFADDRS;
    int found = 0;
    for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (want[0] != '\0') {
            if (strcmp(i->ifa_name, want) != 0)
                continue;
        } else if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) {
            continue;
        }
        *out = ((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr;
        found = 1;
    }
    freeifaddrs(ifs);
    if (found)
        return WEFT_NETIF_OK;
    if (want[0] != '\0')
        return WEFT_NETIF_NO_MATCH;
    out->s_addr = htonl(INADDR_LOOPBACK);
    return WEFT_NETIF_LOOPBACK;
}

int weft_netif_name_of(const struct in_addr *addr, char *name, size_t len)
{
    struct ifaddrs *ifs = NULL;
    int found = -1;
    if (getifaddrs(&ifs) != 0)
        return -1;
    for (struct ifaddrs *i = ifs; i != NULL && found != 0; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr.s_addr != addr->s_addr)
            continue;
        snprintf(name, len, "%s", i->ifa_name);
        found = 0;
    }
    freeifaddrs(ifs);
    return found;
}
