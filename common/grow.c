/* common/grow.c — growing byte buffers (common/inf.h). */
#include "common/inf.h"

#include <stdint.h>
#include <stdlib.h>

bool inf_grow(char **p, size_t *cap, size_t need, size_t min)
{
    if (need <= *cap)
        return true;
    if (need > SIZE_MAX / 2)
        return false;
    size_t c = *cap ? *cap : min;
    while (c < need)
        c *= 2;
    char *np = realloc(*p, c);
    if (!np)
        return false;
    *p = np;
    *cap = c;
    return true;
}
