/* POST /v1/completions: request parsing and validation, the context check,
 * and the byte-exact response, chunk and usage-chunk bodies. */
#include "api/api.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct api_limits lim;
static struct inf_arena arena;

static void setup(void)
{
    api_limits_init(&lim, "tiny-llama", 32000, 2048);
    inf_arena_init(&arena, 0);
}

static void teardown(void)
{
    inf_arena_fini(&arena);
}

static inf_status_t parse(const char *body, struct api_completion_req *req, struct api_fault *f,
                          struct inf_err *e)
{
    return api_completion_parse(body, strlen(body), &lim, &arena, req, f, e);
}

static void ck_str_or_null(const char *got, const char *want, const char *what, const char *body)
{
    if (!want)
        ck_assert_msg(got == NULL, "%s: %s is \"%s\", want null", body, what, got);
    else
        ck_assert_msg(got && strcmp(got, want) == 0, "%s: %s is \"%s\", want \"%s\"", body, what,
                      got ? got : "(null)", want);
}

/* ---- the bad-input matrix ------------------------------------------------------ */
struct bad {
    const char *body;
    int http;
    const char *param;
    const char *code;
    const char *msg;
};

#define SHAPE                                                                                      \
    "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of "     \
    "token ids"

static const struct bad bad_cases[] = {
    /* the body itself */
    {"", 400, NULL, NULL, "The request body is empty; expected a JSON object"},
    {" \r\n", 400, NULL, NULL, "The request body is empty; expected a JSON object"},
    {"{\"prompt\": \"hi\"", 400, NULL, NULL,
     "We could not parse the JSON body of your request: '}' expected near end of file (line 1, "
     "column 15)"},
    {"42", 400, NULL, NULL, "The request body must be a JSON object, got 42"},
    {"null", 400, NULL, NULL, "The request body must be a JSON object, got null"},
    {"\"str\"", 400, NULL, NULL, "The request body must be a JSON object, got a string"},
    {"[1]", 400, NULL, NULL, "The request body must be a JSON object, got an array"},
    {"{\"prompt\":\"a\",\"prompt\":\"b\"}", 400, NULL, NULL,
     "We could not parse the JSON body of your request: duplicate object key near '\"prompt\"' "
     "(line 1, column 22)"},
    {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true,\"include_usage\":false},"
     "\"stream\":true}",
     400, NULL, NULL,
     "We could not parse the JSON body of your request: duplicate object key near "
     "'\"include_usage\"' (line 1, column 68)"},
    {"{} x", 400, NULL, NULL,
     "We could not parse the JSON body of your request: end of file expected near 'x' (line 1, "
     "column 4)"},
    /* prompt */
    {"{}", 400, "prompt", NULL, "'prompt' is required"},
    {"{\"prompt\":null}", 400, "prompt", NULL, "'prompt' is required"},
    {"{\"prompt\":\"\"}", 400, "prompt", NULL, "'prompt' must not be empty"},
    {"{\"prompt\":[]}", 400, "prompt", NULL, "'prompt' must not be empty"},
    {"{\"prompt\":[[]]}", 400, "prompt", NULL,
     "'prompt' must not be empty: prompt 0 holds no tokens"},
    {"{\"prompt\":[[1],[]]}", 400, "prompt", NULL,
     "'prompt' must not be empty: prompt 1 holds no tokens"},
    {"{\"prompt\":[\"a\",\"\"]}", 400, "prompt", NULL,
     "'prompt' must not be empty: prompt 1 is an empty string"},
    {"{\"prompt\":42}", 400, "prompt", NULL, SHAPE ", got 42"},
    {"{\"prompt\":{}}", 400, "prompt", NULL, SHAPE ", got an object"},
    {"{\"prompt\":[true]}", 400, "prompt", NULL, SHAPE ", got true at index 0"},
    {"{\"prompt\":[\"a\",1]}", 400, "prompt", NULL, SHAPE "; index 0 is a string but index 1 is 1"},
    {"{\"prompt\":[[1],2]}", 400, "prompt", NULL, SHAPE "; index 0 is a list but index 1 is 2"},
    {"{\"prompt\":[1,32000]}", 400, "prompt", NULL,
     "'prompt' token id 32000 at index 1 is outside the vocabulary [0, 32000)"},
    {"{\"prompt\":[-1]}", 400, "prompt", NULL,
     "'prompt' token id -1 at index 0 is outside the vocabulary [0, 32000)"},
    {"{\"prompt\":[[5],[7,-3]]}", 400, "prompt", NULL,
     "'prompt' token id -3 at index 1 is outside the vocabulary [0, 32000)"},
    {"{\"prompt\":[[1.5]]}", 400, "prompt", NULL,
     "'prompt' token ids must be integers, got 1.5 at index 0"},
    /* max_tokens */
    {"{\"prompt\":\"a\",\"max_tokens\":-1}", 400, "max_tokens", NULL,
     "'max_tokens' must be at least 1, got -1"},
    {"{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", NULL,
     "'max_tokens' must be at least 1, got 0"},
    {"{\"prompt\":\"a\",\"max_tokens\":16.0}", 400, "max_tokens", NULL,
     "'max_tokens' must be an integer, got 16.0"},
    {"{\"prompt\":\"a\",\"max_tokens\":\"16\"}", 400, "max_tokens", NULL,
     "'max_tokens' must be an integer, got a string"},
    {"{\"prompt\":\"a\",\"max_tokens\":9223372036854775808}", 400, NULL, NULL,
     "We could not parse the JSON body of your request: too big integer near "
     "'9223372036854775808' (line 1, column 46)"},
    /* sampling */
    {"{\"prompt\":\"a\",\"temperature\":2.5}", 400, "temperature", NULL,
     "'temperature' must be in [0, 2], got 2.5"},
    {"{\"prompt\":\"a\",\"temperature\":-0.1}", 400, "temperature", NULL,
     "'temperature' must be in [0, 2], got -0.1"},
    {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "temperature", NULL,
     "'temperature' must be a number, got a string"},
    {"{\"prompt\":\"a\",\"top_p\":1.5}", 400, "top_p", NULL, "'top_p' must be in (0, 1], got 1.5"},
    {"{\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", NULL, "'top_p' must be in (0, 1], got 0"},
    {"{\"prompt\":\"a\",\"top_k\":-2}", 400, "top_k", NULL,
     "'top_k' must be -1 (disabled) or at least 1, got -2"},
    {"{\"prompt\":\"a\",\"min_p\":1.01}", 400, "min_p", NULL,
     "'min_p' must be in [0, 1], got 1.01"},
    {"{\"prompt\":\"a\",\"presence_penalty\":-2.5}", 400, "presence_penalty", NULL,
     "'presence_penalty' must be in [-2, 2], got -2.5"},
    {"{\"prompt\":\"a\",\"frequency_penalty\":3}", 400, "frequency_penalty", NULL,
     "'frequency_penalty' must be in [-2, 2], got 3"},
    {"{\"prompt\":\"a\",\"repetition_penalty\":0}", 400, "repetition_penalty", NULL,
     "'repetition_penalty' must be in (0, 2], got 0"},
    /* n, best_of, logprobs */
    {"{\"prompt\":\"a\",\"n\":0}", 400, "n", NULL, "'n' must be in [1, 16], got 0"},
    {"{\"prompt\":\"a\",\"n\":1000000}", 400, "n", NULL, "'n' must be in [1, 16], got 1000000"},
    {"{\"prompt\":\"a\",\"n\":2,\"best_of\":1}", 400, "best_of", NULL,
     "'best_of' must be at least 'n' (2), got 1"},
    {"{\"prompt\":\"a\",\"best_of\":17}", 400, "best_of", NULL,
     "'best_of' must be in [1, 16], got 17"},
    {"{\"prompt\":\"a\",\"best_of\":3,\"stream\":true}", 400, "best_of", NULL,
     "'best_of' greater than 'n' is not supported: it must equal 'n' (1) or be left out, got 3"},
    {"{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", NULL,
     "'best_of' greater than 'n' is not supported: it must equal 'n' (1) or be left out, got 2"},
    {"{\"prompt\":\"a\",\"n\":3,\"best_of\":16}", 400, "best_of", NULL,
     "'best_of' greater than 'n' is not supported: it must equal 'n' (3) or be left out, got 16"},
    {"{\"prompt\":\"a\",\"logprobs\":6}", 400, "logprobs", NULL,
     "'logprobs' must be in [0, 5], got 6"},
    {"{\"prompt\":\"a\",\"logprobs\":-1}", 400, "logprobs", NULL,
     "'logprobs' must be in [0, 5], got -1"},
    {"{\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs", NULL,
     "'logprobs' must be an integer, got true"},
    /* logit_bias */
    {"{\"prompt\":\"a\",\"logit_bias\":{\"32000\":1}}", 400, "logit_bias", NULL,
     "'logit_bias' token id 32000 is outside the vocabulary [0, 32000)"},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"123456789012345678901234567890\":1}}", 400, "logit_bias",
     NULL,
     "'logit_bias' token id 123456789012345678901234567890 is outside the vocabulary [0, 32000)"},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"-5\":1}}", 400, "logit_bias", NULL,
     "'logit_bias' keys must be token ids, got \"-5\""},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", NULL,
     "'logit_bias' keys must be token ids, got \"abc\""},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"5\":100.5}}", 400, "logit_bias", NULL,
     "'logit_bias' value for token id 5 must be in [-100, 100], got 100.5"},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"x\"}}", 400, "logit_bias", NULL,
     "'logit_bias' value for token id 5 must be a number, got a string"},
    {"{\"prompt\":\"a\",\"logit_bias\":{\"5\":1,\"05\":2}}", 400, "logit_bias", NULL,
     "'logit_bias' names token id 5 twice"},
    {"{\"prompt\":\"a\",\"logit_bias\":[1]}", 400, "logit_bias", NULL,
     "'logit_bias' must be an object of token ids to biases, got an array"},
    /* stream */
    {"{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", NULL,
     "'stream' must be a boolean, got a string"},
    {"{\"prompt\":\"a\",\"stream\":1}", 400, "stream", NULL, "'stream' must be a boolean, got 1"},
    {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", NULL,
     "'stream_options' is only allowed when 'stream' is true"},
    {"{\"prompt\":\"a\",\"stream\":true,\"stream_options\":true}", 400, "stream_options", NULL,
     "'stream_options' must be an object, got true"},
    {"{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
     "stream_options.include_usage", NULL,
     "'stream_options.include_usage' must be a boolean, got 1"},
    /* min_tokens */
    {"{\"prompt\":\"a\",\"min_tokens\":20}", 400, "min_tokens", NULL,
     "'min_tokens' must be at most 'max_tokens' (16), got 20"},
    {"{\"prompt\":\"a\",\"max_tokens\":null,\"min_tokens\":4096}", 400, "min_tokens", NULL,
     "'min_tokens' must be at most the context length (2048), got 4096"},
    {"{\"prompt\":\"a\",\"min_tokens\":-1}", 400, "min_tokens", NULL,
     "'min_tokens' must be at least 0, got -1"},
    /* stop */
    {"{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL,
     "'stop' may hold at most 4 strings, got 5"},
    {"{\"prompt\":\"a\",\"stop\":\"\"}", 400, "stop", NULL, "'stop' strings must not be empty"},
    {"{\"prompt\":\"a\",\"stop\":[\"x\",\"\"]}", 400, "stop", NULL,
     "'stop' strings must not be empty"},
    /* The engine takes stop strings as C strings: one with a NUL inside
     * would silently stop at its first part. */
    {"{\"prompt\":\"a\",\"stop\":[\"x\",\"ab\\u0000cd\"]}", 400, "stop", NULL,
     "'stop' strings must not contain the character U+0000, found at index 1"},
    {"{\"prompt\":\"a\",\"stop\":\"\\u0000\"}", 400, "stop", NULL,
     "'stop' strings must not contain the character U+0000, found at index 0"},
    {"{\"prompt\":\"a\",\"stop\":[\"x\",3]}", 400, "stop", NULL,
     "'stop' must hold only strings, got 3 at index 1"},
    {"{\"prompt\":\"a\",\"stop\":7}", 400, "stop", NULL,
     "'stop' must be a string or a list of strings, got 7"},
    /* the rest */
    {"{\"prompt\":\"a\",\"seed\":1.5}", 400, "seed", NULL, "'seed' must be an integer, got 1.5"},
    {"{\"prompt\":\"a\",\"echo\":\"true\"}", 400, "echo", NULL,
     "'echo' must be a boolean, got a string"},
    {"{\"prompt\":\"a\",\"user\":5}", 400, "user", NULL, "'user' must be a string, got 5"},
    {"{\"prompt\":\"a\",\"suffix\":\"\"}", 400, "suffix", "unsupported_parameter",
     "Unsupported parameter: 'suffix' is not supported by this server."},
    {"{\"prompt\":\"a\",\"model\":\"gpt-4\"}", 404, "model", "model_not_found",
     "The model `gpt-4` does not exist or you do not have access to it."},
    {"{\"prompt\":\"a\",\"model\":7}", 400, "model", NULL, "'model' must be a string, got 7"},
    /* a bad value wins over an unknown model: validation first, like vLLM */
    {"{\"prompt\":\"a\",\"model\":\"gpt-4\",\"n\":0}", 400, "n", NULL,
     "'n' must be in [1, 16], got 0"},
};

