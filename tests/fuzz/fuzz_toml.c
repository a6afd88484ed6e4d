/* Fuzz the TOML reader: any input either parses into a tree that keeps the
 * reader's promises, or fails with a "line L, column C: ..." message. */
#include "common/inf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

static void check_node(const struct inf_toml_node *t, int depth)
{
    CHECK(depth < 64);
    size_t n = 0;
    for (const struct inf_toml_node *c = t->first; c; c = c->next, n++) {
        CHECK(c->line >= 1 && c->col >= 1);
        if (t->type == INF_TOML_TABLE) {
            /* Keys are unique, so a lookup finds this very node. */
            CHECK(c->key != NULL);
            CHECK(inf_toml_get(t, c->key) == c);
        } else {
            CHECK(c->key == NULL);
            CHECK(c->type != INF_TOML_TABLE && c->type != INF_TOML_ARRAY);
        }
        if (c->type == INF_TOML_STRING)
            CHECK(c->str[c->str_len] == '\0' && strlen(c->str) == c->str_len);
        if (c->type == INF_TOML_TABLE || c->type == INF_TOML_ARRAY)
            check_node(c, depth + 1);
        if (!c->next)
            CHECK(t->last == c);
    }
    CHECK(n == t->count);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct inf_arena a;
    struct inf_toml_node *root = NULL;
    struct inf_err err = {0};
    inf_arena_init(&a, 0);
    inf_status_t st = inf_toml_parse((const char *)data, size, &a, &root, &err);
    if (st == INF_OK) {
        CHECK(root != NULL && root->type == INF_TOML_TABLE);
        check_node(root, 0);
    } else {
        CHECK(root == NULL);
        CHECK(st == INF_E_FORMAT || st == INF_E_NOMEM);
        CHECK(err.code == st);
        CHECK(st != INF_E_FORMAT || strncmp(err.msg, "line ", 5) == 0);
    }
    inf_arena_fini(&a);
    return 0;
}
