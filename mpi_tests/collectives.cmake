# Collectives: allgather (every algorithm + selector), barrier, bcast.
# Included from mpi_tests/CMakeLists.txt, which defines
# weft_add_mpi_test_binary / weft_add_mpi_suite.
#
# Matrix (chosen so the whole suite, ASan rerun included, stays within the CI
# budget on 2 cores; docs/benchmarks.md has the measured times):
#   np 1            shm                       (trivial comm: copies only)
#   np 2, 3, 4      shm, tcp, vnodes2         full block-size list up to 16 MiB
#   np 3, 4, 5, 8   vnodes3                   (WEFT_VIRTUAL_NODES=3: uneven nodes)
#   np 5, 8         shm, vnodes2              reduced block-size list (test decides)
#   np 5            tcp
weft_add_mpi_test_binary(weft_mpi_coll test_allgather.cc test_barrier_bcast.cc)

set(WEFT_COLL_FILTER "-*Huge*:*InfoLogs*:*StepFailure*")
weft_add_mpi_suite(NAME coll BINARY weft_mpi_coll NPS 1 CONFIGS shm
                   GTEST_FILTER ${WEFT_COLL_FILTER} LABELS coll)
weft_add_mpi_suite(NAME coll BINARY weft_mpi_coll NPS 2 3 4 CONFIGS shm tcp vnodes2
                   GTEST_FILTER ${WEFT_COLL_FILTER} LABELS coll TIMEOUT 300)
weft_add_mpi_suite(NAME coll BINARY weft_mpi_coll NPS 5 8 CONFIGS shm vnodes2
                   GTEST_FILTER ${WEFT_COLL_FILTER} LABELS coll TIMEOUT 300)
weft_add_mpi_suite(NAME coll BINARY weft_mpi_coll NPS 5 CONFIGS tcp
                   GTEST_FILTER ${WEFT_COLL_FILTER} LABELS coll TIMEOUT 300)
# Three virtual nodes: not one of the shared configs, so "default" + ENV.
weft_add_mpi_suite(NAME coll_vnodes3 BINARY weft_mpi_coll NPS 3 4 5 8 CONFIGS default
                   GTEST_FILTER ${WEFT_COLL_FILTER} LABELS "coll;vnodes3"
                   ENV WEFT_VIRTUAL_NODES=3 TIMEOUT 300)
# WEFT_DEBUG=info: each (bytes, size) shape's choice is logged once.
weft_add_mpi_suite(NAME coll_info_log BINARY weft_mpi_coll NPS 3 CONFIGS shm
                   GTEST_FILTER "*InfoLogs*" LABELS coll ENV WEFT_DEBUG=info)
# A failing p2p step (a rank that never joins, WEFT_TIMEOUT=2 on a comm of
# its own) is reported with the algorithm and step. sleepy: mostly that wait
# (scripts/test runs such entries side by side).
weft_add_mpi_suite(NAME coll_step_failure BINARY weft_mpi_coll NPS 2 CONFIGS shm tcp
                   GTEST_FILTER "*StepFailure*" LABELS "coll;sleepy" TIMEOUT 60)
# More than 4 GiB in total (2 GiB + 3 per rank at np 2, ~9 GiB of memory):
# alone, and skippable with `ctest -LE huge`.
weft_add_mpi_suite(NAME coll_huge BINARY weft_mpi_coll NPS 2 CONFIGS shm
                   GTEST_FILTER "*Huge*" LABELS "coll;huge" TIMEOUT 600 RUN_SERIAL)