START_TEST(bad_input)
{
    const struct bad *b = &bad_cases[_i];
    struct api_completion_req req;
    struct api_fault f = {"sentinel", "sentinel"};
    struct inf_err e;
    inf_err_clear(&e);
    inf_status_t st = parse(b->body, &req, &f, &e);
    ck_assert_msg(st != INF_OK, "%s: accepted", b->body);
    ck_assert_int_eq(e.code, st);
    ck_assert_msg(api_status_http(st) == b->http, "%s: HTTP %d, want %d", b->body,
                  api_status_http(st), b->http);
    ck_str_or_null(f.param, b->param, "param", b->body);
    ck_str_or_null(f.code, b->code, "code", b->body);
    ck_assert_msg(strcmp(e.msg, b->msg) == 0, "%s:\n got  [%s]\n want [%s]", b->body, e.msg,
                  b->msg);
}
END_TEST

/* The whole error body for one bad request, byte for byte. */
START_TEST(bad_input_body)
{
    struct api_completion_req req;
    struct api_fault f;
    struct inf_err e;
    inf_status_t st = parse("{\"prompt\":\"a\",\"temperature\":2.5}", &req, &f, &e);
    char *body;
    size_t len;
    ck_assert_int_eq(api_error_encode(st, e.msg, f.param, f.code, &arena, &body, &len, NULL),
                     INF_OK);
    ck_assert_str_eq(body, "{\"error\":{\"message\":\"'temperature' must be in [0, 2], got 2.5\","
                           "\"type\":\"invalid_request_error\",\"param\":\"temperature\","
                           "\"code\":null}}");
    ck_assert_uint_eq(len, strlen(body));

    st = parse("{\"prompt\":\"a\",\"model\":\"gpt-4\"}", &req, &f, &e);
    ck_assert_int_eq(api_status_http(st), 404);
    ck_assert_int_eq(api_error_encode(st, e.msg, f.param, f.code, &arena, &body, &len, NULL),
                     INF_OK);
    ck_assert_str_eq(body, "{\"error\":{\"message\":\"The model `gpt-4` does not exist or you do "
                           "not have access to it.\",\"type\":\"invalid_request_error\","
                           "\"param\":\"model\",\"code\":\"model_not_found\"}}");
}
END_TEST

