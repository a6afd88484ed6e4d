#include "common/inf.h"

#include <stdio.h>
#include <stdlib.h>

const char *inf_status_str(inf_status_t s)
{
    switch (s) {
#define INF_STATUS_CASE(name, val, str)                                        \
    case INF_##name:                                                           \
        return str;
        INF_STATUS_MAP(INF_STATUS_CASE)
#undef INF_STATUS_CASE
    }
    return "unknown status";
}

const char *inf_status_name(inf_status_t s)
{
    switch (s) {
#define INF_STATUS_CASE(name, val, str)                                        \
    case INF_##name:                                                           \
        return #name;
        INF_STATUS_MAP(INF_STATUS_CASE)
#undef INF_STATUS_CASE
    }
    return "UNKNOWN";
}

inf_status_t inf_err_set(struct inf_err *err, inf_status_t code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void inf_err_clear(struct inf_err *err)
{
    if (err) {
        err->code = INF_OK;
        err->msg[0] = '\0';
    }
}

void inf_assert_fail(const char *cond, const char *file, int line)
{
    fprintf(stderr, "assertion failed: %s (%s:%d)\n", cond, file, line);
    abort();
}
