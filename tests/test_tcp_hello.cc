// The TCP transport's connection hello (p2p/transport/tcp/tcp_hello.h): a connection that
// presents a wrong job token is rejected before anything past the token is
// read; a good one is accepted.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <sys/socket.h>
#include <unistd.h>

#include "weft.h"

extern "C" {
#include "tcp_hello.h"
#include "transport.h"
}

namespace {

const uint64_t kMyToken = 0x1234abcd5678ef01ull;

struct SocketPair {
    int fds[2] = {-1, -1};
    SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0); }
    ~SocketPair() {
        for (int fd : fds)
            if (fd >= 0)
                close(fd);
    }
    int connector() const { return fds[0]; }
    int acceptor() const { return fds[1]; }
};

weft_tcp_hello make_hello(uint64_t token, int rank = 0, int index = 0)
{
    weft_tcp_hello h;
    memset(&h, 0, sizeof(h));
    h.token = token;
    h.rank = rank;
    h.index = index;
    h.streams = 4;
    h.chunk = 512 << 10;
    h.eager_limit = 65536;
    return h;
}

void write_all(int fd, const void *p, size_t n)
{
    ASSERT_EQ(send(fd, p, n, 0), (ssize_t)n);
}

// Bytes still unread on fd (non-blocking).
std::string drain(int fd)
{
    std::string out;
    char buf[256];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
        out.append(buf, (size_t)n);
    return out;
}

}  // namespace

TEST(TcpHello, GoodTokenIsAcceptedAndNothingPastTheHelloIsRead)
{
    SocketPair sp;
    weft_tcp_hello h = make_hello(kMyToken, 3, 2);
    write_all(sp.connector(), &h, sizeof(h));
    write_all(sp.connector(), "FRAME", 5);

    weft_tcp_hello got_h;
    size_t got = 0;
    char why[256] = "";
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_SUCCESS) << why;
    EXPECT_EQ(got, sizeof(h));
    EXPECT_EQ(got_h.rank, 3);
    EXPECT_EQ(got_h.index, 2);
    EXPECT_EQ(drain(sp.acceptor()), "FRAME");
}

TEST(TcpHello, WrongTokenIsRejectedAfterReadingOnlyTheToken)
{
    SocketPair sp;
    weft_tcp_hello h = make_hello(kMyToken ^ 1);
    write_all(sp.connector(), &h, sizeof(h));
    write_all(sp.connector(), "FRAME", 5);

    weft_tcp_hello got_h;
    size_t got = 0;
    char why[256] = "";
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(why).find("token"), std::string::npos) << why;
    EXPECT_EQ(got, sizeof(h.token));
    // Everything after the token is still unread.
    EXPECT_EQ(drain(sp.acceptor()).size(), sizeof(h) - sizeof(h.token) + 5);
}

TEST(TcpHello, HelloInPiecesNeedsMoreThenSucceeds)
{
    SocketPair sp;
    weft_tcp_hello h = make_hello(kMyToken);
    weft_tcp_hello got_h;
    size_t got = 0;
    char why[256] = "";
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_EAGAIN);
    write_all(sp.connector(), &h, 5);   // part of the token
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_EAGAIN);
    EXPECT_EQ(got, 5u);
    write_all(sp.connector(), (const char *)&h + 5, 10);
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_EAGAIN);
    write_all(sp.connector(), (const char *)&h + 15, sizeof(h) - 15);
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_SUCCESS);
    EXPECT_EQ(memcmp(&got_h, &h, sizeof(h)), 0);
}

TEST(TcpHello, ConnectionClosedMidHelloIsRejected)
{
    SocketPair sp;
    weft_tcp_hello h = make_hello(kMyToken);
    write_all(sp.connector(), &h, 12);
    close(sp.fds[0]);
    sp.fds[0] = -1;
    weft_tcp_hello got_h;
    size_t got = 0;
    char why[256] = "";
    EXPECT_EQ(weft_tcp_hello_recv(sp.acceptor(), &got_h, &got, kMyToken, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(why).find("closed"), std::string::npos) << why;
}

TEST(TcpHello, CheckRejectsUnknownRanksIndicesAndSettings)
{
    char why[256];
    weft_tcp_hello h = make_hello(kMyToken, 1, 0);
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_SUCCESS);
    h.index = 4;   // last data socket
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_SUCCESS);

    h = make_hello(kMyToken, 7, 0);   // rank outside the comm
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    h = make_hello(kMyToken, -1, 0);
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    h = make_hello(kMyToken, 2, 0);   // my own rank
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    h = make_hello(kMyToken, 1, 5);   // index past the last data socket
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    h = make_hello(kMyToken, 1, -1);
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    h = make_hello(kMyToken, 1, 0);   // different WEFT_TCP_STREAMS
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 3, 512 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(why).find("WEFT_TCP_STREAMS"), std::string::npos) << why;
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 256 << 10, 65536, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_EQ(weft_tcp_hello_check(&h, 2, 4, 4, 512 << 10, 4096, why, sizeof(why)), WEFT_ERR_TRANSPORT);
    EXPECT_NE(std::string(why).find("WEFT_TCP_EAGER"), std::string::npos) << why;
}