/* An over-long model name is clipped in the message, which stays whole. */
START_TEST(long_model_name)
{
    char body[400];
    char name[201];
    memset(name, 'm', 200);
    name[200] = '\0';
    snprintf(body, sizeof body, "{\"prompt\":\"a\",\"model\":\"%s\"}", name);
    struct api_completion_req req;
    struct api_fault f;
    struct inf_err e;
    ck_assert_int_eq(parse(body, &req, &f, &e), INF_E_NOTFOUND);
    char want[256];
    snprintf(want, sizeof want,
             "The model `%.96s...` does not exist or you do not have access to it.", name);
    ck_assert_str_eq(e.msg, want);
}
END_TEST

/* ---- accepted requests ------------------------------------------------------------ */
/* logit_bias is copied into every choice's sampler: its size times the
 * choices (prompts x n) is bounded, so a body of a few MiB cannot make the
 * engine hold gigabytes of copies. */
static char *bias_body(int n_prompts, int n, int n_bias)
{
    size_t cap = 64 + (size_t)n_prompts * 8 + (size_t)n_bias * 16;
    char *b = malloc(cap);
    size_t len = (size_t)snprintf(b, cap, "{\"prompt\":[");
    for (int i = 0; i < n_prompts; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s\"p\"", i ? "," : "");
    len += (size_t)snprintf(b + len, cap - len, "],\"n\":%d,\"logit_bias\":{", n);
    for (int i = 0; i < n_bias; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s\"%d\":-1", i ? "," : "", i);
    snprintf(b + len, cap - len, "}}");
    return b;
}

START_TEST(logit_bias_times_choices_bounded)
{
    struct api_completion_req r;
    struct api_fault f;
    struct inf_err e;
    ck_assert_uint_eq(lim.max_bias_total, 1u << 20);
    /* The whole vocabulary (32000) for 16 choices is 512000: accepted... */
    char *b = bias_body(1, 16, 32000);
    ck_assert_int_eq(parse(b, &r, &f, &e), INF_OK);
    ck_assert_uint_eq(r.n_bias, 32000);
    free(b);
    /* ...but 33 prompts of 2 choices each with the whole vocabulary is over. */
    b = bias_body(33, 2, 32000);
    ck_assert_int_eq(parse(b, &r, &f, &e), INF_E_INVALID);
    ck_assert_str_eq(f.param, "logit_bias");
    ck_assert_str_eq(e.msg, "'logit_bias' holds 32000 entries for 66 choices (33 prompts x n=2); "
                            "entries times choices may be at most 1048576");
    free(b);
    b = bias_body(32, 2, 16384);
    ck_assert_int_eq(parse(b, &r, &f, &e), INF_OK);
    free(b);
    b = bias_body(32, 2, 16385);
    ck_assert_int_eq(parse(b, &r, &f, &e), INF_E_INVALID);
    free(b);
}
END_TEST

