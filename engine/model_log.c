/* engine/model_log.c — what a model load says in the log: the INT4
 * checkpoint's format and its layers, the layers padded along K, the KV
 * cache's element type and scales (eng_model_log_load, engine/model_impl.h). */
#define INF_LOG_MODULE "eng"
#include "engine/model_impl.h"
#include "engine/weights/qconfig.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void log_padding(const struct eng_model *m)
{
    char buf[512] = "";
    size_t used = 0;
    int32_t n_pad = 0, n_q = 0;
    for (int32_t i = 0; i < m->n_info; i++) {
        const struct eng_layer_info *l = &m->info[i];
        if (!l->quantized)
            continue;
        n_q++;
        if (l->kp == l->k)
            continue;
        n_pad++;
        /* One entry per distinct part name (after the layer index). */
        const char *part = strstr(l->name, "layers.");
        part = part ? strchr(part + 7, '.') : NULL;
        part = part ? part + 1 : l->name;
        char item[96];
        snprintf(item, sizeof item, "%s %d->%d", part, l->k, l->kp);
        if (!strstr(buf, item) && used + strlen(item) + 3 < sizeof buf)
            used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s", used ? ", " : "", item);
    }
    char grp[48];
    if (m->mode == LOAD_PACKED)
        snprintf(grp, sizeof grp, "(%s groups)", eng_qmethod_name(m->qcfg.method));
    else if (m->opts.group_size > 0)
        snprintf(grp, sizeof grp, "group %d", m->opts.group_size);
    else
        snprintf(grp, sizeof grp, "per-channel");
    if (n_pad > 0)
        inf_log(INFO, "INT4 %s: %d of %d quantized layers padded along K (%s)", grp, n_pad, n_q,
                buf);
    else if (n_q > 0)
        inf_log(INFO, "INT4 %s: %d layers quantized, none padded", grp, n_q);
}

/* What an INT4 checkpoint became: its format, the layers repacked as
 * stored and those kept in floating point. */
static void log_checkpoint(const struct eng_model *m)
{
    if (m->mode != LOAD_PACKED)
        return;
    int32_t n_ck = 0, n_perm = 0, n_fp = 0, n_ordered = 0;
    for (int32_t i = 0; i < m->n_info; i++) {
        const struct eng_layer_info *l = &m->info[i];
        n_ck += l->from_ckpt;
        n_perm += l->act_order;
        n_ordered += l->norm_ordered;
        n_fp += !l->quantized;
    }
    inf_log(INFO,
            "INT4 checkpoint, %s, from %s: %d linear layers repacked without requantization "
            "(%d act-order, %d of them fed in their column order by the norm before them), "
            "their weights stay INT4 on the %s backend; %d kept in floating point",
            m->qcfg.desc, m->qcfg.file, n_ck, n_perm, n_ordered, eng_backend_name(m->be), n_fp);
    if (m->n_apart > 0)
        inf_log(WARN,
                "%d groups of projections run apart instead of fused (the first: %s): their "
                "parts differ in group, act-order column order or storage",
                m->n_apart, m->apart);
    if (m->opts.group_size != 128 || m->opts.symmetric)
        inf_log(INFO, "group_size and symmetric apply to 16-bit checkpoints; this one keeps "
                      "its own");
}

/* The KV cache's element type and, for FP8, where its scales came from. */
static void log_kv_cache(const struct eng_model *m, int32_t n_scaled)
{
    const struct eng_model_config *c = &m->cfg;
    if (m->be->kv_dtype != ENG_ACT_E4M3) {
        if (n_scaled > 0)
            inf_log(INFO,
                    "the checkpoint's KV cache scales (%d layers) apply to an fp8 KV cache "
                    "only (engine.kv_cache_dtype)",
                    n_scaled);
        return;
    }
    float kmin = INFINITY, kmax = 0.0f, vmin = INFINITY, vmax = 0.0f;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const struct layer *L = &m->layers[l];
        kmin = fminf(kmin, L->k_scale);
        kmax = fmaxf(kmax, L->k_scale);
        vmin = fminf(vmin, L->v_scale);
        vmax = fmaxf(vmax, L->v_scale);
    }
    if (n_scaled == 0)
        inf_log(INFO, "KV cache fp8 (e4m3): the checkpoint has no k_scale / v_scale, so every "
                      "layer uses 1.0 (values beyond +-448 saturate)");
    else
        inf_log(INFO,
                "KV cache fp8 (e4m3): k_scale / v_scale of %d of %d layers from the "
                "checkpoint (k %g-%g, v %g-%g; the others 1.0)",
                n_scaled, c->n_layers, (double)kmin, (double)kmax, (double)vmin, (double)vmax);
}

void eng_model_log_load(const struct eng_model *m, int32_t n_kv_scaled)
{
    log_checkpoint(m);
    log_padding(m);
    log_kv_cache(m, n_kv_scaled);
}
