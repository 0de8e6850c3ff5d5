/*
 * GoogleTest main for tests launched by mpirun.
 *
 * Rank 0 prints GoogleTest's usual report; the other ranks print only their
 * failed assertions (prefixed with the rank), so the log stays readable at
 * np 8 and a failure on rank 3 still shows where it happened. The fixture
 * in weft_mpi_test.h makes every rank's failure fail the test on all ranks;
 * the exit code is additionally reduced over ranks, so mpirun (and ctest)
 * sees a failure whichever rank had it.
 */
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

/* Prints failed assertions of a rank whose default printer was removed. */
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
public:
    explicit RankFailurePrinter(int rank) : rank_(rank) {}

    /* The name is remembered here: UnitTest::current_test_info() takes a
     * lock GoogleTest already holds while it reports a part result. */
    void OnTestStart(const ::testing::TestInfo &t) override
    {
        test_ = std::string(t.test_suite_name()) + "." + t.name();
    }

    void OnTestPartResult(const ::testing::TestPartResult &r) override
    {
        if (!r.failed())
            return;
        std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                     r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
        std::fflush(stderr);
    }

private:
    int rank_;
    std::string test_ = "(outside a test)";
};

} // namespace

int main(int argc, char **argv)
{
    int provided = 0;
    /* WEFT_TEST_MPI_THREAD=single: MPI at MPI_THREAD_SINGLE, for the
     * entries that test what a program at that level gets (the drop-in's
     * serialized comms); otherwise MPI_THREAD_MULTIPLE is asked for. */
    const char *level = std::getenv("WEFT_TEST_MPI_THREAD");
    const int want = level && std::strcmp(level, "single") == 0 ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE;
    if (MPI_Init_thread(&argc, &argv, want, &provided) != MPI_SUCCESS) {
        std::fprintf(stderr, "MPI_Init_thread failed\n");
        return 1;
    }
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* Tests with two threads calling weft need no MPI threading themselves
     * (only the main thread calls MPI), but say so if the level is lower. */
    if (want == MPI_THREAD_MULTIPLE && provided < MPI_THREAD_MULTIPLE && rank == 0)
        std::fprintf(stderr, "note: MPI provides thread level %d, not MPI_THREAD_MULTIPLE\n", provided);

    ::testing::InitGoogleTest(&argc, argv);
    if (rank != 0) {
        ::testing::TestEventListeners &listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
        listeners.Append(new RankFailurePrinter(rank));
    }

    int local = RUN_ALL_TESTS();
    int global = 0;
    MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && global != 0 && local == 0)
        std::fprintf(stderr, "a test failed on a rank other than 0\n");
    MPI_Finalize();
    return global != 0 ? 1 : 0;
}