START_TEST(defaults)
{
    struct api_completion_req r;
    struct inf_err e;
    ck_assert_str_eq(lim.model, "tiny-llama");
    ck_assert_uint_eq(lim.vocab, 32000);
    ck_assert_uint_eq(lim.max_model_len, 2048);
    ck_assert_uint_eq(lim.max_n, 16);
    ck_assert_uint_eq(lim.max_logprobs, 5);
    ck_assert_uint_eq(lim.max_stop, 4);
    ck_assert_uint_eq(lim.max_prompts, 256);
    ck_assert_int_eq(parse("{\"prompt\":\"Hello\"}", &r, NULL, &e), INF_OK);
    ck_assert_ptr_null(r.model);
    ck_assert_uint_eq(r.n_prompts, 1);
    ck_assert_str_eq(r.prompts[0].text.s, "Hello");
    ck_assert_uint_eq(r.prompts[0].text.len, 5);
    ck_assert_ptr_null(r.prompts[0].ids);
    ck_assert_int_eq(r.max_tokens, 16);
    ck_assert_float_eq(r.temperature, 1.0f);
    ck_assert_float_eq(r.top_p, 1.0f);
    ck_assert_int_eq(r.top_k, API_TOP_K_OFF);
    ck_assert_float_eq(r.min_p, 0.0f);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_uint_eq(r.best_of, 1);
    ck_assert_uint_eq(r.n_stop, 0);
    ck_assert(!r.has_seed);
    ck_assert(!r.stream);
    ck_assert(!r.include_usage);
    ck_assert_int_eq(r.logprobs, API_LOGPROBS_OFF);
    ck_assert(!r.echo);
    ck_assert_float_eq(r.presence_penalty, 0.0f);
    ck_assert_float_eq(r.frequency_penalty, 0.0f);
    ck_assert_float_eq(r.repetition_penalty, 1.0f);
    ck_assert_uint_eq(r.n_bias, 0);
    ck_assert(!r.ignore_eos);
    ck_assert_uint_eq(r.min_tokens, 0);
    ck_assert(r.add_special_tokens);
    ck_assert_ptr_null(r.user);
    ck_assert_uint_eq(r.n_ignored, 0);

    /* Every optional field null is the same as absent; max_tokens null is "auto". */
    ck_assert_int_eq(parse("{\"prompt\":\"Hello\",\"model\":null,\"max_tokens\":null,"
                           "\"temperature\":null,\"top_p\":null,\"top_k\":null,\"min_p\":null,"
                           "\"n\":null,\"best_of\":null,\"stop\":null,\"seed\":null,"
                           "\"stream\":null,\"stream_options\":null,\"logprobs\":null,"
                           "\"echo\":null,\"presence_penalty\":null,\"frequency_penalty\":null,"
                           "\"repetition_penalty\":null,\"logit_bias\":null,\"ignore_eos\":null,"
                           "\"min_tokens\":null,\"user\":null,\"suffix\":null}",
                           &r, NULL, &e),
                     INF_OK);
    ck_assert_int_eq(r.max_tokens, API_MAX_TOKENS_AUTO);
    ck_assert_float_eq(r.temperature, 1.0f);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_int_eq(r.logprobs, API_LOGPROBS_OFF);
    ck_assert_uint_eq(r.n_ignored, 0);
}
END_TEST

START_TEST(full_request)
{
    const char *body =
        "{\"model\":\"tiny-llama\",\"prompt\":[\"Once upon\",\"caf\\u00e9 \\ud83d\\ude00\","
        "\"a\\u0000b\"],\"max_tokens\":100,\"temperature\":0.7,\"top_p\":0.9,\"top_k\":40,"
        "\"min_p\":0.05,\"n\":2,\"best_of\":2,\"stop\":[\"\\n\\n\",\"END\"],"
        "\"seed\":-9223372036854775808,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":false},"
        "\"logprobs\":5,\"echo\":true,\"presence_penalty\":-2,\"frequency_penalty\":1.5,"
        "\"repetition_penalty\":1.1,\"logit_bias\":{\"50\":-100,\"31999\":2.5,\"0\":100},"
        "\"ignore_eos\":true,\"min_tokens\":10,\"add_special_tokens\":false,\"user\":\"u-1\","
        "\"suffix\":null,\"use_beam_search\":false,\"guided_json\":{}}";
    struct api_completion_req r;
    struct inf_err e;
    struct api_fault f;
    ck_assert_msg(parse(body, &r, &f, &e) == INF_OK, "%s", e.msg);
    ck_assert_str_eq(r.model, "tiny-llama");
    ck_assert_uint_eq(r.n_prompts, 3);
    ck_assert_str_eq(r.prompts[0].text.s, "Once upon");
    ck_assert_str_eq(r.prompts[1].text.s, "caf\xC3\xA9 \xF0\x9F\x98\x80");
    ck_assert_uint_eq(r.prompts[1].text.len, 10);
    ck_assert_uint_eq(r.prompts[2].text.len, 3);
    ck_assert_mem_eq(r.prompts[2].text.s, "a\0b", 4);
    ck_assert_int_eq(r.max_tokens, 100);
    ck_assert_float_eq(r.temperature, 0.7f);
    ck_assert_float_eq(r.top_p, 0.9f);
    ck_assert_int_eq(r.top_k, 40);
    ck_assert_float_eq(r.min_p, 0.05f);
    ck_assert_uint_eq(r.n, 2);
    ck_assert_uint_eq(r.best_of, 2);
    ck_assert_uint_eq(r.n_stop, 2);
    ck_assert_str_eq(r.stop[0].s, "\n\n");
    ck_assert_uint_eq(r.stop[0].len, 2);
    ck_assert_str_eq(r.stop[1].s, "END");
    ck_assert(r.has_seed);
    ck_assert_int_eq(r.seed, INT64_MIN);
    ck_assert(r.stream);
    ck_assert(r.include_usage);
    ck_assert_int_eq(r.logprobs, 5);
    ck_assert(r.echo);
    ck_assert_float_eq(r.presence_penalty, -2.0f);
    ck_assert_float_eq(r.frequency_penalty, 1.5f);
    ck_assert_float_eq(r.repetition_penalty, 1.1f);
    ck_assert_uint_eq(r.n_bias, 3);
    ck_assert_int_eq(r.bias_ids[0], 50);
    ck_assert_float_eq(r.bias_values[0], -100.0f);
    ck_assert_int_eq(r.bias_ids[1], 31999);
    ck_assert_float_eq(r.bias_values[1], 2.5f);
    ck_assert_int_eq(r.bias_ids[2], 0);
    ck_assert_float_eq(r.bias_values[2], 100.0f);
    ck_assert(r.ignore_eos);
    ck_assert_uint_eq(r.min_tokens, 10);
    ck_assert(!r.add_special_tokens);
    ck_assert_str_eq(r.user, "u-1");
    ck_assert_uint_eq(r.n_ignored, 3);
    ck_assert_str_eq(r.ignored[0], "use_beam_search");
    ck_assert_str_eq(r.ignored[1], "guided_json");
    ck_assert_str_eq(r.ignored[2], "stream_options.continuous_usage_stats");
}
END_TEST

