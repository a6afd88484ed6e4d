/* common/int_list.c — comma-separated integer lists (common/inf.h). */
#include "common/inf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

long inf_int_list_parse(const char *s, int64_t *out, size_t cap)
{
    if (!*s)
        return 0;
    long n = 0;
    for (const char *p = s;;) {
        char item[32];
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        if (len == 0 || len >= sizeof item)
            return -1;
        memcpy(item, p, len);
        item[len] = '\0';
        char *end;
        errno = 0;
        long long v = strtoll(item, &end, 10);
        if (end == item || *end != '\0' || errno == ERANGE)
            return -1;
        if ((size_t)n < cap)
            out[n] = (int64_t)v;
        n++;
        if (!comma)
            return n;
        p = comma + 1;
    }
}
