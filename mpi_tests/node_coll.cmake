# Node-local collectives in shared memory (collectives/node_coll.c): the
# path's own properties (test_node_coll.cc's header). The kinds' results are
# checked by the coll, reductions, gather and a2a suites, whose shm entries
# take this path at small sizes. Included from mpi_tests/CMakeLists.txt.
#
# Matrix:
#   np 2, 3, 4, 8   shm        the path taken (np 8: 4 ranks a core)
#   np 3            shm with WEFT_NODE_COLL_KB=0: not taken, the same
#                   sequence as messages
#   np 3, 4, 8      vnodes2: the small calls through each node's segment
#                   and among the heads (node_hier.c; np 3: nodes of 2 and
#                   1 ranks, np 4: 2 and 2, np 8: 4 and 4, where a gather
#                   goes that way too)
weft_add_mpi_test_binary(weft_mpi_node_coll test_node_coll.cc)
weft_add_mpi_suite(NAME node_coll BINARY weft_mpi_node_coll NPS 2 3 4 8 CONFIGS shm
                   LABELS "coll;node_coll" TIMEOUT 180)
weft_add_mpi_suite(NAME node_coll BINARY weft_mpi_node_coll NPS 3 4 8 CONFIGS vnodes2
                   LABELS "coll;node_coll" TIMEOUT 180)
weft_add_mpi_suite(NAME node_coll_off BINARY weft_mpi_node_coll NPS 3 CONFIGS shm
                   LABELS "coll;node_coll" ENV WEFT_NODE_COLL_KB=0 TIMEOUT 180)
