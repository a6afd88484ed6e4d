/* engine/weights/qconfig.c: config.json's quantization_config and
 * quantize_config.json into struct eng_qcfg. Each format's keys, defaults
 * and aliases, which layers a config covers (AWQ's modules_to_not_convert,
 * GPTQ's lm_head, compressed-tensors' targets and ignore with "re:"
 * patterns), and every refusal naming its file and key. */
#include "engine/weights/qconfig.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct eng_qcfg q;
static struct inf_err err;

static inf_status_t parse(const char *json)
{
    eng_qcfg_free(&q);
    inf_err_clear(&err);
    return eng_qcfg_parse(json, strlen(json), "config.json", true, &q, &err);
}

/* A refusal with code and every needle in its message. */
static void refused(const char *json, inf_status_t code, const char *n1, const char *n2)
{
    inf_status_t s = parse(json);
    ck_assert_msg(s == code, "%s: status %d (%s), want %d", json, s, err.msg, code);
    ck_assert_msg(strstr(err.msg, n1) != NULL, "'%s' lacks '%s'", err.msg, n1);
    if (n2)
        ck_assert_msg(strstr(err.msg, n2) != NULL, "'%s' lacks '%s'", err.msg, n2);
    ck_assert_int_eq(q.method, ENG_QM_NONE); /* nothing left behind */
}

static bool layer(const char *name, struct eng_qlayer *out)
{
    return eng_qcfg_layer(&q, name, out);
}

static void teardown(void)
{
    eng_qcfg_free(&q);
}

#define QC(body) "{\"hidden_size\": 8, \"quantization_config\": {" body "}}"

START_TEST(none_without_quantization_config)
{
    struct eng_qlayer l;
    ck_assert_int_eq(parse("{\"hidden_size\": 8}"), INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_NONE);
    ck_assert(!layer("model.layers.0.self_attn.q_proj", &l));
    ck_assert_int_eq(parse("{\"quantization_config\": null}"), INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_NONE);
    ck_assert_str_eq(eng_qmethod_name(ENG_QM_CT), "compressed-tensors");
}
END_TEST

START_TEST(awq_keys_aliases_and_layers)
{
    struct eng_qlayer l;
    ck_assert_int_eq(parse(QC("\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 64, "
                              "\"zero_point\": true, \"version\": \"GEMM\", "
                              "\"modules_to_not_convert\": [\"mlp.down_proj\"]")),
                     INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_AWQ);
    ck_assert(layer("model.layers.3.self_attn.o_proj", &l));
    ck_assert_int_eq(l.method, ENG_QM_AWQ);
    ck_assert_int_eq(l.group, 64);
    ck_assert(!l.sym && !l.act_order && !l.zero_minus_one);
    ck_assert(!layer("model.layers.3.mlp.down_proj", &l)); /* a substring, as transformers */
    ck_assert(!layer("lm_head", &l));                      /* AutoAWQ never quantizes it */
    ck_assert_ptr_nonnull(strstr(q.desc, "group 64"));
    /* AutoAWQ's own quant_config names; defaults version gemm, zero points */
    ck_assert_int_eq(parse(QC("\"quant_method\": \"awq\", \"w_bit\": 4, \"q_group_size\": -1")),
                     INF_OK);
    ck_assert(layer("model.layers.0.mlp.up_proj", &l));
    ck_assert_int_eq(l.group, -1);
}
END_TEST

START_TEST(awq_refusals)
{
    refused(QC("\"quant_method\": \"awq\", \"version\": \"gemv\""), INF_E_UNSUPPORTED,
            "config.json: quantization_config.version 'gemv'", "gemm");
    refused(QC("\"quant_method\": \"awq\", \"version\": \"exllama\""), INF_E_UNSUPPORTED,
            "'exllama'", NULL);
    refused(QC("\"quant_method\": \"awq\", \"zero_point\": false"), INF_E_UNSUPPORTED,
            "quantization_config.zero_point", NULL);
    refused(QC("\"quant_method\": \"awq\", \"bits\": 8"), INF_E_UNSUPPORTED,
            "config.json: quantization_config.bits 8", NULL);
    refused(QC("\"quant_method\": \"awq\", \"w_bit\": 3"), INF_E_UNSUPPORTED,
            "quantization_config.w_bit 3", NULL);
    refused(QC("\"quant_method\": \"awq\", \"group_size\": 100"), INF_E_UNSUPPORTED,
            "quantization_config.group_size 100", NULL);
    refused(QC("\"quant_method\": \"awq\", \"modules_to_not_convert\": \"lm_head\""), INF_E_INVALID,
            "modules_to_not_convert", NULL);
}
END_TEST

