/*
 * GPU-NIC affinity (src/core/topo.c) over the hand-written hwloc XML topologies
 * of tests/topo/: the exact GPU -> NIC map and distance of every file, the
 * spreading rule, errors, weft_topo_find_gpu, weft_topo_describe, and this
 * machine's own topology.
 */
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

extern "C" {
#include "topo.h"
}
#include "weft.h"

#ifndef WEFT_TOPO_XML_DIR
#error "tests/CMakeLists.txt defines WEFT_TOPO_XML_DIR (the tests/topo directory)"
#endif

namespace {

enum { SW = WEFT_TOPO_SAME_SWITCH, HB = WEFT_TOPO_SAME_HOSTBRIDGE, NUMA = WEFT_TOPO_SAME_NUMA,
       SYS = WEFT_TOPO_SYSTEM };

std::string xml(const char *name)
{
    return std::string(WEFT_TOPO_XML_DIR) + "/" + name;
}

struct weft_topo load_ok(const std::string &path)
{
    struct weft_topo t;
    memset(&t, 0, sizeof t);
    char why[256] = "";
    int rc = weft_topo_load(path.c_str(), &t, why, sizeof why);
    EXPECT_EQ(rc, WEFT_SUCCESS) << path << ": " << why;
    return t;
}

struct Expected {
    const char *file;
    std::vector<std::string> gpus;      /* name, or bus id when it has none */
    std::vector<std::string> gpu_busids;
    std::vector<std::string> nics;
    std::vector<std::string> nic_busids;
    std::vector<int> gpu_nic;
    std::vector<int> distance;
};

const std::vector<Expected> &expected()
{
    static const std::vector<Expected> all = {
        /* One socket; two switches, each 1 GPU + 1 NIC; a BMC VGA (not NVIDIA). */
        { "2gpu-2nic.xml",
          { "cuda0", "cuda1" }, { "0000:04:00.0", "0000:08:00.0" },
          { "mlx5_0", "mlx5_1" }, { "0000:05:00.0", "0000:09:00.0" },
          { 0, 1 }, { SW, SW } },
        /* Two sockets, two switches each holding GPU, NIC, GPU. */
        { "8gpu-4nic.xml",
          { "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7" },
          { "0000:03:00.0", "0000:05:00.0", "0000:08:00.0", "0000:0a:00.0",
            "0000:83:00.0", "0000:85:00.0", "0000:88:00.0", "0000:8a:00.0" },
          { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" },
          { "0000:04:00.0", "0000:09:00.0", "0000:84:00.0", "0000:89:00.0" },
          { 0, 0, 1, 1, 2, 2, 3, 3 }, { SW, SW, SW, SW, SW, SW, SW, SW } },
        /* DGX-like: 4 switches (each on its own host bridge, two per socket)
         * of 2 GPUs + 2 NICs + NVMe; NVSwitches (NVIDIA, class 0680) too. */
        { "dgx-8gpu-8nic.xml",
          { "cuda0", "cuda1", "cuda2", "cuda3", "cuda4", "cuda5", "cuda6", "cuda7" },
          { "0000:03:00.0", "0000:05:00.0", "0000:43:00.0", "0000:45:00.0",
            "0000:83:00.0", "0000:85:00.0", "0000:c3:00.0", "0000:c5:00.0" },
          { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7" },
          { "0000:04:00.0", "0000:06:00.0", "0000:44:00.0", "0000:46:00.0",
            "0000:84:00.0", "0000:86:00.0", "0000:c4:00.0", "0000:c6:00.0" },
          { 0, 1, 2, 3, 4, 5, 6, 7 }, { SW, SW, SW, SW, SW, SW, SW, SW } },
        /* One NIC per socket, on the host bridge of the socket's first GPU
         * switch; the second switch is on another host bridge. GPUs without
         * OS devices (no name); NVIDIA audio functions are not GPUs. */
        { "8gpu-2nic.xml",
          { "", "", "", "", "", "", "", "" },
          { "0000:03:00.0", "0000:04:00.0", "0000:23:00.0", "0000:24:00.0",
            "0000:83:00.0", "0000:84:00.0", "0000:a3:00.0", "0000:a4:00.0" },
          { "mlx5_0", "mlx5_1" }, { "0000:05:00.0", "0000:85:00.0" },
          { 0, 0, 0, 0, 1, 1, 1, 1 }, { HB, HB, NUMA, NUMA, HB, HB, NUMA, NUMA } },
        /* Two dual-port NICs (functions .0/.1), one per switch with a GPU. */
        { "2gpu-4nic.xml",
          { "nvml0", "nvml1" }, { "0000:03:00.0", "0000:07:00.0" },
          { "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3" },
          { "0000:04:00.0", "0000:04:00.1", "0000:08:00.0", "0000:08:00.1" },
          { 0, 2 }, { SW, SW } },
        /* Socket 0: a GPU-only switch (lowest buses), two switches of
         * 1 GPU + 1 NIC, a GeForce (class 0300, no name) on a root port;
         * socket 1: a GPU-only switch and no NIC at all. */
        { "partial-nics.xml",
          { "cuda0", "cuda1", "cuda2", "cuda3", "", "cuda4", "cuda5" },
          { "0000:03:00.0", "0000:04:00.0", "0000:07:00.0", "0000:0b:00.0", "0000:0d:00.0",
            "0000:83:00.0", "0000:84:00.0" },
          { "mlx5_0", "mlx5_1" }, { "0000:08:00.0", "0000:0c:00.0" },
          { 0, 1, 0, 1, 0, 1, 0 }, { HB, HB, SW, SW, HB, SYS, SYS } },
        /* Two-level switch: cuda0 on the level-1 switch, cuda1 and mlx5_0
         * under a level-2 switch, mlx5_1 on the level-1 switch. cuda1's only
         * nearest NIC is mlx5_0, so cuda0 gets mlx5_1 although mlx5_0 has
         * the lower bus id. */
        { "nested-switch.xml",
          { "cuda0", "cuda1" }, { "0000:03:00.0", "0000:07:00.0" },
          { "mlx5_0", "mlx5_1" }, { "0000:06:00.0", "0000:08:00.0" },
          { 1, 0 }, { SW, SW } },
        /* docs/design.md's picture: switch A (GPU0, GPU1, NIC0) and switch B
         * (GPU2, NIC1) on host bridge 0, switch C (GPU3, GPU4) on host
         * bridge 1 of the same package: GPU3 takes the less loaded NIC1,
         * GPU4 then NIC0 (tie, lower bus id). */
        { "design-example.xml",
          { "cuda0", "cuda1", "cuda2", "cuda3", "cuda4" },
          { "0000:03:00.0", "0000:04:00.0", "0000:08:00.0", "0000:43:00.0", "0000:44:00.0" },
          { "mlx5_0", "mlx5_1" }, { "0000:05:00.0", "0000:09:00.0" },
          { 0, 0, 1, 1, 0 }, { SW, SW, SW, NUMA, NUMA } },
        /* GPUs, and an Ethernet port without RDMA. */
        { "gpus-no-nic.xml",
          { "cuda0", "cuda1" }, { "0000:03:00.0", "0000:04:00.0" },
          { }, { },
          { -1, -1 }, { 0, 0 } },
    };
    return all;
}

const char *dist_name(int d)
{
    switch (d) {
    case SW: return "switch";
    case HB: return "hostbridge";
    case NUMA: return "numa";
    case SYS: return "system";
    default: return "none";
    }
}

} // namespace

TEST(Topo, EveryFixtureHasItsExactMap)
{
    for (const Expected &e : expected()) {
        SCOPED_TRACE(e.file);
        struct weft_topo t = load_ok(xml(e.file));
        ASSERT_EQ(t.ngpus, (int)e.gpus.size());
        ASSERT_EQ(t.nnics, (int)e.nics.size());
        for (int g = 0; g < t.ngpus; g++) {
            EXPECT_EQ(t.gpus[g].name, e.gpus[g]) << "gpu " << g;
            EXPECT_EQ(t.gpus[g].busid, e.gpu_busids[g]) << "gpu " << g;
            EXPECT_EQ(t.gpu_nic[g], e.gpu_nic[g]) << "gpu " << g << " (" << e.gpu_busids[g] << ")";
            EXPECT_EQ(t.gpu_nic_distance[g], e.distance[g])
                << "gpu " << g << ": " << dist_name(t.gpu_nic_distance[g]) << " vs " << dist_name(e.distance[g]);
        }
        for (int n = 0; n < t.nnics; n++) {
            EXPECT_EQ(t.nics[n].name, e.nics[n]) << "nic " << n;
            EXPECT_EQ(t.nics[n].busid, e.nic_busids[n]) << "nic " << n;
        }
    }
}

/* Every XML file in tests/topo has its entry above, so none goes untested. */
TEST(Topo, EveryFixtureIsListed)
{
    DIR *d = opendir(WEFT_TOPO_XML_DIR);
    ASSERT_NE(d, nullptr) << WEFT_TOPO_XML_DIR;
    int files = 0;
    for (struct dirent *ent; (ent = readdir(d)) != nullptr;) {
        std::string name = ent->d_name;
        if (name.size() < 4 || name.compare(name.size() - 4, 4, ".xml") != 0)
            continue;
        files++;
        bool listed = false;
        for (const Expected &e : expected())
            listed = listed || name == e.file;
        EXPECT_TRUE(listed) << name << " has no expected map in test_topo.cc";
    }
    closedir(d);
    EXPECT_EQ(files, (int)expected().size());
}

/* The spreading rule: no NIC serves two GPUs while another NIC serves none
 * (every fixture's counts and layout allow that); and loading twice gives
 * the same map. */
TEST(Topo, GpusAreSpreadOverEquallyNearNics)
{
    for (const Expected &e : expected()) {
        SCOPED_TRACE(e.file);
        struct weft_topo t = load_ok(xml(e.file));
        if (t.nnics == 0)
            continue;
        std::vector<int> load(t.nnics, 0);
        for (int g = 0; g < t.ngpus; g++) {
            ASSERT_GE(t.gpu_nic[g], 0);
            ASSERT_LT(t.gpu_nic[g], t.nnics);
            load[t.gpu_nic[g]]++;
        }
        int most = 0, idle = 0;
        for (int n = 0; n < t.nnics; n++) {
            most = std::max(most, load[n]);
            idle += load[n] == 0;
        }
        EXPECT_FALSE(most >= 2 && idle > 0) << "a NIC serves " << most << " GPUs while " << idle << " serve none";

        struct weft_topo again = load_ok(xml(e.file));
        for (int g = 0; g < t.ngpus; g++) {
            EXPECT_EQ(again.gpu_nic[g], t.gpu_nic[g]);
            EXPECT_EQ(again.gpu_nic_distance[g], t.gpu_nic_distance[g]);
        }
    }
}

TEST(Topo, MissingFileIsAnErrorWithWhy)
{
    struct weft_topo t;
    memset(&t, 0xab, sizeof t);
    struct weft_topo before = t;
    char why[256] = "";
    std::string path = xml("no-such-topology.xml");
    EXPECT_EQ(weft_topo_load(path.c_str(), &t, why, sizeof why), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(why).find("no-such-topology.xml"), std::string::npos) << why;
    EXPECT_NE(std::string(why).find("No such file"), std::string::npos) << why;
    EXPECT_EQ(memcmp(&t, &before, sizeof t), 0) << "out was written on failure";
}

TEST(Topo, FileThatIsNotHwlocXmlIsAnErrorWithWhy)
{
    char path[] = "/tmp/weft-topo-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    const char junk[] = "this is not an hwloc topology\n";
    ASSERT_EQ(write(fd, junk, sizeof junk - 1), (ssize_t)(sizeof junk - 1));
    close(fd);

    struct weft_topo t;
    memset(&t, 0x5a, sizeof t);
    struct weft_topo before = t;
    char why[256] = "";
    EXPECT_EQ(weft_topo_load(path, &t, why, sizeof why), WEFT_ERR_INVALID_ARG);
    EXPECT_NE(std::string(why).find(path), std::string::npos) << why;
    EXPECT_EQ(memcmp(&t, &before, sizeof t), 0) << "out was written on failure";
    unlink(path);

    /* A directory opens but is no XML either. */
    why[0] = '\0';
    EXPECT_EQ(weft_topo_load(WEFT_TOPO_XML_DIR, &t, why, sizeof why), WEFT_ERR_INVALID_ARG);
    EXPECT_STRNE(why, "");
}

TEST(Topo, NullOutIsInvalidArg)
{
    char why[128] = "";
    EXPECT_EQ(weft_topo_load(xml("2gpu-2nic.xml").c_str(), nullptr, why, sizeof why), WEFT_ERR_INVALID_ARG);
    EXPECT_STRNE(why, "");
    /* why may be NULL / tiny. */
    EXPECT_EQ(weft_topo_load(xml("2gpu-2nic.xml").c_str(), nullptr, nullptr, 0), WEFT_ERR_INVALID_ARG);
    char tiny[4];
    EXPECT_EQ(weft_topo_load("/nonexistent/topo.xml", nullptr, tiny, sizeof tiny), WEFT_ERR_INVALID_ARG);
    EXPECT_EQ(strlen(tiny), 3u);
}

TEST(Topo, FindGpuByBusId)
{
    struct weft_topo t = load_ok(xml("dgx-8gpu-8nic.xml"));
    EXPECT_EQ(weft_topo_find_gpu(&t, "0000:03:00.0"), 0);
    EXPECT_EQ(weft_topo_find_gpu(&t, "0000:C5:00.0"), 7);       /* any case */
    EXPECT_EQ(weft_topo_find_gpu(&t, "0000:c5:00.0"), 7);
    EXPECT_EQ(weft_topo_find_gpu(&t, "00000000:43:00.0"), 2);   /* CUDA's 8-digit domain */
    EXPECT_EQ(weft_topo_find_gpu(&t, "45:00.0"), 3);            /* no domain */
    EXPECT_EQ(weft_topo_find_gpu(&t, "0:83:0.0"), 4);           /* short fields */
    EXPECT_EQ(weft_topo_find_gpu(&t, "0000:04:00.0"), -1);      /* a NIC */
    EXPECT_EQ(weft_topo_find_gpu(&t, "0001:03:00.0"), -1);      /* other domain */
    EXPECT_EQ(weft_topo_find_gpu(&t, "0000:03:00.1"), -1);
    for (const char *bad : { "", "0000", "0000:03", "0000:03:00", "0000:03:00.", "0000:03:00.0x",
                             "0000:03:00.8", "0000:03:20.0", "0000:103:00.0", "zz:00.0", "0000:03:00.0 ",
                             " 0000:03:00.0", "123456789:03:00.0", "0000:03:00:00.0" })
        EXPECT_EQ(weft_topo_find_gpu(&t, bad), -1) << '"' << bad << '"';
    EXPECT_EQ(weft_topo_find_gpu(&t, nullptr), -1);
    EXPECT_EQ(weft_topo_find_gpu(nullptr, "0000:03:00.0"), -1);

    struct weft_topo p = load_ok(xml("partial-nics.xml"));
    EXPECT_EQ(weft_topo_find_gpu(&p, "0000:0d:00.0"), 4);       /* the GPU without a name */
}

TEST(Topo, DescribeNamesEveryGpuItsNicAndDistance)
{
    char buf[4096];
    struct weft_topo t = load_ok(xml("2gpu-2nic.xml"));
    weft_topo_describe(&t, buf, sizeof buf);
    EXPECT_STREQ(buf, "cuda0 -> mlx5_0 (same PCIe switch)\n"
                      "cuda1 -> mlx5_1 (same PCIe switch)\n");

    t = load_ok(xml("8gpu-2nic.xml"));
    weft_topo_describe(&t, buf, sizeof buf);
    EXPECT_STREQ(buf, "0000:03:00.0 -> mlx5_0 (same host bridge)\n"
                      "0000:04:00.0 -> mlx5_0 (same host bridge)\n"
                      "0000:23:00.0 -> mlx5_0 (same NUMA node)\n"
                      "0000:24:00.0 -> mlx5_0 (same NUMA node)\n"
                      "0000:83:00.0 -> mlx5_1 (same host bridge)\n"
                      "0000:84:00.0 -> mlx5_1 (same host bridge)\n"
                      "0000:a3:00.0 -> mlx5_1 (same NUMA node)\n"
                      "0000:a4:00.0 -> mlx5_1 (same NUMA node)\n");

    t = load_ok(xml("partial-nics.xml"));
    weft_topo_describe(&t, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("cuda5 -> mlx5_0 (across sockets)\n"), std::string::npos) << buf;

    t = load_ok(xml("gpus-no-nic.xml"));
    weft_topo_describe(&t, buf, sizeof buf);
    EXPECT_STREQ(buf, "cuda0 -> no RDMA NIC\ncuda1 -> no RDMA NIC\n");

    struct weft_topo none;
    memset(&none, 0, sizeof none);
    none.nnics = 2;
    weft_topo_describe(&none, buf, sizeof buf);
    EXPECT_STREQ(buf, "no GPUs (2 RDMA NICs)\n");

    /* Truncation: always NUL-terminated, never past len. */
    t = load_ok(xml("dgx-8gpu-8nic.xml"));
    char full[4096];
    weft_topo_describe(&t, full, sizeof full);
    for (size_t len : { (size_t)1, (size_t)2, (size_t)10, (size_t)35, (size_t)36, (size_t)37, (size_t)100 }) {
        char small[128];
        memset(small, 'x', sizeof small);
        weft_topo_describe(&t, small, len);
        EXPECT_EQ(strlen(small), std::min(len - 1, strlen(full))) << len;
        EXPECT_EQ(std::string(full).compare(0, strlen(small), small), 0) << len;
        EXPECT_EQ(small[len], 'x') << len;
    }
    weft_topo_describe(&t, nullptr, 0);     /* no crash */
    buf[0] = 'x';
    weft_topo_describe(nullptr, buf, sizeof buf);
    EXPECT_STREQ(buf, "");
}

/* NVIDIA VGA/3D controllers that sysfs shows on this machine. */
static int sysfs_nvidia_gpus()
{
    int count = 0;
    DIR *d = opendir("/sys/bus/pci/devices");
    if (d == nullptr)
        return 0;
    for (struct dirent *ent; (ent = readdir(d)) != nullptr;) {
        if (ent->d_name[0] == '.')
            continue;
        std::string dir = std::string("/sys/bus/pci/devices/") + ent->d_name;
        std::string vendor, cls;
        std::ifstream(dir + "/vendor") >> vendor;
        std::ifstream(dir + "/class") >> cls;
        if (vendor == "0x10de" && (cls.rfind("0x0300", 0) == 0 || cls.rfind("0x0302", 0) == 0))
            count++;
    }
    closedir(d);
    return count;
}

/* This machine (NULL or "" path): loads, and finds the GPUs sysfs shows
 * (none on the CI machines). */
TEST(Topo, ThisMachineLoads)
{
    for (const char *path : { (const char *)nullptr, "" }) {
        struct weft_topo t;
        memset(&t, 0, sizeof t);
        char why[256] = "";
        ASSERT_EQ(weft_topo_load(path, &t, why, sizeof why), WEFT_SUCCESS) << why;
        EXPECT_EQ(t.ngpus, sysfs_nvidia_gpus());
        EXPECT_GE(t.nnics, 0);
        EXPECT_LE(t.nnics, WEFT_TOPO_MAX_NICS);
        for (int g = 0; g < t.ngpus; g++)
            EXPECT_TRUE(t.nnics == 0 ? t.gpu_nic[g] == -1 : (t.gpu_nic[g] >= 0 && t.gpu_nic[g] < t.nnics));
        char buf[4096];
        weft_topo_describe(&t, buf, sizeof buf);
        EXPECT_STRNE(buf, "");
    }
}
