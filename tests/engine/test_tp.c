/* Tensor parallelism on the CPU backend (engine/tp/): a group of 2 and of 4
 * ranks against the whole model on one backend, for a model of 8 query
 * heads, 2 KV heads (replicated at tp 4) and an MLP of 1408 rows (352 a
 * rank at tp 4: the shards of down cut groups of 128), INT4 (group 128,
 * quantized whole, then sharded) and fp32, fused and not, with Qwen2's
 * q/k/v biases: the teacher-forced logprobs of a 40-token prompt within
 * 1e-3 and 24 greedy ids identical; a GPTQ act-order checkpoint of the
 * same shape (every linear with its g_idx: o's shards take the whole layer
 * with the other ranks' columns reading 0, down's order is folded into
 * gate/up) likewise; and the group's refusals (a tp the heads do not
 * divide). */
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/sched/scheduler_lm.h"
#include "engine/tp/comm.h"
#include "engine/tp/group.h"
#include "test_model_util.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 40, NEW = 24, VOCAB = 584, MAX_BLOCKS = 8 }; /* mkmodel's tokenizer fits */
#define TP_REQUIRE(ok, what, err) ck_assert_msg(ok, "%s: %s", what, (err)->msg)
#include "tp_run.h"

static char dir[256];

static void make(const char *arch)
{
    const struct tm_spec sp = {.arch = arch,
                               .hidden = 256,
                               .intermediate = 1408,
                               .layers = 2,
                               .heads = 8,
                               .kv_heads = 2,
                               .vocab = VOCAB,
                               .rope_theta = 10000.0f,
                               .dtype = ENG_DT_F32,
                               .seed = 23};
    snprintf(dir, sizeof dir, "/tmp/int4serve-tp-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(tm_write(dir, &sp), 0);
}

/* dir as an INT4 checkpoint written by int4serve-mkmodel with args. */
static void make_packed(const char *args)
{
    const char *bd = getenv("INT4SERVE_BUILD_DIR");
    ck_assert_msg(bd != NULL, "INT4SERVE_BUILD_DIR is not set");
    snprintf(dir, sizeof dir, "/tmp/int4serve-tp-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/tools/mkmodel/int4serve-mkmodel --out %s --hidden 256 --intermediate 1408 "
             "--layers 2 --heads 8 --kv-heads 2 --vocab %d --seed 23 %s >/dev/null",
             bd, dir, (int)VOCAB, args);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

static bool g_packed; /* open_lm loads dir's own INT4 format */

/* The model of dir as an lm of tp ranks (1: the whole model). */
static void open_lm(int32_t tp, bool int4, bool fused, struct eng_lm *lm)
{
    struct eng_lm_model_opts o = {.dir = dir,
                                  .quantization = g_packed ? ENG_QUANTIZATION_AUTO
                                                  : int4   ? ENG_QUANTIZATION_INT4
                                                           : ENG_QUANTIZATION_NONE,
                                  .group_size = 128,
                                  .fuse_qkv = fused,
                                  .max_tokens = 64};
    struct inf_err err = {0};
    if (tp == 1) {
        struct eng_backend *be;
        struct eng_backend_cpu_opts bo = {.n_threads = 1};
        ck_assert_int_eq(eng_backend_cpu_create(&bo, &be, &err), INF_OK);
        ck_assert_msg(eng_lm_model_create(&o, be, lm, &err) == INF_OK, "%s", err.msg);
    } else {
        eng_comm_t *comms[4];
        struct eng_backend *bes[4];
        ck_assert_int_eq(eng_comm_local_create(tp, 0, comms, &err), INF_OK);
        for (int32_t r = 0; r < tp; r++) {
            struct eng_backend_cpu_opts bo = {.n_threads = 1, .comm = comms[r]};
            ck_assert_int_eq(eng_backend_cpu_create(&bo, &bes[r], &err), INF_OK);
        }
        ck_assert_msg(eng_tp_group_create(&o, bes, comms, tp, lm, &err) == INF_OK, "%s", err.msg);
    }
    ck_assert_int_eq(lm->kv_reserve(lm->self, MAX_BLOCKS, &err), INF_OK);
}

static void compare(bool int4, bool fused)
{
    double *ref = malloc((size_t)PROMPT * VOCAB * sizeof *ref),
           *got = malloc((size_t)PROMPT * VOCAB * sizeof *got);
    int32_t ref_ids[NEW], ids[NEW];
    struct eng_lm lm;
    open_lm(1, int4, fused, &lm);
    tp_run(&lm, true, ref, ref_ids, NULL);
    lm.destroy(lm.self);
    for (int32_t tp = 2; tp <= 4; tp *= 2) {
        open_lm(tp, int4, fused, &lm);
        tp_run(&lm, true, got, ids, NULL);
        lm.destroy(lm.self);
        double worst = 0;
        for (int64_t i = 0; i < (int64_t)PROMPT * VOCAB; i++)
            worst = fabs(got[i] - ref[i]) > worst ? fabs(got[i] - ref[i]) : worst;
        ck_assert_msg(worst <= 1e-3, "tp %d %s%s: logprobs differ by %g", tp,
                      int4 ? "int4" : "fp32", fused ? "" : " unfused", worst);
        for (int32_t i = 0; i < NEW; i++)
            ck_assert_msg(ids[i] == ref_ids[i], "tp %d %s: greedy id %d is %d, want %d", tp,
                          int4 ? "int4" : "fp32", i, ids[i], ref_ids[i]);
    }
    free(ref);
    free(got);
}

START_TEST(llama_int4)
{
    make("llama");
    compare(true, true);
    compare(true, false);
    tm_rmdir(dir);
}
END_TEST

START_TEST(llama_fp32)
{
    make("llama");
    compare(false, true);
    tm_rmdir(dir);
}
END_TEST

START_TEST(qwen2_biases)
{
    make("qwen2");
    compare(true, true);
    tm_rmdir(dir);
}
END_TEST

START_TEST(gptq_actorder)
{
    g_packed = true;
    make_packed("--format gptq-actorder --group-size 128");
    compare(true, true);
    compare(true, false);
    tm_rmdir(dir);
    make_packed("--format gptq-actorder --group-size 64 --symmetric");
    compare(true, true);
    tm_rmdir(dir);
    g_packed = false;
}
END_TEST

START_TEST(refused)
{
    make("llama");
    struct eng_lm_model_opts o = {
        .dir = dir, .quantization = ENG_QUANTIZATION_INT4, .group_size = 128, .max_tokens = 64};
    struct inf_err err = {0};
    eng_comm_t *comms[3];
    struct eng_backend *bes[3];
    ck_assert_int_eq(eng_comm_local_create(3, 0, comms, &err), INF_OK);
    for (int32_t r = 0; r < 3; r++) {
        struct eng_backend_cpu_opts bo = {.n_threads = 1, .comm = comms[r]};
        ck_assert_int_eq(eng_backend_cpu_create(&bo, &bes[r], &err), INF_OK);
    }
    struct eng_lm lm;
    ck_assert_int_eq(eng_tp_group_create(&o, bes, comms, 3, &lm, &err), INF_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "tp = 3 does not divide the model's 8 attention heads"));
    for (int32_t r = 0; r < 3; r++) {
        eng_backend_destroy(bes[r]);
        eng_comm_destroy(comms[r]);
    }
    tm_rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tp");
    TCase *t = tcase_create("cpu");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, llama_int4);
    tcase_add_test(t, llama_fp32);
    tcase_add_test(t, qwen2_biases);
    tcase_add_test(t, gptq_actorder);
    tcase_add_test(t, refused);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
