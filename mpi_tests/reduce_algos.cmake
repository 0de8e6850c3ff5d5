# The reduction algorithms (allreduce, reduce_scatter, reduce), each forced
# on a comm of its own plus the selector, with 4 KiB reduction chunks
# (test_reduce_algos.cc). Included from mpi_tests/CMakeLists.txt.
#
# Matrix (about a minute in all on 2 cores; WEFT_TEST_SIZES=reduced keeps
# only int32 sum, float32 sum and float16 avg, with every count):
#   np 1, 2, 3, 4, 5      shm (chunks go eager: copied when sent)
#   np 8                  shm, reduced (8 ranks on 2 cores: every hop waits
#                         for a time slice)
#   np 3, 4               shm with every message by rendezvous
#                         (WEFT_SHM_EAGER=0 WEFT_SHM_COLL_EAGER=0), reduced: a
#                         send's buffer is read while the schedule goes on,
#                         so a slot reused too early shows
#   np 4, 5               two virtual nodes, np 5 three, reduced: hier's real
#                         work and the selector (the other algorithms do not
#                         look at nodes)
#   np 3                  tcp, reduced
#   np 2, 3               shm, WEFT_DEBUG=info: the reduce selector's choice
#                         on both sides of its thresholds; a reduce's partial
#                         sums wait for the root (rendezvous); repeated calls
#                         fault no scratch in (the comm keeps op memory)
weft_add_mpi_test_binary(weft_mpi_reduce_algos test_reduce_algos.cc)

set(WEFT_RA_REDUCED WEFT_TEST_SIZES=reduced)
set(WEFT_RA_HIER "*AllreduceAlgo.MatchesReference/3:*AllreduceAlgo.MatchesReference/4")
weft_add_mpi_suite(NAME reduce_algos BINARY weft_mpi_reduce_algos NPS 1 2 3 4 5 CONFIGS shm
                   LABELS "coll;reduce" TIMEOUT 300)
weft_add_mpi_suite(NAME reduce_algos BINARY weft_mpi_reduce_algos NPS 8 CONFIGS shm
                   LABELS "coll;reduce" ENV ${WEFT_RA_REDUCED} TIMEOUT 300)
weft_add_mpi_suite(NAME reduce_algos_rndv BINARY weft_mpi_reduce_algos NPS 3 4 CONFIGS shm
                   LABELS "coll;reduce" ENV ${WEFT_RA_REDUCED} WEFT_SHM_EAGER=0 WEFT_SHM_COLL_EAGER=0 TIMEOUT 300)
weft_add_mpi_suite(NAME reduce_algos BINARY weft_mpi_reduce_algos NPS 4 5 CONFIGS vnodes2
                   GTEST_FILTER ${WEFT_RA_HIER} LABELS "coll;reduce" ENV ${WEFT_RA_REDUCED} TIMEOUT 300)
# np 4 too (nodes of 2, 1, 1): the sanitizer pass leaves np 5 out (.ci/run),
# and this is the only three-node run of the hierarchical reductions.
weft_add_mpi_suite(NAME reduce_algos_vnodes3 BINARY weft_mpi_reduce_algos NPS 4 5 CONFIGS default
                   GTEST_FILTER ${WEFT_RA_HIER} LABELS "coll;reduce;vnodes3"
                   ENV ${WEFT_RA_REDUCED} WEFT_VIRTUAL_NODES=3 TIMEOUT 300)
weft_add_mpi_suite(NAME reduce_algos BINARY weft_mpi_reduce_algos NPS 3 CONFIGS tcp
                   LABELS "coll;reduce" ENV ${WEFT_RA_REDUCED} TIMEOUT 300)
weft_add_mpi_suite(NAME reduce_select BINARY weft_mpi_reduce_algos NPS 2 3 CONFIGS shm
                   GTEST_FILTER "ReduceSelector.*:ReduceToRoot.*:OpMemory.*" LABELS "coll;reduce" ENV WEFT_DEBUG=info TIMEOUT 120)
