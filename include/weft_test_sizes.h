/*
 * Sizes of weft's internal records that its own tests and benchmarks
 * compare against. Not API, not installed: bench/ and tests/ include it
 * instead of the library's internal headers. tests/test_registry.cc checks
 * every value against the library.
 */
#ifndef WEFT_TEST_SIZES_H
#define WEFT_TEST_SIZES_H

/* One rank card: the header plus every transport's blob (p2p/setup.c),
 * exchanged once per weft_comm_create by the bootstrap's allgather. */
#define WEFT_TEST_RANK_CARD_BYTES 392

#endif