START_TEST(prompt_shapes)
{
    struct api_completion_req r;
    struct inf_err e;
    ck_assert_int_eq(parse("{\"prompt\":[1,2,31999,0]}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_prompts, 1);
    ck_assert_ptr_null(r.prompts[0].text.s);
    ck_assert_uint_eq(r.prompts[0].n_ids, 4);
    const int32_t want[] = {1, 2, 31999, 0};
    ck_assert_mem_eq(r.prompts[0].ids, want, sizeof want);

    ck_assert_int_eq(parse("{\"prompt\":[[7],[8,9]]}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_prompts, 2);
    ck_assert_uint_eq(r.prompts[0].n_ids, 1);
    ck_assert_int_eq(r.prompts[0].ids[0], 7);
    ck_assert_uint_eq(r.prompts[1].n_ids, 2);
    ck_assert_int_eq(r.prompts[1].ids[0], 8);
    ck_assert_int_eq(r.prompts[1].ids[1], 9);

    ck_assert_int_eq(parse("{\"prompt\":[\"x\"]}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_prompts, 1);
    ck_assert_str_eq(r.prompts[0].text.s, "x");

    /* max_prompts bounds a list of prompts, not a list of token ids. */
    lim.max_prompts = 2;
    struct api_fault f;
    ck_assert_int_eq(parse("{\"prompt\":[\"x\",\"y\",\"z\"]}", &r, &f, &e), INF_E_INVALID);
    ck_assert_str_eq(e.msg, "'prompt' may hold at most 2 prompts, got 3");
    ck_assert_str_eq(f.param, "prompt");
    ck_assert_int_eq(parse("{\"prompt\":[1,2,3]}", &r, &f, &e), INF_OK);
}
END_TEST

START_TEST(edge_values)
{
    struct api_completion_req r;
    struct inf_err e;
    /* Accepted here; the context check refuses them once the prompt is known. */
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"max_tokens\":2147483647}", &r, NULL, &e), INF_OK);
    ck_assert_int_eq(r.max_tokens, 2147483647);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"max_tokens\":9223372036854775807}", &r, NULL, &e),
                     INF_OK);
    ck_assert_int_eq(r.max_tokens, INT64_MAX);
    /* top_k: 0 and -1 disable it; above the vocabulary it is clamped. */
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"top_k\":0}", &r, NULL, &e), INF_OK);
    ck_assert_int_eq(r.top_k, API_TOP_K_OFF);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"top_k\":-1}", &r, NULL, &e), INF_OK);
    ck_assert_int_eq(r.top_k, API_TOP_K_OFF);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"top_k\":1}", &r, NULL, &e), INF_OK);
    ck_assert_int_eq(r.top_k, 1);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"top_k\":9000000000}", &r, NULL, &e), INF_OK);
    ck_assert_int_eq(r.top_k, 32000);
    /* Bounds are inclusive where the docs say so. */
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"temperature\":0,\"top_p\":1,\"min_p\":1,"
                           "\"presence_penalty\":2,\"frequency_penalty\":-2,"
                           "\"repetition_penalty\":2,\"n\":16,\"logprobs\":0,"
                           "\"min_tokens\":16}",
                           &r, NULL, &e),
                     INF_OK);
    ck_assert_float_eq(r.temperature, 0.0f);
    ck_assert_uint_eq(r.n, 16);
    ck_assert_uint_eq(r.best_of, 16);
    ck_assert_int_eq(r.logprobs, 0);
    ck_assert_uint_eq(r.min_tokens, 16);
    /* best_of equal to n is accepted, streamed or not (and null is n). */
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"n\":3,\"best_of\":3}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n, 3);
    ck_assert_uint_eq(r.best_of, 3);
    ck_assert_int_eq(
        parse("{\"prompt\":\"a\",\"n\":3,\"best_of\":3,\"stream\":true}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.best_of, 3);
    ck_assert(r.stream);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"n\":2,\"best_of\":null}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.best_of, 2);
    /* A stop string alone, an empty stop list, and four stops. */
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"stop\":\"###\"}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0].s, "###");
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"stop\":[]}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_stop, 0);
    ck_assert_int_eq(parse("{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\"]}", &r, NULL, &e),
                     INF_OK);
    ck_assert_uint_eq(r.n_stop, 4);
    ck_assert_str_eq(r.stop[3].s, "d");
    /* stream_options without include_usage: usage stays off. */
    ck_assert_int_eq(
        parse("{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{}}", &r, NULL, &e), INF_OK);
    ck_assert(r.stream);
    ck_assert(!r.include_usage);
    /* Unknown keys are reported in body order. */
    ck_assert_int_eq(parse("{\"zz\":1,\"prompt\":\"a\",\"aa\":[1]}", &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_ignored, 2);
    ck_assert_str_eq(r.ignored[0], "zz");
    ck_assert_str_eq(r.ignored[1], "aa");
    /* A NULL fault and err are allowed. */
    ck_assert_int_eq(parse("{\"prompt\":\"\"}", &r, NULL, NULL), INF_E_INVALID);
    /* A body that is not NUL-terminated: only len bytes are read. */
    const char raw[] = "{\"prompt\":\"abc\"}GARBAGE";
    ck_assert_int_eq(api_completion_parse(raw, 16, &lim, &arena, &r, NULL, &e), INF_OK);
    ck_assert_str_eq(r.prompts[0].text.s, "abc");
}
END_TEST

/* Unknown keys come back safe to log: clipped, control bytes replaced, at
 * most API_MAX_IGNORED of them. */
START_TEST(ignored_keys)
{
    char body[4096];
    size_t o = (size_t)snprintf(body, sizeof body, "{\"prompt\":\"a\",\"bad\\nkey\\u0001\":1,\"");
    for (int i = 0; i < 70; i++)
        body[o++] = 'k';
    o += (size_t)snprintf(body + o, sizeof body - o, "\":2");
    for (int i = 0; i < 30; i++)
        o += (size_t)snprintf(body + o, sizeof body - o, ",\"x%d\":%d", i, i);
    snprintf(body + o, sizeof body - o, ",\"stream\":true,\"stream_options\":{\"y\":1}}");
    struct api_completion_req r;
    struct inf_err e;
    ck_assert_msg(parse(body, &r, NULL, &e) == INF_OK, "%s", e.msg);
    ck_assert_uint_eq(r.n_ignored, API_MAX_IGNORED);
    ck_assert_str_eq(r.ignored[0], "bad?key?");
    ck_assert_uint_eq(strlen(r.ignored[1]), 64);
    ck_assert_str_eq(r.ignored[2], "x0");
    ck_assert_str_eq(r.ignored[API_MAX_IGNORED - 1], "x13");

    /* A clip never splits a character. */
    o = (size_t)snprintf(body, sizeof body, "{\"prompt\":\"a\",\"");
    for (int i = 0; i < 63; i++)
        body[o++] = 'k';
    snprintf(body + o, sizeof body - o, "\xC3\xA9\":1}");
    ck_assert_int_eq(parse(body, &r, NULL, &e), INF_OK);
    ck_assert_uint_eq(r.n_ignored, 1);
    ck_assert_uint_eq(strlen(r.ignored[0]), 63);
}
END_TEST

/* ---- context check ------------------------------------------------------------- */
START_TEST(context_check)
{
    struct api_fault f;
    struct inf_err e;
    uint32_t max_new = 0;
    ck_assert_int_eq(api_check_context(5, 16, 2048, &max_new, &f, &e), INF_OK);
    ck_assert_uint_eq(max_new, 16);
    ck_assert_int_eq(api_check_context(2032, 16, 2048, &max_new, &f, &e), INF_OK);
    ck_assert_uint_eq(max_new, 16);
    ck_assert_int_eq(api_check_context(2000, API_MAX_TOKENS_AUTO, 2048, &max_new, &f, &e), INF_OK);
    ck_assert_uint_eq(max_new, 48);

    ck_assert_int_eq(api_check_context(2033, 16, 2048, &max_new, &f, &e), INF_E_CONTEXT);
    ck_assert_int_eq(api_status_http(INF_E_CONTEXT), 400);
    ck_assert_ptr_null(f.param);
    ck_assert_str_eq(f.code, "context_length_exceeded");
    ck_assert_str_eq(e.msg, "This model's maximum context length is 2048 tokens. However, you "
                            "requested 2049 tokens (2033 in the messages, 16 in the completion). "
                            "Please reduce the length of the messages or completion.");

    ck_assert_int_eq(api_check_context(5, 2147483647, 2048, NULL, &f, &e), INF_E_CONTEXT);
    ck_assert_str_eq(e.msg, "This model's maximum context length is 2048 tokens. However, you "
                            "requested 2147483652 tokens (5 in the messages, 2147483647 in the "
                            "completion). Please reduce the length of the messages or "
                            "completion.");
    ck_assert_int_eq(api_check_context(5, INT64_MAX, 2048, NULL, &f, &e), INF_E_CONTEXT);
    ck_assert_str_eq(e.msg, "This model's maximum context length is 2048 tokens. However, you "
                            "requested 9223372036854775812 tokens (5 in the messages, "
                            "9223372036854775807 in the completion). Please reduce the length "
                            "of the messages or completion.");
    ck_assert_int_eq(api_check_context(UINT32_MAX, INT64_MAX, 2048, NULL, &f, &e), INF_E_CONTEXT);
    ck_assert_str_eq(e.msg, "This model's maximum context length is 2048 tokens. However, you "
                            "requested 9223372041149743102 tokens (4294967295 in the messages, "
                            "9223372036854775807 in the completion). Please reduce the length "
                            "of the messages or completion.");
    /* max_tokens null: only the prompt can overflow; a full context leaves no room. */
    ck_assert_int_eq(api_check_context(2048, API_MAX_TOKENS_AUTO, 2048, NULL, &f, &e),
                     INF_E_CONTEXT);
    ck_assert_str_eq(f.code, "context_length_exceeded");
    ck_assert_str_eq(e.msg, "This model's maximum context length is 2048 tokens. However, you "
                            "requested 2048 tokens in the messages. Please reduce the length of "
                            "the messages.");

    char *body;
    ck_assert_int_eq(api_check_context(2033, 16, 2048, NULL, &f, &e), INF_E_CONTEXT);
    ck_assert_int_eq(api_error_encode(e.code, e.msg, f.param, f.code, &arena, &body, NULL, NULL),
                     INF_OK);
    ck_assert_str_eq(body, "{\"error\":{\"message\":\"This model's maximum context length is 2048 "
                           "tokens. However, you requested 2049 tokens (2033 in the messages, 16 "
                           "in the completion). Please reduce the length of the messages or "
                           "completion.\",\"type\":\"invalid_request_error\",\"param\":null,"
                           "\"code\":\"context_length_exceeded\"}}");
}
END_TEST

/* ---- responses ----------------------------------------------------------------- */
static const struct api_resp_head head = {"42", 1764474000, "tiny-llama"};

START_TEST(response_plain)
{
    struct api_choice c[2] = {
        {.index = 0, .text = {"Hello, \"world\"\n", 15}, .finish = API_FINISH_LENGTH},
        {.index = 1, .text = {"", 0}, .finish = API_FINISH_STOP},
    };
    struct api_usage u = {5, 7};
    char *out;
    size_t len;
    ck_assert_int_eq(api_completion_encode(&head, c, 2, &u, &arena, &out, &len, NULL), INF_OK);
    const char *want =
        "{\"id\":\"cmpl-42\",\"object\":\"text_completion\",\"created\":1764474000,"
        "\"model\":\"tiny-llama\",\"choices\":["
        "{\"index\":0,\"text\":\"Hello, \\\"world\\\"\\n\",\"logprobs\":null,"
        "\"finish_reason\":\"length\"},"
        "{\"index\":1,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}";
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(len, strlen(want));

    /* Independently: jansson reads it back to the same values. */
    json_error_t je;
    json_t *j = json_loads(out, JSON_REJECT_DUPLICATES, &je);
    ck_assert_ptr_nonnull(j);
    json_t *ch0 = json_array_get(json_object_get(j, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ch0, "text")), "Hello, \"world\"\n");
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 12);
    json_decref(j);
}
END_TEST

