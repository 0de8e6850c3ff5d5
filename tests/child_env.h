/*
 * Child processes with an environment of their own, for the tests of what
 * is read from the process environment itself (the default lookup of
 * weft_config_load, WEFT_DEBUG before any comm, the emulators' knobs):
 * this executable started again (posix_spawn of /proc/self/exe) with an
 * explicit environment array, so that no test writes its own process's
 * environment (issue 27: no setenv in the tree; the settings of a comm go
 * in its configuration, weft_config_t).
 */
#ifndef WEFT_TESTS_CHILD_ENV_H
#define WEFT_TESTS_CHILD_ENV_H

#include <gtest/gtest.h>

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace weft_childenv {

using Vars = std::vector<std::pair<std::string, std::string>>;

/* This process's environment without the variables named in drop or in
 * set, then set's, as NAME=value strings. */
inline std::vector<std::string> environment_with(const Vars &set, const std::vector<std::string> &drop = {})
{
    auto named = [](const char *entry, const std::string &name) {
        return std::strncmp(entry, name.c_str(), name.size()) == 0 && entry[name.size()] == '=';
    };
    std::vector<std::string> env;
    for (char **e = environ; e != nullptr && *e != nullptr; e++) {
        bool keep = true;
        for (const std::string &d : drop)
            keep = keep && !named(*e, d);
        for (const auto &kv : set)
            keep = keep && !named(*e, kv.first);
        if (keep)
            env.push_back(*e);
    }
    for (const auto &kv : set)
        env.push_back(kv.first + "=" + kv.second);
    return env;
}

/* Runs this executable with args (after argv[0]) and env; what it writes on
 * stdout goes into *out (out NULL: this process's stdout). Returns its exit
 * status, 128 + the signal that ended it, or -1 when it could not start
 * (*why then says why). */
inline int run_self(const std::vector<std::string> &args, const std::vector<std::string> &env, std::string *out,
                    std::string *why = nullptr)
{
    std::string self = "/proc/self/exe";
    std::vector<char *> argv, envp;
    argv.push_back(&self[0]);
    std::vector<std::string> a = args, e = env;
    for (std::string &s : a)
        argv.push_back(&s[0]);
    argv.push_back(nullptr);
    for (std::string &s : e)
        envp.push_back(&s[0]);
    envp.push_back(nullptr);

    int fds[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (out != nullptr) {
        if (pipe2(fds, O_CLOEXEC) != 0) {
            if (why)
                *why = std::string("pipe: ") + std::strerror(errno);
            posix_spawn_file_actions_destroy(&fa);
            return -1;
        }
        posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    }
    std::fflush(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (out != nullptr)
        close(fds[1]);
    if (rc != 0) {
        if (why)
            *why = std::string("posix_spawn: ") + std::strerror(rc);
        if (out != nullptr)
            close(fds[0]);
        return -1;
    }
    if (out != nullptr) {
        char buf[4096];
        ssize_t n;
        while ((n = read(fds[0], buf, sizeof(buf))) != 0) {
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                break;
            out->append(buf, (size_t)n);
        }
        close(fds[0]);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

/* The GoogleTest variables a child run must not take from this one: its
 * report file would overwrite this run's, a shard would leave its test
 * out, a filter would replace its own. */
inline std::vector<std::string> gtest_run_variables()
{
    return {"GTEST_OUTPUT", "GTEST_FILTER", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "GTEST_SHARD_STATUS_FILE",
            "GTEST_REPEAT", "GTEST_SHUFFLE"};
}

/* Runs the current test again, alone, in a child process with env (its
 * output on this process's stdout). Returns the child's exit status: 0 when
 * the test passed there (or was skipped). */
inline int rerun_this_test(std::vector<std::string> env, std::string *why = nullptr)
{
    const ::testing::TestInfo *t = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string filter = std::string("--gtest_filter=") + t->test_suite_name() + "." + t->name();
    return run_self({filter}, env, nullptr, why);
}

}  // namespace weft_childenv

#endif
