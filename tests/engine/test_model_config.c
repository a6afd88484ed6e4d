/* config.json parsing: each architecture, GQA, llama3 rope scaling, eos
 * lists, defaults, and each refusal naming its key. */
#include "engine/weights/model_config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static inf_status_t parse(const char *json, struct eng_model_config *cfg, struct inf_err *err)
{
    inf_err_clear(err);
    return eng_model_config_parse(json, strlen(json), cfg, err);
}

/* A Llama config with extra keys spliced in before the closing brace. */
static char *llama_with(const char *extra)
{
    static char buf[4096];
    snprintf(buf, sizeof buf,
             "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
             "\"hidden_size\":4096,\"intermediate_size\":11008,\"num_hidden_layers\":32,"
             "\"num_attention_heads\":32,\"vocab_size\":32000%s%s}",
             extra[0] ? "," : "", extra);
    return buf;
}

static const char *keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "vocab_size"};

/* The required keys of a Llama config, key `which` set to value (absent when
 * value is NULL). */
static void llama_custom(char *buf, size_t cap, int which, const char *value)
{
    static const char *vals[] = {"4096", "11008", "32", "32", "32000"};
    size_t n = (size_t)snprintf(buf, cap, "{\"architectures\":[\"LlamaForCausalLM\"]");
    for (int i = 0; i < 5 && n < cap; i++) {
        if (i == which && !value)
            continue;
        n +=
            (size_t)snprintf(buf + n, cap - n, ",\"%s\":%s", keys[i], i == which ? value : vals[i]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "}");
}

static void expect_refused(const char *extra, inf_status_t code, const char *key)
{
    struct eng_model_config cfg;
    struct inf_err err;
    inf_status_t s = parse(llama_with(extra), &cfg, &err);
    ck_assert_msg(s == code, "%s: status %s, want %s (%s)", extra, inf_status_name(s),
                  inf_status_name(code), err.msg);
    ck_assert_msg(strstr(err.msg, key), "%s: '%s' not in '%s'", extra, key, err.msg);
}

START_TEST(llama2_7b)
{
    /* Llama-2-7b-hf's config.json */
    const char *js =
        "{\"_name_or_path\":\"meta-llama/Llama-2-7b-hf\",\"architectures\":[\"LlamaForCausalLM\"],"
        "\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,"
        "\"initializer_range\":0.02,\"intermediate_size\":11008,\"max_position_embeddings\":4096,"
        "\"model_type\":\"llama\",\"num_attention_heads\":32,\"num_hidden_layers\":32,"
        "\"num_key_value_heads\":32,\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,"
        "\"rope_scaling\":null,\"tie_word_embeddings\":false,\"torch_dtype\":\"float16\","
        "\"transformers_version\":\"4.31.0.dev0\",\"use_cache\":true,\"vocab_size\":32000}";
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_LLAMA);
    ck_assert_int_eq(c.hidden, 4096);
    ck_assert_int_eq(c.intermediate, 11008);
    ck_assert_int_eq(c.n_layers, 32);
    ck_assert_int_eq(c.n_heads, 32);
    ck_assert_int_eq(c.n_kv_heads, 32);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.vocab, 32000);
    ck_assert_int_eq(c.max_pos, 4096);
    ck_assert_float_eq_tol(c.rms_eps, 1e-5f, 1e-12f);
    ck_assert_float_eq(c.rope_theta, 10000.0f);
    ck_assert(!c.rope_llama3);
    ck_assert(!c.tie_embeddings);
    ck_assert(!c.qkv_bias);
    ck_assert_int_eq(c.bos_id, 1);
    ck_assert_int_eq(c.n_eos, 1);
    ck_assert_int_eq(c.eos_ids[0], 2);
    ck_assert_str_eq(c.torch_dtype, "float16");
}
END_TEST

START_TEST(llama3_gqa_rope_eos_list)
{
    /* Llama-3.1-8B-Instruct's config.json */
    const char *js =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,"
        "\"attention_dropout\":0.0,\"bos_token_id\":128000,"
        "\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\",\"hidden_size\":4096,"
        "\"initializer_range\":0.02,\"intermediate_size\":14336,"
        "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
        "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
        "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,"
        "\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"rope_theta\":500000.0,\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
        "\"transformers_version\":\"4.42.3\",\"use_cache\":true,\"vocab_size\":128256}";
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.n_heads, 32);
    ck_assert_int_eq(c.n_kv_heads, 8);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.intermediate, 14336);
    ck_assert_int_eq(c.vocab, 128256);
    ck_assert_int_eq(c.max_pos, 131072);
    ck_assert_float_eq(c.rope_theta, 500000.0f);
    ck_assert(c.rope_llama3);
    ck_assert_float_eq(c.rope_factor, 8.0f);
    ck_assert_float_eq(c.rope_low_freq, 1.0f);
    ck_assert_float_eq(c.rope_high_freq, 4.0f);
    ck_assert_int_eq(c.rope_orig_max_pos, 8192);
    ck_assert_int_eq(c.bos_id, 128000);
    ck_assert_int_eq(c.n_eos, 3);
    ck_assert_int_eq(c.eos_ids[0], 128001);
    ck_assert_int_eq(c.eos_ids[1], 128008);
    ck_assert_int_eq(c.eos_ids[2], 128009);
    ck_assert_str_eq(c.torch_dtype, "bfloat16");
}
END_TEST

