/*
 * toml.c — a reader for the TOML subset described in common/inf.h.
 *
 * One pass over the text, no recursion but the one level an array adds. The
 * text is first checked to be UTF-8, so later stages only need to know about
 * ASCII. Every node lives in the caller's arena. Errors name the line and the
 * column (in characters, from 1) of the offending character.
 */
#include "common/inf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F_EXPLICIT 1u /* a table named by a [header] */
#define F_DOTTED 2u   /* a table created by a dotted key (a.b = 1) */

#define MAX_KEY_PARTS 16
#define MAX_NUMBER_LEN 128

struct parser {
    const char *p, *end;
    const char *line_start; /* first byte of the current line */
    int line;
    struct inf_arena *a;
    struct inf_err *err;
};

struct keypart {
    const char *s; /* NUL-terminated, in the arena */
    int line, col;
};

static int column(const struct parser *ps, const char *at)
{
    int col = 1;
    for (const char *q = ps->line_start; q < at; q++)
        if (((unsigned char)*q & 0xC0) != 0x80)
            col++;
    return col;
}

static inf_status_t fail_pos(struct parser *ps, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inf_status_t fail_pos(struct parser *ps, int line, int col, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return inf_err_set(ps->err, INF_E_FORMAT, "line %d, column %d: %s", line, col, what);
}

#define fail(ps, at, ...) fail_pos((ps), (ps)->line, column((ps), (at)), __VA_ARGS__)

static inf_status_t nomem(struct parser *ps)
{
    return inf_err_set(ps->err, INF_E_NOMEM, "out of memory while reading TOML");
}

static inf_status_t check_utf8(struct parser *ps)
{
    const char *q = ps->p;
    while (q < ps->end) {
        if (*q == '\n') {
            ps->line++;
            ps->line_start = ++q;
            continue;
        }
        bool valid;
        size_t n = inf_utf8_next(q, (size_t)(ps->end - q), &valid);
        if (!valid)
            return fail(ps, q, "invalid UTF-8");
        q += n;
    }
    ps->line = 1;
    ps->line_start = ps->p;
    return INF_OK;
}

static bool is_bare(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_control(unsigned char c)
{
    return (c < 0x20 && c != '\t') || c == 0x7F;
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t'))
        ps->p++;
}

static bool at_newline(const struct parser *ps)
{
    return ps->p < ps->end &&
           (*ps->p == '\n' || (*ps->p == '\r' && ps->p + 1 < ps->end && ps->p[1] == '\n'));
}

static void eat_newline(struct parser *ps)
{
    if (*ps->p == '\r')
        ps->p++;
    ps->p++;
    ps->line++;
    ps->line_start = ps->p;
}

static inf_status_t skip_comment(struct parser *ps)
{
    if (ps->p >= ps->end || *ps->p != '#')
        return INF_OK;
    for (ps->p++; ps->p < ps->end && !at_newline(ps); ps->p++)
        if (is_control((unsigned char)*ps->p))
            return fail(ps, ps->p, "control character in comment");
    return INF_OK;
}

/* Whitespace, comments and newlines, as between array items and lines. */
static inf_status_t skip_blank(struct parser *ps)
{
    for (;;) {
        skip_ws(ps);
        inf_status_t st = skip_comment(ps);
        if (st != INF_OK)
            return st;
        if (!at_newline(ps))
            return INF_OK;
        eat_newline(ps);
    }
}

/* The rest of a line after a key/value pair or a header. */
static inf_status_t end_of_line(struct parser *ps)
{
    skip_ws(ps);
    inf_status_t st = skip_comment(ps);
    if (st != INF_OK)
        return st;
    if (ps->p == ps->end)
        return INF_OK;
    if (!at_newline(ps))
        return fail(ps, ps->p, "expected end of line");
    eat_newline(ps);
    return INF_OK;
}

/* A basic "..." or literal '...' string at ps->p, on one line. */
static inf_status_t parse_string(struct parser *ps, const char **out, size_t *out_len)
{
    const char q = *ps->p, *start = ps->p;
    if (ps->end - ps->p >= 3 && ps->p[1] == q && ps->p[2] == q)
        return fail(ps, start, "multi-line strings are not supported");
    ps->p++;
    /* Escapes never lengthen the text, so the rest of the line bounds the output. */
    const char *nl = memchr(ps->p, '\n', (size_t)(ps->end - ps->p));
    size_t cap = (size_t)((nl ? nl : ps->end) - ps->p) + 1, n = 0;
    char *buf = inf_arena_alloc(ps->a, cap);
    if (!buf)
        return nomem(ps);
    for (;;) {
        if (ps->p == ps->end || *ps->p == '\n')
            return fail(ps, start, "unterminated string");
        unsigned char c = (unsigned char)*ps->p;
        if (c == (unsigned char)q) {
            ps->p++;
            break;
        }
        if (is_control(c))
            return fail(ps, ps->p, "control character in string");
        if (c != '\\' || q == '\'') {
            buf[n++] = (char)c;
            ps->p++;
            continue;
        }
        const char *esc = ps->p++;
        char e = ps->p < ps->end ? *ps->p++ : '\0';
        switch (e) {
        case '"':
            buf[n++] = '"';
            break;
        case '\\':
            buf[n++] = '\\';
            break;
        case 'b':
            buf[n++] = '\b';
            break;
        case 'f':
            buf[n++] = '\f';
            break;
        case 'n':
            buf[n++] = '\n';
            break;
        case 'r':
            buf[n++] = '\r';
            break;
        case 't':
            buf[n++] = '\t';
            break;
        case 'u':
        case 'U': {
            int digits = e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int i = 0; i < digits; i++, ps->p++) {
                char h = ps->p < ps->end ? *ps->p : '\0';
                int d = is_digit(h)              ? h - '0'
                        : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                        : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                                 : -1;
                if (d < 0)
                    return fail(ps, esc, "escape \\%c needs %d hex digits", e, digits);
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp == 0)
                return fail(ps, esc, "U+0000 is not supported in strings");
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return fail(ps, esc, "escape is not a Unicode scalar value");
            n += inf_utf8_encode(cp, buf + n);
            break;
        }
        default:
            if (e > ' ' && e < 0x7F)
                return fail(ps, esc, "invalid escape '\\%c'", e);
            return fail(ps, esc, "invalid escape");
        }
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return INF_OK;
}

static inf_status_t parse_simple_key(struct parser *ps, struct keypart *k)
{
    k->line = ps->line;
    k->col = column(ps, ps->p);
    if (ps->p < ps->end && (*ps->p == '"' || *ps->p == '\'')) {
        size_t n;
        return parse_string(ps, &k->s, &n);
    }
    const char *s = ps->p;
    while (ps->p < ps->end && is_bare(*ps->p))
        ps->p++;
    if (ps->p == s)
        return fail(ps, s, "expected a key");
    k->s = inf_arena_strndup(ps->a, s, (size_t)(ps->p - s));
    return k->s ? INF_OK : nomem(ps);
}

/* key or key.key.key, with optional whitespace around the dots. */
static inf_status_t parse_key(struct parser *ps, struct keypart *parts, int *n)
{
    *n = 0;
    for (;;) {
        skip_ws(ps);
        if (*n == MAX_KEY_PARTS)
            return fail(ps, ps->p, "key has more than %d parts", MAX_KEY_PARTS);
        inf_status_t st = parse_simple_key(ps, &parts[(*n)++]);
        if (st != INF_OK)
            return st;
        skip_ws(ps);
        if (ps->p == ps->end || *ps->p != '.')
            return INF_OK;
        ps->p++;
    }
}

/* Decimal digits with '_' allowed only between two digits; copied into buf. */
static size_t scan_digits(const char *s, size_t n, size_t *i, char *buf, size_t *m)
{
    size_t count = 0;
    while (*i < n) {
        if (is_digit(s[*i])) {
            buf[(*m)++] = s[(*i)++];
            count++;
        } else if (s[*i] == '_' && count > 0 && *i + 1 < n && is_digit(s[*i + 1])) {
            (*i)++;
        } else {
            break;
        }
    }
    return count;
}

static inf_status_t parse_number(struct parser *ps, struct inf_toml_node *v)
{
    const char *s = ps->p;
    while (ps->p < ps->end && (is_bare(*ps->p) || *ps->p == '+' || *ps->p == '.'))
        ps->p++;
    size_t n = (size_t)(ps->p - s), i = 0, m = 0;
    char buf[MAX_NUMBER_LEN + 1];
    if (n == 0 || (!is_digit(s[0]) && s[0] != '+' && s[0] != '-' && s[0] != 'i' && s[0] != 'n'))
        return fail(ps, s, "expected a value (strings need quotes)");
    if (n > MAX_NUMBER_LEN)
        return fail(ps, s, "number is too long");
    if (s[0] == '+' || s[0] == '-')
        buf[m++] = s[i++];
    if (n - i == 3 && (memcmp(s + i, "inf", 3) == 0 || memcmp(s + i, "nan", 3) == 0)) {
        v->type = INF_TOML_FLOAT;
        v->f = s[i] == 'i' ? INFINITY : NAN;
        if (s[0] == '-')
            v->f = -v->f;
        return INF_OK;
    }
    if (n - i >= 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'o' || s[i + 1] == 'b'))
        return fail(ps, s, "hexadecimal, octal and binary integers are not supported");
    size_t int_start = i, int_digits = scan_digits(s, n, &i, buf, &m);
    if (int_digits == 0)
        return fail(ps, s, "expected a value (strings need quotes)");
    if (int_digits > 1 && s[int_start] == '0')
        return fail(ps, s, "leading zeros are not allowed");
    bool is_float = false;
    if (i < n && s[i] == '.') {
        is_float = true;
        buf[m++] = s[i++];
        if (scan_digits(s, n, &i, buf, &m) == 0)
            return fail(ps, s + i, "expected digits after '.'");
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        is_float = true;
        buf[m++] = s[i++];
        if (i < n && (s[i] == '+' || s[i] == '-'))
            buf[m++] = s[i++];
        if (scan_digits(s, n, &i, buf, &m) == 0)
            return fail(ps, s + i, "expected digits in the exponent");
    }
    if (i != n) {
        if (s[i] == '_')
            return fail(ps, s + i, "'_' must stand between two digits");
        return fail(ps, s + i, "invalid number");
    }
    buf[m] = '\0';
    errno = 0;
    if (!is_float) {
        long long x = strtoll(buf, NULL, 10);
        if (errno == ERANGE)
            return fail(ps, s, "integer does not fit in 64 bits");
        v->type = INF_TOML_INT;
        v->i = (int64_t)x;
    } else {
        double x = strtod(buf, NULL);
        if (errno == ERANGE && isinf(x))
            return fail(ps, s, "float is out of range");
        v->type = INF_TOML_FLOAT;
        v->f = x;
    }
    return INF_OK;
}

static struct inf_toml_node *new_node(struct parser *ps, enum inf_toml_type type)
{
    struct inf_toml_node *v = inf_arena_calloc(ps->a, 1, sizeof *v);
    if (v)
        v->type = type;
    return v;
}

static void append(struct inf_toml_node *parent, struct inf_toml_node *c)
{
    if (parent->last)
        parent->last->next = c;
    else
        parent->first = c;
    parent->last = c;
    parent->count++;
}

static inf_status_t parse_value(struct parser *ps, struct inf_toml_node *v, bool in_array);

static inf_status_t parse_array(struct parser *ps, struct inf_toml_node *arr)
{
    int open_line = ps->line;
    arr->type = INF_TOML_ARRAY;
    ps->p++;
    for (;;) {
        inf_status_t st = skip_blank(ps);
        if (st != INF_OK)
            return st;
        if (ps->p == ps->end)
            return fail(ps, ps->p, "unterminated array (opened on line %d)", open_line);
        if (*ps->p == ']') {
            ps->p++;
            return INF_OK;
        }
        struct inf_toml_node *item = new_node(ps, INF_TOML_BOOL);
        if (!item)
            return nomem(ps);
        item->line = ps->line;
        item->col = column(ps, ps->p);
        if ((st = parse_value(ps, item, true)) != INF_OK || (st = skip_blank(ps)) != INF_OK)
            return st;
        append(arr, item);
        if (ps->p == ps->end)
            return fail(ps, ps->p, "unterminated array (opened on line %d)", open_line);
        if (*ps->p == ']') {
            ps->p++;
            return INF_OK;
        }
        if (*ps->p != ',')
            return fail(ps, ps->p, "expected ',' or ']' in array");
        ps->p++;
    }
}

static bool match_word(const struct parser *ps, const char *w)
{
    size_t n = strlen(w);
    return (size_t)(ps->end - ps->p) >= n && memcmp(ps->p, w, n) == 0 &&
           (ps->p + n == ps->end || !is_bare(ps->p[n]));
}

static inf_status_t parse_value(struct parser *ps, struct inf_toml_node *v, bool in_array)
{
    if (ps->p == ps->end || at_newline(ps) || *ps->p == '#')
        return fail(ps, ps->p, "expected a value");
    switch (*ps->p) {
    case '"':
    case '\'':
        v->type = INF_TOML_STRING;
        return parse_string(ps, &v->str, &v->str_len);
    case '[':
        if (in_array)
            return fail(ps, ps->p, "nested arrays are not supported");
        return parse_array(ps, v);
    case '{':
        return fail(ps, ps->p, "inline tables are not supported");
    }
    if (match_word(ps, "true") || match_word(ps, "false")) {
        v->type = INF_TOML_BOOL;
        v->b = *ps->p == 't';
        ps->p += v->b ? 4 : 5;
        return INF_OK;
    }
    return parse_number(ps, v);
}

static struct inf_toml_node *child(const struct inf_toml_node *t, const char *key, size_t len)
{
    for (struct inf_toml_node *c = t->first; c; c = c->next)
        if (strncmp(c->key, key, len) == 0 && c->key[len] == '\0')
            return c;
    return NULL;
}

/* Walk (creating tables as needed) the first n parts of a key from t. */
static inf_status_t walk(struct parser *ps, struct inf_toml_node **t, const struct keypart *parts,
                         int n, unsigned new_flags)
{
    for (int k = 0; k < n; k++) {
        struct inf_toml_node *c = child(*t, parts[k].s, strlen(parts[k].s));
        if (!c) {
            if (!(c = new_node(ps, INF_TOML_TABLE)))
                return nomem(ps);
            c->key = parts[k].s;
            c->line = parts[k].line;
            c->col = parts[k].col;
            c->flags = new_flags;
            append(*t, c);
        } else if (c->type != INF_TOML_TABLE) {
            return fail_pos(ps, parts[k].line, parts[k].col,
                            "key '%s' is already defined on line %d (%s)", c->key, c->line,
                            inf_toml_type_name(c->type));
        } else if (new_flags == F_DOTTED && !(c->flags & F_DOTTED)) {
            return fail_pos(ps, parts[k].line, parts[k].col,
                            "table '%s' (line %d) cannot be extended by a dotted key", c->key,
                            c->line);
        }
        *t = c;
    }
    return INF_OK;
}

static inf_status_t parse_header(struct parser *ps, struct inf_toml_node *root,
                                 struct inf_toml_node **cur)
{
    const char *open = ps->p++;
    int open_col = column(ps, open);
    if (ps->p < ps->end && *ps->p == '[')
        return fail(ps, open, "arrays of tables are not supported");
    struct keypart parts[MAX_KEY_PARTS];
    int n;
    inf_status_t st = parse_key(ps, parts, &n);
    if (st != INF_OK)
        return st;
    if (ps->p == ps->end || *ps->p != ']')
        return fail(ps, ps->p, "expected ']'");
    ps->p++;
    struct inf_toml_node *t = root;
    if ((st = walk(ps, &t, parts, n, 0)) != INF_OK)
        return st;
    if (t->flags & (F_EXPLICIT | F_DOTTED))
        return fail_pos(ps, ps->line, open_col, "table '%s' is already defined on line %d", t->key,
                        t->line);
    t->flags |= F_EXPLICIT;
    t->line = ps->line;
    t->col = open_col;
    *cur = t;
    return end_of_line(ps);
}

static inf_status_t parse_keyval(struct parser *ps, struct inf_toml_node *cur)
{
    struct keypart parts[MAX_KEY_PARTS];
    int n;
    inf_status_t st = parse_key(ps, parts, &n);
    if (st != INF_OK)
        return st;
    if (ps->p == ps->end || *ps->p != '=')
        return fail(ps, ps->p, "expected '='");
    ps->p++;
    skip_ws(ps);
    struct inf_toml_node *t = cur;
    if ((st = walk(ps, &t, parts, n - 1, F_DOTTED)) != INF_OK)
        return st;
    const struct keypart *k = &parts[n - 1];
    struct inf_toml_node *old = child(t, k->s, strlen(k->s));
    if (old)
        return fail_pos(ps, k->line, k->col, "duplicate key '%s' (first defined on line %d)", k->s,
                        old->line);
    struct inf_toml_node *v = new_node(ps, INF_TOML_BOOL);
    if (!v)
        return nomem(ps);
    v->key = k->s;
    v->line = k->line;
    v->col = k->col;
    if ((st = parse_value(ps, v, false)) != INF_OK)
        return st;
    append(t, v);
    return end_of_line(ps);
}

inf_status_t inf_toml_parse(const char *text, size_t len, struct inf_arena *a,
                            struct inf_toml_node **root, struct inf_err *err)
{
    *root = NULL;
    if (!text)
        text = "", len = 0;
    struct parser ps = {
        .p = text, .end = text + len, .line_start = text, .line = 1, .a = a, .err = err};
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        ps.p = ps.line_start = text + 3;
    inf_status_t st = check_utf8(&ps);
    if (st != INF_OK)
        return st;
    struct inf_toml_node *top = new_node(&ps, INF_TOML_TABLE), *cur = top;
    if (!top)
        return nomem(&ps);
    top->line = top->col = 1;
    for (;;) {
        if ((st = skip_blank(&ps)) != INF_OK)
            return st;
        if (ps.p == ps.end)
            break;
        st = *ps.p == '[' ? parse_header(&ps, top, &cur) : parse_keyval(&ps, cur);
        if (st != INF_OK)
            return st;
    }
    *root = top;
    return INF_OK;
}

const struct inf_toml_node *inf_toml_get(const struct inf_toml_node *table, const char *key)
{
    if (!table || table->type != INF_TOML_TABLE || !key)
        return NULL;
    return child(table, key, strlen(key));
}

const struct inf_toml_node *inf_toml_find(const struct inf_toml_node *root, const char *table_path,
                                          const char *key)
{
    const struct inf_toml_node *t = root;
    const char *s = table_path;
    while (t && s && *s) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        t = t->type == INF_TOML_TABLE ? child(t, s, n) : NULL;
        s = dot ? dot + 1 : NULL;
    }
    return inf_toml_get(t, key);
}

const char *inf_toml_type_name(enum inf_toml_type t)
{
    static const char *const names[] = {"table", "string", "integer", "float", "boolean", "array"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}
