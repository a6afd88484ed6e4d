#include "common/inf.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

volatile int inf_log_level_current = INF_LOG_INFO;
static volatile int log_fd = 2;

void inf_log_set_level(enum inf_log_level level)
{
    inf_log_level_current = (int)level;
}

void inf_log_set_fd(int fd)
{
    log_fd = fd;
}

bool inf_log_level_parse(const char *s, enum inf_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum inf_log_level)i;
            return true;
        }
    }
    return false;
}

void inf_log_write(enum inf_log_level level, const char *module, const char *file, int line,
                   const char *fmt, ...)
{
    static const char letters[] = "DIWE";
    char buf[2048];
    struct timespec ts;
    struct tm tm;
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s %s:%d ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, letters[level & 3], module, base, line);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = sizeof buf - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    /* One line per event: fold any newline in the message. */
    for (size_t i = (size_t)n; i < len; i++)
        if (buf[i] == '\n' || buf[i] == '\r')
            buf[i] = ' ';
    buf[len++] = '\n';
    ssize_t w = write(log_fd, buf, len);
    (void)w;
}

uint64_t inf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
