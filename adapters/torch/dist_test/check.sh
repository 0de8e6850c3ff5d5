#!/bin/sh
# CI entry for PyTorch's distributed_test.py over weft and gloo (see check.py).
#   adapters/torch/dist_test/check.sh [--build DIR] [--world-size N] [--list L]
# Prints "distributed_test.py: weft P pass / S skip / F fail, gloo P / S / F"
# and fails if a test of must_pass_weft.txt did not pass with weft.
exec /usr/bin/python3 "$(dirname "$0")/check.py" "$@"