START_TEST(response_logprobs)
{
    /* Echo-style: the first token has no logprob and no top list. */
    struct api_top_logprob top1[] = {
        {{" world", 6}, -0.25f},
        {{" there", 6}, -1.5f},
        {{" world", 6}, -7.0f}, /* same string again: dropped */
    };
    struct api_top_logprob top2[] = {
        {{"\xC3\xA9", 2}, -0.1f},
        {{"!", 1}, -INFINITY},
    };
    struct api_token_logprob toks[] = {
        {{"Hello", 5}, NAN, NULL, 0},
        {{" world", 6}, -0.25f, top1, 3},
        {{"\xC3\xA9", 2}, -0.1f, top2, 2}, /* one character, two bytes */
        {{"?", 1}, -1.2e-05f, top2, 0},    /* an empty top list is {} */
    };
    struct api_logprobs lp = {toks, 4, 0, NULL};
    struct api_choice c = {.index = 0,
                           .text = {"Hello world\xC3\xA9?", 14},
                           .logprobs = &lp,
                           .finish = API_FINISH_STOP};
    struct api_usage u = {1, 3};
    char *out;
    ck_assert_int_eq(api_completion_encode(&head, &c, 1, &u, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out,
                     "{\"id\":\"cmpl-42\",\"object\":\"text_completion\",\"created\":1764474000,"
                     "\"model\":\"tiny-llama\",\"choices\":[{\"index\":0,"
                     "\"text\":\"Hello world\xC3\xA9?\",\"logprobs\":{"
                     "\"tokens\":[\"Hello\",\" world\",\"\xC3\xA9\",\"?\"],"
                     "\"token_logprobs\":[null,-0.25,-0.1,-1.2e-05],"
                     "\"top_logprobs\":[null,{\" world\":-0.25,\" there\":-1.5},"
                     "{\"\xC3\xA9\":-0.1,\"!\":-9999.0},{}],"
                     "\"text_offset\":[0,5,11,12]},\"finish_reason\":\"stop\"}],"
                     "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":3,"
                     "\"total_tokens\":4}}");
    json_error_t je;
    json_t *j = json_loads(out, JSON_REJECT_DUPLICATES, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_decref(j);

    /* Explicit offsets (echoed prompt tokens) are written as given, not
     * added up from the token texts. */
    static const uint32_t offs[] = {0, 3, 3, 9};
    lp.text_offsets = offs;
    ck_assert_int_eq(api_completion_encode(&head, &c, 1, &u, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_ptr_nonnull(strstr(out, "\"text_offset\":[0,3,3,9]},\"finish_reason\":\"stop\"}"));
    ck_assert_ptr_null(strstr(out, "[0,5,11,12]"));
}
END_TEST

START_TEST(chunks)
{
    struct api_choice c = {.index = 1, .text = {" tok", 4}, .finish = API_FINISH_NONE};
    char *out;
    size_t len;
    ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, &len, NULL), INF_OK);
    const char *want = "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\","
                       "\"created\":1764474000,\"model\":\"tiny-llama\",\"choices\":[{\"index\":1,"
                       "\"text\":\" tok\",\"logprobs\":null,\"finish_reason\":null}],"
                       "\"usage\":null}\n\n";
    ck_assert_str_eq(out, want);
    ck_assert_uint_eq(len, strlen(want));

    /* The last delta carries the finish reason; a cancelled one says "abort". */
    c.text.s = "";
    c.text.len = 0;
    c.finish = API_FINISH_LENGTH;
    ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\","
                          "\"created\":1764474000,\"model\":\"tiny-llama\",\"choices\":[{"
                          "\"index\":1,\"text\":\"\",\"logprobs\":null,"
                          "\"finish_reason\":\"length\"}],\"usage\":null}\n\n");
    c.finish = API_FINISH_ABORT;
    ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_ptr_nonnull(strstr(out, "\"finish_reason\":\"abort\"}"));

    /* A streamed delta's text offsets continue from the text already sent. */
    struct api_token_logprob t[] = {{{"\xF0\x9F\x98\x80", 4}, -0.5f, NULL, 0},
                                    {{"x", 1}, -2.0f, NULL, 0}};
    struct api_logprobs lp = {t, 2, 17, NULL};
    struct api_choice d = {.index = 0, .text = {"\xF0\x9F\x98\x80x", 5}, .logprobs = &lp};
    ck_assert_int_eq(api_chunk_encode(&head, &d, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\","
                          "\"created\":1764474000,\"model\":\"tiny-llama\",\"choices\":[{"
                          "\"index\":0,\"text\":\"\xF0\x9F\x98\x80x\",\"logprobs\":{"
                          "\"tokens\":[\"\xF0\x9F\x98\x80\",\"x\"],\"token_logprobs\":[-0.5,-2.0],"
                          "\"top_logprobs\":[null,null],\"text_offset\":[17,18]},"
                          "\"finish_reason\":null}],\"usage\":null}\n\n");

    struct api_usage u = {3, 9};
    ck_assert_int_eq(api_chunk_usage_encode(&head, &u, &arena, &out, &len, NULL), INF_OK);
    ck_assert_str_eq(out, "data: {\"id\":\"cmpl-42\",\"object\":\"text_completion\","
                          "\"created\":1764474000,\"model\":\"tiny-llama\",\"choices\":[],"
                          "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9,"
                          "\"total_tokens\":12}}\n\n");
    ck_assert_str_eq(API_SSE_DONE, "data: [DONE]\n\n");

    /* No id and no model: "cmpl-" and null, still valid JSON. */
    struct api_resp_head bare = {NULL, 0, NULL};
    ck_assert_int_eq(api_chunk_usage_encode(&bare, &u, &arena, &out, NULL, NULL), INF_OK);
    ck_assert_str_eq(out, "data: {\"id\":\"cmpl-\",\"object\":\"text_completion\","
                          "\"created\":0,\"model\":null,\"choices\":[],"
                          "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9,"
                          "\"total_tokens\":12}}\n\n");
}
END_TEST

/* Text that is not clean UTF-8 (a token cut mid-character, control bytes)
 * still gives valid JSON: controls escaped, each bad sequence one U+FFFD. */
START_TEST(text_escaping)
{
    const char text[] = "q\"b\\s/\x01\x1f\x7f\t\r\b\f\n\0z"
                        "\xE2\x82"     /* truncated € */
                        "A\xFF"        /* never valid */
                        "\xC0\xAF"     /* overlong '/' */
                        "\xED\xA0\x80" /* a surrogate */
                        "\xE2\x82\xAC" /* € */
                        "\xF0\x9F\x98";
    struct api_choice c = {.index = 0, .text = {text, sizeof text - 1}};
    char *out;
    ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, NULL, NULL), INF_OK);
    const char *want_text = "\"text\":\"q\\\"b\\\\s/\\u0001\\u001f\x7f\\t\\r\\b\\f\\n\\u0000z"
                            "\xEF\xBF\xBD"
                            "A\xEF\xBF\xBD"
                            "\xEF\xBF\xBD\xEF\xBF\xBD"
                            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                            "\xE2\x82\xAC"
                            "\xEF\xBF\xBD\"";
    ck_assert_msg(strstr(out, want_text) != NULL, "got %s", out);

    json_error_t je;
    json_t *j = json_loads(out + 6, JSON_ALLOW_NUL, &je);
    ck_assert_msg(j != NULL, "%s", je.text);
    json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
    ck_assert_uint_eq(json_string_length(t), 16 + 3 + 1 + 3 + 6 + 9 + 3 + 3);
    ck_assert_mem_eq(json_string_value(t), "q\"b\\s/\x01\x1f\x7f\t\r\b\f\n\0z\xEF\xBF\xBD", 19);
    json_decref(j);

    /* api_utf8_chars counts what Python's len() would after decoding with
     * errors="replace". */
    ck_assert_uint_eq(api_utf8_chars("", 0), 0);
    ck_assert_uint_eq(api_utf8_chars("abc", 3), 3);
    ck_assert_uint_eq(api_utf8_chars("\xE2\x82\xAC\xF0\x9F\x98\x80", 7), 2);
    ck_assert_uint_eq(api_utf8_chars("\xE2\x82"
                                     "A",
                                     3),
                      2);
    ck_assert_uint_eq(api_utf8_chars("\xC0\xAF", 2), 2);
    ck_assert_uint_eq(api_utf8_chars("\xF4\x90\x80\x80", 4), 4); /* above U+10FFFF */
}
END_TEST

