/*
 * Cross-memory attach: the copy and the words for a refusal (cma.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include "cma.h"

/* Largest piece one call moves: keeps each call's iovec length far below
 * SSIZE_MAX and bounds the time between retries. */
#define CMA_MAX_IOV ((size_t)1 << 30)

int weft_cma_copy(pid_t pid, int write, void *local, uint64_t remote, size_t len)
{
    char *at = local;
    while (len > 0) {
        size_t n = len < CMA_MAX_IOV ? len : CMA_MAX_IOV;
        struct iovec l = { at, n };
        struct iovec r = { (void *)(uintptr_t)remote, n };
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? errno : EFAULT;
        at += got;
        remote += (uint64_t)got;
        len -= (size_t)got;
    }
    return 0;
}

void weft_cma_refusal(int err, char *why, size_t whylen)
{
    int scope = -1;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = -1;
        fclose(f);
    }
    if (err == EPERM && scope >= 2)
        snprintf(why, whylen, "refused by ptrace scope (kernel.yama.ptrace_scope=%d: %s; weft falls back to the "
                 "bounce buffers)", scope, scope == 2 ? "only processes with CAP_SYS_PTRACE may read another"
                 : "no process may read another");
    else if (err == EPERM && scope >= 0)
        snprintf(why, whylen, "process_vm_readv refused (EPERM) although kernel.yama.ptrace_scope=%d and weft "
                 "allows its peers (PR_SET_PTRACER): a security module or container policy (seccomp, "
                 "AppArmor, different user)", scope);
    else if (err == EPERM)
        snprintf(why, whylen, "process_vm_readv refused (EPERM; no Yama here): a security module or container "
                 "policy (seccomp, AppArmor, different user)");
    else if (err == ENOSYS)
        snprintf(why, whylen, "process_vm_readv is not available (ENOSYS: kernel without CMA, or a seccomp filter)");
    else
        snprintf(why, whylen, "process_vm_readv failed: %s", err ? strerror(err) : "wrong data read back");
}