START_TEST(gptq_keys_and_defaults)
{
    struct eng_qlayer l;
    ck_assert_int_eq(parse(QC("\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128")),
                     INF_OK);
    ck_assert(layer("model.layers.0.self_attn.k_proj", &l));
    ck_assert_int_eq(l.method, ENG_QM_GPTQ);
    ck_assert_int_eq(l.group, 128);
    ck_assert(l.sym);            /* GPTQ's default */
    ck_assert(!l.act_order);     /* desc_act false by default */
    ck_assert(l.zero_minus_one); /* checkpoint_format gptq */
    ck_assert(!layer("lm_head", &l));
    ck_assert_int_eq(parse(QC("\"quant_method\": \"gptq\", \"group_size\": -1, \"desc_act\": true, "
                              "\"sym\": false, \"checkpoint_format\": \"gptq_v2\", "
                              "\"lm_head\": true, \"dynamic\": {}, \"pack_dtype\": \"int32\"")),
                     INF_OK);
    ck_assert(layer("lm_head", &l));
    ck_assert(l.act_order && !l.sym && !l.zero_minus_one);
    ck_assert_int_eq(l.group, -1);
    ck_assert_ptr_nonnull(strstr(q.desc, "desc_act"));
    ck_assert_ptr_nonnull(strstr(q.desc, "gptq_v2"));
    /* groups of a multiple of 256 are held as repeated groups of 256 */
    ck_assert_int_eq(parse(QC("\"quant_method\": \"gptq\", \"group_size\": 1024")), INF_OK);
}
END_TEST

START_TEST(gptq_refusals)
{
    refused(QC("\"quant_method\": \"gptq\", \"bits\": 3"), INF_E_UNSUPPORTED,
            "config.json: quantization_config.bits 3", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"bits\": 8"), INF_E_UNSUPPORTED, "bits 8", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"group_size\": 16"), INF_E_UNSUPPORTED,
            "quantization_config.group_size 16", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"checkpoint_format\": \"marlin\""), INF_E_UNSUPPORTED,
            "quantization_config.checkpoint_format 'marlin'", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"is_marlin_format\": true"), INF_E_UNSUPPORTED,
            "is_marlin_format", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"pack_dtype\": \"int16\""), INF_E_UNSUPPORTED,
            "pack_dtype 'int16'", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"dynamic\": {\"-:.*mlp.*\": {}}"), INF_E_UNSUPPORTED,
            "quantization_config.dynamic", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"desc_act\": 1"), INF_E_INVALID,
            "quantization_config.desc_act must be true or false", NULL);
    refused(QC("\"quant_method\": \"gptq\", \"group_size\": \"128\""), INF_E_INVALID,
            "group_size must be an integer", NULL);
}
END_TEST

START_TEST(compressed_tensors_targets_and_ignore)
{
    struct eng_qlayer l;
    ck_assert_int_eq(
        parse(QC("\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                 "\"config_groups\": {"
                 "\"group_0\": {\"targets\": [\"re:.*self_attn\\\\..*\"], \"weights\": "
                 "{\"num_bits\": 4, \"type\": \"int\", \"symmetric\": false, \"strategy\": "
                 "\"group\", \"group_size\": 32, \"actorder\": \"group\"}},"
                 "\"group_1\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, "
                 "\"type\": \"int\", \"symmetric\": true, \"strategy\": \"channel\"}, "
                 "\"input_activations\": null}},"
                 "\"ignore\": [\"lm_head\", \"re:.*layers\\\\.1\\\\.mlp\\\\.down_proj$\"], "
                 "\"kv_cache_scheme\": null, \"sparsity_config\": {\"format\": \"dense\"}")),
        INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_CT);
    ck_assert(layer("model.layers.0.self_attn.q_proj", &l));
    ck_assert_int_eq(l.group, 32);
    ck_assert(!l.sym && l.act_order);
    ck_assert(layer("model.layers.0.mlp.gate_proj", &l)); /* "Linear": every other layer */
    ck_assert_int_eq(l.group, -1);
    ck_assert(l.sym && !l.act_order);
    ck_assert(layer("model.layers.0.mlp.down_proj", &l));
    ck_assert(!layer("model.layers.1.mlp.down_proj", &l)); /* ignored by pattern */
    ck_assert(!layer("lm_head", &l));                      /* ignored by name */
    /* a pattern matches from the name's start (re.match), not inside it */
    ck_assert_int_eq(
        parse(QC("\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
                 "\"config_groups\": {\"g\": {\"targets\": [\"re:self_attn\"], \"weights\": "
                 "{\"num_bits\": 4, \"strategy\": \"channel\"}}}")),
        INF_OK);
    ck_assert(!layer("model.layers.0.self_attn.q_proj", &l));
    ck_assert(layer("self_attn.q_proj", &l));
}
END_TEST