START_TEST(llama3_rope_under_type_key)
{
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(parse(llama_with("\"rope_scaling\":{\"type\":\"llama3\",\"factor\":32,"
                                      "\"low_freq_factor\":1,\"high_freq_factor\":4,"
                                      "\"original_max_position_embeddings\":8192}"),
                           &c, &err),
                     INF_OK);
    ck_assert(c.rope_llama3);
    ck_assert_float_eq(c.rope_factor, 32.0f);
    /* rope_type default means no scaling */
    ck_assert_int_eq(parse(llama_with("\"rope_scaling\":{\"rope_type\":\"default\"}"), &c, &err),
                     INF_OK);
    ck_assert(!c.rope_llama3);
}
END_TEST

START_TEST(mistral)
{
    /* Mistral-7B-v0.1 has a 4096 window under a 32768 context: kept;
     * v0.2 and later set sliding_window null, and a window that covers
     * the context is none. */
    const char *base = "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,"
                       "\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,"
                       "\"intermediate_size\":14336,\"max_position_embeddings\":32768,"
                       "\"model_type\":\"mistral\",\"num_attention_heads\":32,"
                       "\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
                       "\"rms_norm_eps\":1e-05,\"rope_theta\":1000000.0,"
                       "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\","
                       "\"vocab_size\":32000,\"sliding_window\":%s}";
    char js[1024];
    struct eng_model_config c;
    struct inf_err err;
    snprintf(js, sizeof js, base, "null");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_MISTRAL);
    ck_assert_int_eq(c.n_kv_heads, 8);
    ck_assert_float_eq(c.rope_theta, 1e6f);
    ck_assert(!c.qkv_bias);
    ck_assert_int_eq(c.sliding_window, 0);
    snprintf(js, sizeof js, base, "32768");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 0);
    snprintf(js, sizeof js, base, "65536");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 0);
    snprintf(js, sizeof js, base, "4096");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 4096);
    snprintf(js, sizeof js, base, "32767");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 32767);
    snprintf(js, sizeof js, base, "1");
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 1);
    snprintf(js, sizeof js, base, "0");
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
    snprintf(js, sizeof js, base, "-4");
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
    snprintf(js, sizeof js, base, "4096.5");
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
    snprintf(js, sizeof js, base, "\"big\"");
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
}
END_TEST

START_TEST(qwen2)
{
    /* Qwen2.5-0.5B-Instruct: tied embeddings, q/k/v biases, and a sliding
     * window that is switched off */
    const char *js = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,"
                     "\"bos_token_id\":151643,\"eos_token_id\":151645,\"hidden_act\":\"silu\","
                     "\"hidden_size\":896,\"initializer_range\":0.02,\"intermediate_size\":4864,"
                     "\"max_position_embeddings\":32768,\"max_window_layers\":21,"
                     "\"model_type\":\"qwen2\",\"num_attention_heads\":14,"
                     "\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
                     "\"rope_theta\":1000000.0,\"sliding_window\":32768,"
                     "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
                     "\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(parse(js, &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_QWEN2);
    ck_assert(c.qkv_bias);
    ck_assert(c.tie_embeddings);
    ck_assert_int_eq(c.hidden, 896);
    ck_assert_int_eq(c.n_heads, 14);
    ck_assert_int_eq(c.n_kv_heads, 2);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.vocab, 151936);
    ck_assert_float_eq_tol(c.rms_eps, 1e-6f, 1e-13f);
    ck_assert_int_eq(c.bos_id, 151643);
    ck_assert_int_eq(c.eos_ids[0], 151645);
    /* a window switched on and smaller than the context is refused */
    char js2[2048];
    snprintf(js2, sizeof js2, "%s", js);
    char *p = strstr(js2, "\"use_sliding_window\":false");
    memcpy(p, "\"use_sliding_window\":true ", strlen("\"use_sliding_window\":true "));
    ck_assert_int_eq(parse(js2, &c, &err), INF_OK); /* window 32768 == context: fine */
    ck_assert_int_eq(c.sliding_window, 0);
    p = strstr(js2, "\"sliding_window\":32768");
    memcpy(p, "\"sliding_window\":4096 ", strlen("\"sliding_window\":4096 "));
    ck_assert_int_eq(parse(js2, &c, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "sliding_window"));
    /* switched off, the same small window is ignored */
    p = strstr(js2, "\"use_sliding_window\":true ");
    memcpy(p, "\"use_sliding_window\":false", strlen("\"use_sliding_window\":false"));
    ck_assert_int_eq(parse(js2, &c, &err), INF_OK);
    ck_assert_int_eq(c.sliding_window, 0);
}
END_TEST

