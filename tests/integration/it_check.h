#pragma once
/* Check assertions over the harness, shared by the integration suites that
 * talk to a server through one `struct it_server`. */
#include "harness.h"

#include <check.h>
#include <jansson.h>
#include <stdint.h>

/* POST body to /v1/completions on s; asserts a 200 with a JSON body and
 * returns it (the caller json_decref's it). */
static inline json_t *it_post_json_ok(const struct it_server *s, const char *body)
{
    struct it_resp r;
    ck_assert(it_post(s, "/v1/completions", body, &r));
    ck_assert_msg(r.status == 200, "status %ld: %s", r.status, r.body);
    json_t *j = it_json(&r);
    ck_assert_ptr_nonnull(j);
    it_resp_free(&r);
    return j;
}

/* usage.<key> of a completion response. */
static inline int64_t it_usage_of(json_t *j, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(j, "usage"), key));
}