#define CT(groups, extra)                                                                          \
    QC("\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "                \
       "\"config_groups\": {\"group_0\": " groups "}" extra)
#define A8 "a?a?a?a?a?a?a?a?"
#define W4(extra)                                                                                  \
    "{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", "               \
    "\"strategy\": \"group\", \"group_size\": 128" extra "}}"

START_TEST(compressed_tensors_refusals)
{
    ck_assert_int_eq(parse(CT(W4(""), "")), INF_OK);
    refused(QC("\"quant_method\": \"compressed-tensors\", \"format\": \"naive-quantized\", "
               "\"config_groups\": {\"group_0\": " W4("") "}"),
            INF_E_UNSUPPORTED, "format 'naive-quantized'", NULL);
    refused(QC("\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
               "\"config_groups\": {\"group_0\": " W4("") "}"),
            INF_E_UNSUPPORTED, "format 'float-quantized'", "pack-quantized");
    /* a config group's own format wins over the top-level one */
    refused(QC("\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
               "\"config_groups\": {\"group_0\": {\"format\": \"int-quantized\", \"targets\": "
               "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"strategy\": \"channel\"}}}"),
            INF_E_UNSUPPORTED, "'int-quantized'", NULL);
    refused(CT("{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, \"strategy\": "
               "\"channel\"}}",
               ""),
            INF_E_UNSUPPORTED, "config_groups.group_0.weights.num_bits 8", NULL);
    refused(CT("{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"float\", "
               "\"strategy\": \"channel\"}}",
               ""),
            INF_E_UNSUPPORTED, "type 'float'", NULL);
    refused(CT("{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"strategy\": "
               "\"tensor\"}}",
               ""),
            INF_E_UNSUPPORTED, "strategy 'tensor'", NULL);
    refused(CT("{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"strategy\": "
               "\"group\"}}",
               ""),
            INF_E_INVALID, "group_size must be positive", NULL);
    refused(CT("{\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, \"strategy\": "
               "\"channel\"}, \"input_activations\": {\"num_bits\": 8}}",
               ""),
            INF_E_UNSUPPORTED, "W4A16", "config_groups.group_0");
    refused(CT("{\"targets\": [\"Linear\"]}", ""), INF_E_UNSUPPORTED, "weights is missing", NULL);
    refused(CT("{\"targets\": [], \"weights\": {\"num_bits\": 4, \"strategy\": \"channel\"}}", ""),
            INF_E_INVALID, "targets must list", NULL);
    refused(CT(W4(""), ", \"sparsity_config\": {\"format\": \"sparse-bitmask\"}"),
            INF_E_UNSUPPORTED, "sparsity_config.format 'sparse-bitmask'", NULL);
    refused(CT("{\"targets\": [\"re:(?i)proj\"], \"weights\": {\"num_bits\": 4, \"strategy\": "
               "\"channel\"}}",
               ""),
            INF_E_UNSUPPORTED, "targets[0] 're:(?i)proj'", NULL);
    /* repetitions that regcomp would spell out past its bound: stacked
     * (each "+" doubles what it repeats) and nested counts (10 x 10 x 100)
     * are refused before compiling, naming the key; a few ordinary ones
     * compile */
    refused(CT(W4(""), ", \"ignore\": [\"re:la++++++++++++++++++++++++++++++++yers\"]"),
            INF_E_UNSUPPORTED, "ignore[0] 're:la++++", "too large a regular expression");
    refused(CT(W4(""), ", \"ignore\": [\"lm_head\", \"re:((a{10}){10}){100}\"]"), INF_E_UNSUPPORTED,
            "ignore[1]", "too large");
    /* repetitions of repetitions: regcomp's closures take seconds at five
     * levels; two levels and a long chain of optional atoms compile */
    refused(CT(W4(""), ", \"ignore\": [\"re:.*s+*+elf_attn\"]"), INF_E_UNSUPPORTED, "ignore[0]",
            "nested too deep");
    refused(CT(W4(""), ", \"ignore\": [\"re:(((s*)+)+)+\"]"), INF_E_UNSUPPORTED, "ignore[0]",
            "too large");
    refused(CT(W4(""), ", \"ignore\": [\"re:(s*)+(s*)+(s*)+(s*)+(s*)+(s*)+(s*)+(s*)+(s*)+\"]"),
            INF_E_UNSUPPORTED, "ignore[0]", "too many");
    ck_assert_int_eq(parse(CT(W4(""), ", \"ignore\": [\"re:(s*)+\", \"re:" A8 A8 A8 A8 A8 "\"]")),
                     INF_OK);
    eng_qcfg_free(&q);
    ck_assert_int_eq(parse(CT(W4(""), ", \"ignore\": [\"re:model\\\\.layers\\\\.[0-9]+\\\\."
                                      "(mlp|self_attn)\\\\..*_proj(_[a-z]{1,8})?$\"]")),
                     INF_OK);
    eng_qcfg_free(&q);
}
END_TEST