START_TEST(explicit_head_dim_and_defaults)
{
    struct eng_model_config c;
    struct inf_err err;
    /* head_dim given: hidden need not be heads x head_dim (Mistral-Nemo style) */
    ck_assert_int_eq(parse(llama_with("\"head_dim\":96,\"num_key_value_heads\":8"), &c, &err),
                     INF_OK);
    ck_assert_int_eq(c.head_dim, 96);
    ck_assert_int_eq(c.hidden, 4096);
    ck_assert_int_eq(c.n_kv_heads, 8);
    /* defaults: transformers' LlamaConfig */
    ck_assert_int_eq(parse(llama_with(""), &c, &err), INF_OK);
    ck_assert_int_eq(c.n_kv_heads, 32);
    ck_assert_int_eq(c.max_pos, 2048);
    ck_assert_float_eq_tol(c.rms_eps, 1e-6f, 1e-13f);
    ck_assert_float_eq(c.rope_theta, 10000.0f);
    ck_assert_int_eq(c.bos_id, -1);
    ck_assert_int_eq(c.n_eos, 0);
    ck_assert_str_eq(c.torch_dtype, "");
    ck_assert(!c.tie_embeddings);
    /* head_dim null counts as absent; the newer "dtype" key is read */
    ck_assert_int_eq(parse(llama_with("\"head_dim\":null,\"dtype\":\"float32\""), &c, &err),
                     INF_OK);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_str_eq(c.torch_dtype, "float32");
    /* model_type alone identifies the architecture */
    const char *mt = "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100}";
    ck_assert_int_eq(parse(mt, &c, &err), INF_OK);
    ck_assert_int_eq(c.arch, ENG_ARCH_QWEN2);
    ck_assert_int_eq(c.head_dim, 16);
}
END_TEST

START_TEST(refusals_name_their_key)
{
    expect_refused("\"num_key_value_heads\":5", INF_E_INVALID, "num_key_value_heads");
    expect_refused("\"num_key_value_heads\":0", INF_E_INVALID, "num_key_value_heads");
    expect_refused("\"head_dim\":0", INF_E_INVALID, "head_dim");
    expect_refused("\"head_dim\":33", INF_E_UNSUPPORTED, "head_dim");
    expect_refused("\"max_position_embeddings\":-1", INF_E_INVALID, "max_position_embeddings");
    expect_refused("\"rms_norm_eps\":0", INF_E_INVALID, "rms_norm_eps");
    expect_refused("\"rms_norm_eps\":\"small\"", INF_E_INVALID, "rms_norm_eps");
    expect_refused("\"rope_theta\":-5", INF_E_INVALID, "rope_theta");
    expect_refused("\"tie_word_embeddings\":1", INF_E_INVALID, "tie_word_embeddings");
    expect_refused("\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}", INF_E_UNSUPPORTED,
                   "rope_scaling.rope_type 'yarn'");
    expect_refused("\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}", INF_E_UNSUPPORTED,
                   "rope_scaling.type 'linear'");
    expect_refused("\"rope_scaling\":{\"factor\":2}", INF_E_INVALID, "rope_scaling.type");
    expect_refused("\"rope_scaling\":[1]", INF_E_INVALID, "rope_scaling");
    expect_refused("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                   "\"low_freq_factor\":1,\"high_freq_factor\":4}",
                   INF_E_INVALID, "rope_scaling.original_max_position_embeddings");
    expect_refused("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                   "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}",
                   INF_E_INVALID, "low_freq_factor");
    expect_refused("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":-8,"
                   "\"low_freq_factor\":1,\"high_freq_factor\":4,"
                   "\"original_max_position_embeddings\":8192}",
                   INF_E_INVALID, "rope_scaling.factor");
    expect_refused("\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,"
                   "\"low_freq_factor\":4,\"high_freq_factor\":1,"
                   "\"original_max_position_embeddings\":8192}",
                   INF_E_INVALID, "high_freq_factor");
    expect_refused("\"hidden_act\":\"gelu\"", INF_E_UNSUPPORTED, "hidden_act");
    expect_refused("\"attention_bias\":true", INF_E_UNSUPPORTED, "attention_bias");
    expect_refused("\"mlp_bias\":true", INF_E_UNSUPPORTED, "mlp_bias");
    expect_refused("\"sliding_window\":1024", INF_E_UNSUPPORTED, "sliding_window");
    expect_refused("\"torch_dtype\":\"float64\"", INF_E_UNSUPPORTED, "torch_dtype");
    expect_refused("\"eos_token_id\":\"2\"", INF_E_INVALID, "eos_token_id");
    expect_refused("\"eos_token_id\":[1,\"2\"]", INF_E_INVALID, "eos_token_id[1]");
    expect_refused("\"eos_token_id\":32000", INF_E_INVALID, "eos_token_id");
    expect_refused("\"eos_token_id\":[1,2,3,4,5,6,7,8,9]", INF_E_UNSUPPORTED, "eos_token_id");
    expect_refused("\"bos_token_id\":-3", INF_E_INVALID, "bos_token_id");
}
END_TEST

