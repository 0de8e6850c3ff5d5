#!/bin/sh
# torch.distributed: weft vs gloo (bench/torch/bench_torch.py), np 2 and 4,
# 1 KiB .. 64 MiB float32, markdown tables on stdout.
#   bench/torch/run.sh [--build DIR] [bench_torch.py options...]
# DIR (default $WEFT_BUILD, else <repo>/build) holds adapters/torch/weft_torch;
# without it the weft column stays empty and the reason is printed.
set -e
here=$(cd "$(dirname "$0")" && pwd)
build=${WEFT_BUILD:-$here/../../build}
if [ "$1" = "--build" ]; then build=$2; shift 2; fi
if [ -d "$build/adapters/torch" ]; then
    PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(cd "$build/adapters/torch" && pwd)
    export PYTHONPATH
fi
exec /usr/bin/python3 "$here/bench_torch.py" "$@"