/* Logprobs print as the shortest decimal that reads back as the same float:
 * checked against strtof and against every shorter precision. */
START_TEST(float_roundtrip)
{
    uint32_t state = 12345;
    for (int i = 0; i < 20000; i++) {
        state = state * 1664525u + 1013904223u;
        float v;
        if (i < 10000) {
            v = -(float)(state >> 8) / (float)(1u << 24) * 30.0f; /* typical logprobs */
        } else {
            uint32_t bits = (state & 0x7FFFFFFFu) | 0x80000000u; /* any negative float */
            memcpy(&v, &bits, 4);
            if (!isfinite(v) || v < -9999.0f)
                continue;
        }
        struct api_token_logprob t = {{"x", 1}, v, NULL, 0};
        struct api_logprobs lp = {&t, 1, 0, NULL};
        struct api_choice c = {.index = 0, .text = {"x", 1}, .logprobs = &lp};
        char *out;
        ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, NULL, NULL), INF_OK);
        const char *p = strstr(out, "\"token_logprobs\":[") + 18;
        char num[64];
        size_t n = strcspn(p, "]");
        ck_assert_uint_lt(n, sizeof num);
        memcpy(num, p, n);
        num[n] = '\0';
        ck_assert_msg(strtof(num, NULL) == v, "%s does not read back as %.9g", num, (double)v);
        /* Its significant digits (no sign, point, exponent, or leading and
         * trailing zeros); one fewer must not round-trip. */
        char sig[64];
        int k = 0;
        for (const char *q = num; *q && *q != 'e'; q++)
            if (*q >= '0' && *q <= '9' && (k > 0 || *q != '0'))
                sig[k++] = *q;
        while (k > 1 && sig[k - 1] == '0')
            k--;
        int digits = k;
        if (digits > 1) {
            char shorter[64];
            snprintf(shorter, sizeof shorter, "%.*e", digits - 2, (double)v);
            ck_assert_msg(strtof(shorter, NULL) != v, "%s is not the shortest (%s)", num, shorter);
        }
        inf_arena_reset(&arena);
    }
}
END_TEST

