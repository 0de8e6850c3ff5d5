# weft_comm_split: new comms over a comm's own pipes (test_comm_split.cc),
# and the p2p and collectives suites re-run on split comms
# (WEFT_TEST_COMM=split: weft_mpi_test.h's fixture hands every test a comm
# made by weft_comm_split instead of weft_comm_create). Included from
# mpi_tests/CMakeLists.txt, which defines weft_add_mpi_test_binary /
# weft_add_mpi_suite (and collectives.cmake WEFT_COLL_FILTER).
#
# Matrix: comm_split at np 1, 3, 4 (odd and even group sizes, groups of one
# at np 1) over shm, tcp and vnodes2; the p2p suite np 4 shm and the
# collectives suite np 4 vnodes2 on split comms. Measured on the 2-core
# machine, one entry after the other (others' builds running beside them):
# the 9 comm_split entries 4.7-7.3 s together (0.4-1.2 s each), 27 s under
# ASan/UBSan; p2p_split 5.0 s, coll_split 5.2 s.
#
# Label rerun: p2p_split and coll_split move data through the parent's pipes
# exactly as on the parent; what is split-specific (rank translation, traffic
# on parent and child, destroy order) is in the comm_split entries. CI
# (.ci/run) leaves rerun out of the ASan/UBSan pass; the -Werror pass runs them.
weft_add_mpi_test_binary(weft_mpi_comm_split test_comm_split.cc)
weft_add_mpi_suite(NAME comm_split BINARY weft_mpi_comm_split NPS 1 3 4 CONFIGS shm tcp vnodes2
                   LABELS "comm;split" TIMEOUT 120)

weft_add_mpi_suite(NAME p2p_split BINARY weft_mpi_p2p NPS 4 CONFIGS shm
                   GTEST_FILTER "-*Huge*" LABELS "p2p;split;rerun" ENV WEFT_TEST_COMM=split TIMEOUT 300)
if(TARGET weft_mpi_coll)
  weft_add_mpi_suite(NAME coll_split BINARY weft_mpi_coll NPS 4 CONFIGS vnodes2
                     GTEST_FILTER ${WEFT_COLL_FILTER} LABELS "coll;split;rerun" ENV WEFT_TEST_COMM=split TIMEOUT 300)
endif()
