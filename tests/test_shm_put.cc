/*
 * weft_shm_put (src/core/shmput.h): the copy into a node-local segment,
 * plain or streamed. Whatever the alignment of either end and the size,
 * the streamed copy (weft_shm_put_streamed: its body starts at dst's
 * first 64-byte line, the head before it and the tail after it are plain
 * copies) and weft_shm_put at every threshold leave dst as src and
 * nothing around it changed.
 */
#include <gtest/gtest.h>

#include <cstdint>
#include <cstddef>
#include <cstring>
#include <vector>

extern "C" {
#include "shmput.h"
}

TEST(ShmPut, EveryAlignmentSizeAndThreshold)
{
    const size_t guard = 128;
    const size_t sizes[] = {0, 1, 15, 63, 64, 65, 127, 4095, 32767, 32768, 32769, 100003};
    /* SIZE_MAX: weft_shm_put_streamed itself; then weft_shm_put never
     * streaming, from 1 byte, from a line, from the default. */
    const size_t mins[] = {SIZE_MAX, 0, 1, 64, 32768};
    std::vector<unsigned char> src(100003 + 2 * guard), dst(100003 + 2 * guard + 64);
    for (size_t i = 0; i < src.size(); i++)
        src[i] = (unsigned char)(i * 131 + 7);
    size_t bad = 0;
    for (size_t n : sizes)
        for (size_t m : mins)
            for (size_t so : {size_t(0), size_t(1), size_t(8), size_t(33)})
                for (size_t dofs : {size_t(0), size_t(1), size_t(16), size_t(63)}) {
                    std::memset(dst.data(), 0xa5, dst.size());
                    unsigned char *d = dst.data() + guard + dofs;
                    if (m == SIZE_MAX)
                        weft_shm_put_streamed(d, src.data() + so, n);
                    else
                        weft_shm_put(d, src.data() + so, n, m);
                    if (std::memcmp(d, src.data() + so, n) != 0)
                        bad++, ADD_FAILURE() << "n " << n << " min " << m << " src+" << so << " dst+" << dofs
                                             << ": copy differs";
                    for (unsigned char *p = dst.data(); p < d; p++)
                        bad += *p != 0xa5;
                    for (unsigned char *p = d + n; p < dst.data() + dst.size(); p++)
                        bad += *p != 0xa5;
                }
    EXPECT_EQ(bad, 0u) << "bytes outside the copy changed (or copies differed)";
}