static void expect_lp(float v, const char *want)
{
    struct api_token_logprob t = {{"x", 1}, v, NULL, 0};
    struct api_logprobs lp = {&t, 1, 0, NULL};
    struct api_choice c = {.index = 0, .text = {"x", 1}, .logprobs = &lp};
    char *out;
    ck_assert_int_eq(api_chunk_encode(&head, &c, &arena, &out, NULL, NULL), INF_OK);
    char needle[80];
    snprintf(needle, sizeof needle, "\"token_logprobs\":[%s]", want);
    ck_assert_msg(strstr(out, needle) != NULL, "%g: want %s in %s", (double)v, want, out);
}

START_TEST(float_forms)
{
    expect_lp(0.0f, "0.0");
    expect_lp(-0.0f, "-0.0");
    expect_lp(-1.0f, "-1.0");
    expect_lp(-0.5f, "-0.5");
    expect_lp(-0.1f, "-0.1");
    expect_lp(-123.25f, "-123.25");
    expect_lp(-9999.0f, "-9999.0");
    expect_lp(-10000.0f, "-9999.0");
    expect_lp(-INFINITY, "-9999.0");
    expect_lp(NAN, "null");
    expect_lp(INFINITY, "null");
    expect_lp(-0.0001f, "-0.0001");
    expect_lp(-0.00001f, "-1e-05");
    expect_lp(-1.5e-7f, "-1.5e-07");
    expect_lp(-1.17549435e-38f, "-1.1754944e-38");
    expect_lp(-1e-45f, "-1e-45");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("api_completions");
    TCase *tc = tcase_create("parse");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_loop_test(tc, bad_input, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
    tcase_add_test(tc, bad_input_body);
    tcase_add_test(tc, long_model_name);
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, logit_bias_times_choices_bounded);
    tcase_add_test(tc, full_request);
    tcase_add_test(tc, prompt_shapes);
    tcase_add_test(tc, edge_values);
    tcase_add_test(tc, ignored_keys);
    suite_add_tcase(s, tc);

    tc = tcase_create("context");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, context_check);
    suite_add_tcase(s, tc);

    tc = tcase_create("encode");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, response_plain);
    tcase_add_test(tc, response_logprobs);
    tcase_add_test(tc, chunks);
    tcase_add_test(tc, text_escaping);
    tcase_add_test(tc, float_roundtrip);
    tcase_add_test(tc, float_forms);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
