#include "common/inf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct inf_arena_block {
    struct inf_arena_block *next;
    size_t size; /* usable bytes in data[] */
    size_t used;
    _Alignas(16) unsigned char data[];
};

#define ARENA_ALIGN 16

void inf_arena_init(struct inf_arena *a, size_t block_size)
{
    a->head = NULL;
    a->block_size = block_size ? block_size : 4096;
    a->used_total = 0;
}

void inf_arena_fini(struct inf_arena *a)
{
    if (!a)
        return;
    struct inf_arena_block *b = a->head;
    while (b) {
        struct inf_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used_total = 0;
}

void inf_arena_reset(struct inf_arena *a)
{
    if (!a->head)
        return;
    /* Keep the oldest block (the first allocated, usually the default size). */
    struct inf_arena_block *b = a->head, *last = NULL;
    while (b) {
        struct inf_arena_block *next = b->next;
        if (!next)
            last = b;
        else
            free(b);
        b = next;
    }
    last->used = 0;
    last->next = NULL;
    a->head = last;
    a->used_total = 0;
}

void *inf_arena_alloc(struct inf_arena *a, size_t size)
{
    if (size > SIZE_MAX / 2)
        return NULL;
    size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (need == 0)
        need = ARENA_ALIGN;
    struct inf_arena_block *b = a->head;
    if (!b || b->size - b->used < need) {
        size_t bsize = need > a->block_size ? need : a->block_size;
        b = malloc(sizeof *b + bsize);
        if (!b)
            return NULL;
        b->size = bsize;
        b->used = 0;
        if (a->head && need > a->block_size) {
            /* A large one-off: slot it behind the current block so the
             * current block's free space stays usable. */
            b->next = a->head->next;
            a->head->next = b;
            b->used = need;
            a->used_total += need;
            return b->data;
        }
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += need;
    a->used_total += need;
    return p;
}

void *inf_arena_calloc(struct inf_arena *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = inf_arena_alloc(a, n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

char *inf_arena_strndup(struct inf_arena *a, const char *s, size_t n)
{
    char *p = inf_arena_alloc(a, n + 1);
    if (!p)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *inf_arena_strdup(struct inf_arena *a, const char *s)
{
    return inf_arena_strndup(a, s, strlen(s));
}

char *inf_arena_sprintf(struct inf_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return NULL;
    }
    char *p = inf_arena_alloc(a, (size_t)n + 1);
    if (p)
        vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}