START_TEST(refusals_required_and_architecture)
{
    struct eng_model_config c;
    struct inf_err err;
    for (int i = 0; i < 5; i++) {
        char js[1024];
        /* the key missing */
        llama_custom(js, sizeof js, i, NULL);
        ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
        ck_assert_msg(strstr(err.msg, keys[i]), "'%s' not in '%s'", keys[i], err.msg);
        /* zero, negative, a string, too large, not an integer */
        const char *bad[] = {"0", "-4", "\"64\"", "3000000000", "1.5"};
        for (size_t j = 0; j < 5; j++) {
            llama_custom(js, sizeof js, i, bad[j]);
            ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
            ck_assert_msg(strstr(err.msg, keys[i]), "'%s' not in '%s'", keys[i], err.msg);
        }
    }
    /* hidden not divisible by heads and no head_dim */
    const char *js = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":100,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":3,\"vocab_size\":10}";
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "hidden_size"));
    ck_assert_ptr_nonnull(strstr(err.msg, "num_attention_heads"));

    js = "{\"architectures\":[\"GPT2LMHeadModel\"],\"hidden_size\":64}";
    ck_assert_int_eq(parse(js, &c, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "architectures"));
    ck_assert_ptr_nonnull(strstr(err.msg, "GPT2LMHeadModel"));
    js = "{\"architectures\":[],\"hidden_size\":64}";
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "architectures"));
    js = "{\"model_type\":\"gemma\"}";
    ck_assert_int_eq(parse(js, &c, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "model_type"));
    js = "{\"hidden_size\":64}";
    ck_assert_int_eq(parse(js, &c, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "architectures"));
    ck_assert_int_eq(parse("{\"a\":", &c, &err), INF_E_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));
    ck_assert_int_eq(parse("[1]", &c, &err), INF_E_FORMAT);
    /* duplicate keys are malformed */
    ck_assert_int_eq(parse(llama_with("\"hidden_size\":8"), &c, &err), INF_E_FORMAT);
}
END_TEST

START_TEST(load_from_folder)
{
    char dir[] = "/tmp/int4serve-cfg-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    struct eng_model_config c;
    struct inf_err err;
    ck_assert_int_eq(eng_model_config_load(dir, &c, &err), INF_E_NOTFOUND);
    ck_assert_ptr_nonnull(strstr(err.msg, "config.json"));
    ck_assert_ptr_null(strstr(err.msg, "/tmp"));
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(llama_with("\"num_key_value_heads\":4"), f);
    fclose(f);
    ck_assert_int_eq(eng_model_config_load(dir, &c, &err), INF_OK);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_int_eq(c.hidden, 4096);
    unlink(path);
    rmdir(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("model_config");
    TCase *tc = tcase_create("architectures");
    tcase_add_test(tc, llama2_7b);
    tcase_add_test(tc, llama3_gqa_rope_eos_list);
    tcase_add_test(tc, llama3_rope_under_type_key);
    tcase_add_test(tc, mistral);
    tcase_add_test(tc, qwen2);
    tcase_add_test(tc, explicit_head_dim_and_defaults);
    tcase_add_test(tc, load_from_folder);
    suite_add_tcase(s, tc);
    tc = tcase_create("refusals");
    tcase_add_test(tc, refusals_name_their_key);
    tcase_add_test(tc, refusals_required_and_architecture);
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
