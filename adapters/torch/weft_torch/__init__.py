"""weft_torch: the "weft" backend for torch.distributed.

    import torch.distributed as dist
    import weft_torch  # registers the backend "weft"
    dist.init_process_group("weft", init_method="env://")  # or file://, tcp://
    dist.all_reduce(t)

Importing the package registers the backend with
torch.distributed.Backend.register_backend; the process group is
weft_torch.ProcessGroupWeft (C++, weft_torch/_C), one weft comm per group,
whose ranks meet through the group's store (rank 0 puts weft's unique id in
it). See docs/torch.md.
"""

import inspect

import torch
import torch.distributed as dist

from . import _C

__all__ = ["ProcessGroupWeft", "abort", "last_error", "BACKEND_NAME", "WEFT_VERSION"]

BACKEND_NAME = "weft"
ProcessGroupWeft = _C.ProcessGroupWeft
WEFT_VERSION = _C.WEFT_VERSION


def _create_process_group(store, rank, world_size, timeout):
    # torch calls this with the group's PrefixStore, the rank in the group,
    # its size and a datetime.timedelta (the group's timeout).
    return _C.ProcessGroupWeft(store, rank, world_size, timeout)


def _register():
    backend = dist.Backend
    if BACKEND_NAME.upper() in getattr(backend, "_plugins", {}):
        return  # already registered (the package was loaded twice)
    kwargs = {}
    # torch >= 2.1 asks which device types a backend serves.
    if "devices" in inspect.signature(backend.register_backend).parameters:
        kwargs["devices"] = ["cpu", "cuda"] if _C.CUDA else ["cpu"]
    backend.register_backend(BACKEND_NAME, _create_process_group, **kwargs)


def _weft_group(group):
    """The ProcessGroupWeft behind `group` (None: the default group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if isinstance(pg, ProcessGroupWeft):
        return pg
    # torch >= 2.0: a ProcessGroup wraps per-device Backends.
    get = getattr(pg, "_get_backend", None)
    if get is not None:
        be = get(torch.device("cpu"))
        if isinstance(be, ProcessGroupWeft):
            return be
    raise RuntimeError("weft backend: %r is not a weft process group" % (pg,))


def abort(group=None):
    """weft_comm_abort on the group's comm: every pending and later operation
    of the group fails at once (WEFT_ERR_ABORTED), and the peers' pipes to
    this rank break, so their operations fail naming this rank instead of
    waiting out WEFT_TIMEOUT. Destroy the group afterwards."""
    _weft_group(group).abort()


def last_error(group=None):
    """weft's last error on the group's comm ("" if none)."""
    return _weft_group(group).last_error()


_register()
