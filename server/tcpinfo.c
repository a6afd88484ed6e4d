/* tcpinfo.c — one field of the kernel's TCP_INFO that glibc's struct
 * tcp_info (netinet/tcp.h) lacks: the bytes a socket has received. It has
 * its own file because <linux/tcp.h>, which has the field, cannot be
 * included together with the headers libuv and libmicrohttpd bring in. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <linux/tcp.h>

uint64_t srv_tcp_bytes_received(int fd);

uint64_t srv_tcp_bytes_received(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return 0;
    return ti.tcpi_bytes_received;
}