START_TEST(other_methods_and_bad_json)
{
    refused(QC("\"quant_method\": \"fp8\""), INF_E_UNSUPPORTED,
            "config.json: quantization_config.quant_method 'fp8'", "awq, gptq");
    refused(QC("\"quant_method\": \"bitsandbytes\""), INF_E_UNSUPPORTED, "'bitsandbytes'", NULL);
    refused(QC("\"bits\": 4"), INF_E_INVALID, "quant_method is missing", NULL);
    refused("{\"quantization_config\": [1]}", INF_E_INVALID, "must be an object", NULL);
    refused("{\"quantization_config\": ", INF_E_FORMAT, "config.json: not valid JSON", NULL);
}
END_TEST

/* quantize_config.json beside a config.json without quantization_config,
 * as older AutoGPTQ folders have it (quant_method absent: gptq); a config
 * that has one wins. */
START_TEST(quantize_config_json_beside)
{
    char dir[] = "/tmp/int4serve-qcfg-XXXXXX", p[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs("{\"hidden_size\": 8}", f);
    fclose(f);
    ck_assert_int_eq(eng_qcfg_load(dir, &q, &err), INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_NONE);
    ck_assert_str_eq(q.file, "config.json");
    snprintf(p, sizeof p, "%s/quantize_config.json", dir);
    f = fopen(p, "w");
    fputs("{\"bits\": 4, \"group_size\": 64, \"desc_act\": true, \"sym\": true, "
          "\"damp_percent\": 0.01, \"model_file_base_name\": \"model\"}",
          f);
    fclose(f);
    ck_assert_int_eq(eng_qcfg_load(dir, &q, &err), INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_GPTQ);
    ck_assert_str_eq(q.file, "quantize_config.json");
    ck_assert(q.q.act_order && q.q.group == 64);
    eng_qcfg_free(&q);
    f = fopen(p, "w");
    fputs("{\"bits\": 8}", f);
    fclose(f);
    ck_assert_int_eq(eng_qcfg_load(dir, &q, &err), INF_E_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "quantize_config.json: bits 8"));
    snprintf(p, sizeof p, "%s/config.json", dir);
    f = fopen(p, "w");
    fputs(QC("\"quant_method\": \"awq\""), f);
    fclose(f);
    ck_assert_int_eq(eng_qcfg_load(dir, &q, &err), INF_OK);
    ck_assert_int_eq(q.method, ENG_QM_AWQ);
    eng_qcfg_free(&q);
    unlink(p);
    ck_assert_int_eq(eng_qcfg_load(dir, &q, &err), INF_E_NOTFOUND);
    snprintf(p, sizeof p, "%s/quantize_config.json", dir);
    unlink(p);
    rmdir(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("qconfig");
    TCase *t = tcase_create("parse");
    tcase_add_checked_fixture(t, NULL, teardown);
    tcase_add_test(t, none_without_quantization_config);
    tcase_add_test(t, awq_keys_aliases_and_layers);
    tcase_add_test(t, awq_refusals);
    tcase_add_test(t, gptq_keys_and_defaults);
    tcase_add_test(t, gptq_refusals);
    tcase_add_test(t, compressed_tensors_targets_and_ignore);
    tcase_add_test(t, compressed_tensors_refusals);
    tcase_add_test(t, other_methods_and_bad_json);
    tcase_add_test(t, quantize_config_json_beside);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
