/* toml_dump — the TOML reader's view of documents, for toml_diff.py.
 * stdin: records "<length>\n<bytes>"; stdout: one line per record,
 * "OK <json>" or "ERR <message>". Scalars are dumped as typed pairs
 * (["s", "text"], ["i", "12"], ["f", "1.5"], ["b", true]) so nothing is lost
 * to JSON's number model. */
#include "common/inf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_string(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void dump(const struct inf_toml_node *v)
{
    switch (v->type) {
    case INF_TOML_TABLE:
    case INF_TOML_ARRAY: {
        bool table = v->type == INF_TOML_TABLE;
        putchar(table ? '{' : '[');
        for (const struct inf_toml_node *c = v->first; c; c = c->next) {
            if (table) {
                put_string(c->key, strlen(c->key));
                putchar(':');
            }
            dump(c);
            if (c->next)
                putchar(',');
        }
        putchar(table ? '}' : ']');
        break;
    }
    case INF_TOML_STRING:
        printf("[\"s\",");
        put_string(v->str, v->str_len);
        putchar(']');
        break;
    case INF_TOML_INT:
        printf("[\"i\",\"%lld\"]", (long long)v->i);
        break;
    case INF_TOML_FLOAT:
        printf("[\"f\",\"%.17g\"]", v->f);
        break;
    case INF_TOML_BOOL:
        printf("[\"b\",%s]", v->b ? "true" : "false");
        break;
    }
}

int main(void)
{
    size_t len;
    while (scanf("%zu", &len) == 1 && getchar() == '\n') {
        char *buf = malloc(len ? len : 1);
        if (!buf || fread(buf, 1, len, stdin) != len)
            return 2;
        struct inf_arena a;
        struct inf_toml_node *root;
        struct inf_err err;
        inf_arena_init(&a, 0);
        if (inf_toml_parse(buf, len, &a, &root, &err) == INF_OK) {
            printf("OK ");
            dump(root);
        } else {
            printf("ERR %s", err.msg);
        }
        putchar('\n');
        inf_arena_fini(&a);
        free(buf);
    }
    return 0;
}
