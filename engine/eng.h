#pragma once
/* engine — public header: what the server sees of the engine.
 *
 * Threads. The engine runs its own thread (one per tensor-parallel rank);
 * it owns every sequence, the KV cache and the backend. The server's loop
 * thread talks to it only through eng_request_submit / eng_request_cancel
 * (a mutex queue drained between steps) and eng_events_take (the outbox).
 * Requests are known across threads by id, never by pointer. */
#include "common/inf.h"
#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct eng_engine eng_engine_t;

/* ---- configuration ---------------------------------------------------------- */
enum eng_backend_kind { ENG_BACKEND_CPU, ENG_BACKEND_CUDA, ENG_BACKEND_MOCK };

/* The weights' quantization (the server's model.quantization). An explicit
 * method that contradicts the checkpoint's own quantization_config stops
 * the load, naming both. */
enum eng_quantization {
    ENG_QUANTIZATION_NONE, /* fp16 weights (fp32 on the CPU); an INT4 checkpoint is refused */
    ENG_QUANTIZATION_AUTO, /* the checkpoint's own INT4 format when config.json declares one,
                              else int4 (the server's default) */
    ENG_QUANTIZATION_INT4, /* a 16-bit checkpoint quantized on load (round to nearest,
                              group_size, symmetric) */
    ENG_QUANTIZATION_AWQ,  /* AutoAWQ gemm, repacked without requantization */
    ENG_QUANTIZATION_GPTQ, /* GPTQ (desc_act included), repacked */
    ENG_QUANTIZATION_CT,   /* compressed-tensors pack-quantized, repacked */
};

/* The KV cache's element type (engine.kv_cache_dtype). */
enum eng_kv_dtype {
    ENG_KV_AUTO, /* the backend's own: fp16 on cuda, fp32 on the cpu backend */
    ENG_KV_FP16, /* the same as auto */
    ENG_KV_FP8,  /* FP8 E4M3 with a K and a V scale per layer (the checkpoint's, else 1.0) */
};

struct eng_config {
    const char *model_dir; /* Hugging Face folder (config.json, safetensors, tokenizer.json) */
    enum eng_backend_kind backend;
    int32_t threads;   /* CPU backend worker threads, 0 = one per core */
    int32_t n_devices; /* CUDA: devices[0..n_devices) */
    const int32_t *devices;
    int32_t tp;                 /* tensor-parallel ranks */
    int32_t max_batch;          /* running sequences at once (default 128) */
    int32_t max_batched_tokens; /* token budget of one step; 0: the backend's
                                   for its device (8192 on CUDA devices of
                                   compute capability 9+ and 70+ GiB), else
                                   2048 (never below max_batch) */
    int32_t max_model_len;      /* 0 = the model's max_position_embeddings */
    int64_t kv_cache_tokens;    /* KV capacity in tokens, 0 = automatic */
    float gpu_memory_utilization;
    enum eng_kv_dtype kv_cache_dtype;
    bool cuda_sm75;    /* engine.cuda_kernels = "sm75": the sm_75 paths on any GPU */
    int32_t max_queue; /* waiting requests before INF_E_BUSY (default 256) */
    enum eng_quantization quantization;
    int32_t group_size;  /* quantizing on load: 32, 64, 128, 256, or -1 per-channel */
    bool symmetric;      /* quantizing on load: zero point 8 */
    int32_t n_keep_fp16; /* name patterns of layers kept in fp16 */
    const char *const *keep_fp16;
    bool fuse_qkv;        /* fuse q/k/v and gate/up (default true) */
    uint64_t seed;        /* base seed for requests without one */
    bool prefix_caching;  /* share the KV blocks of a common prefix between
                           * sequences (automatic prefix caching; the
                           * server's default: on) */
    bool enforce_eager;   /* decode steps run their ops as they come: no
                             recorded graphs (a device backend) */
    bool skip_warm_up;    /* serve at once: no warm-up (decode graphs recorded and
                             kernels first launched by the first requests) */
    uint32_t stats_log_s; /* seconds between the engine's stats lines; 0: none */
    /* Test hooks, for the project's own tests (0 / false: off). */
    uint32_t min_step_us;      /* every step lasts at least this long */
    bool no_overlap;           /* plan every step only once the one before is back */
    int32_t mock_vocab;        /* mock backend: its vocabulary (0: the mock's default) */
    int32_t mock_fail_step;    /* mock backend: the forward that fails (engine/mock/mock.h) */
    bool mock_device_sampling; /* mock backend: sample "on the device", so that the
                                  scheduler queues decode steps ahead */
};

/* ---- requests ------------------------------------------------------------------ */
struct eng_sampling {
    float temperature;        /* 0 = greedy */
    float top_p;              /* 1 = off */
    int32_t top_k;            /* -1 = off */
    float min_p;              /* 0 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    float repetition_penalty; /* 1 = off */
    bool has_seed;
    uint64_t seed; /* choice i of n samples with seed + i */
    int32_t n_logit_bias;
    int32_t *logit_bias_ids; /* [n_logit_bias], owned by the request */
    float *logit_bias_vals;  /* [n_logit_bias], owned by the request */
    int32_t logprobs;        /* -1 = none, else top-n alternatives (0..5) with the chosen token's */
    bool ignore_eos;
};

#define ENG_MAX_STOP 4

/* One completion request. Built by the server with eng_request_create, all
 * arrays malloc'd and owned by the request (freed by eng_request_destroy). */
struct eng_request {
    uint64_t id; /* unique, chosen by the server; echoed in every event */
    int32_t n_prompt;
    int32_t *prompt;    /* [n_prompt] token ids */
    int32_t max_tokens; /* >= 1; prompt + max_tokens <= max model length (checked by caller) */
    int32_t min_tokens; /* EOS and stop strings ignored before this many tokens */
    int32_t n;          /* choices, sharing the prompt's KV blocks */
    struct eng_sampling sampling;
    int32_t n_stop;
    char *stop[ENG_MAX_STOP]; /* NUL-terminated, owned */
    bool stream;              /* send text deltas as they come (else one final event per choice) */
    bool echo;                /* prompt text is prepended by the server, not the engine */
    bool prompt_logprobs;     /* with sampling.logprobs >= 0: also score the prompt's tokens,
                               * sent once in an ENG_EV_PROMPT event (see there) */
};

/* A zeroed request with defaults (n 1, max_tokens 16, temperature 1, top_p 1,
 * top_k -1, repetition_penalty 1, logprobs -1). NULL on out of memory. */
struct eng_request *eng_request_create(void);
/* Frees the request and everything it owns. NULL is a no-op. */
void eng_request_destroy(struct eng_request *req);

/* ---- events (engine -> loop) ------------------------------------------------------ */
enum eng_finish {
    ENG_FINISH_NONE = 0, /* still running */
    ENG_FINISH_STOP,     /* EOS or a stop string */
    ENG_FINISH_LENGTH,   /* max_tokens or the context */
    ENG_FINISH_ABORT,    /* cancelled, drained, or engine failure */
};

struct eng_token_info {
    int32_t id;
    float logprob; /* of the chosen token (when logprobs >= 0) */
    int32_t n_top;
    int32_t top_ids[5];
    float top_logprobs[5];
};

enum eng_event_kind {
    ENG_EV_DELTA,  /* new text and tokens for one choice (maybe with its finish) */
    ENG_EV_DONE,   /* the whole request is finished: usage; the last event for an id */
    ENG_EV_ERROR,  /* the request failed: status and message; the last event for an id */
    ENG_EV_PROMPT, /* the prompt's logprobs (requests with prompt_logprobs), once, before the
                    * request's first DELTA: n_tokens = n_prompt entries, tokens[i] for
                    * prompt[i] given prompt[0..i) from the raw logits as for generated
                    * tokens, with sampling.logprobs alternatives; tokens[0] has no context:
                    * logprob NaN, n_top 0. choice 0, no text. A request cancelled or failed
                    * before its prompt is computed has none. Shared by all n choices. */
};

struct eng_event {
    struct inf_qnode node; /* outbox link */
    enum eng_event_kind kind;
    uint64_t req_id;
    int32_t choice; /* DELTA: which of the n choices */
    char *text;     /* DELTA: UTF-8 delta, never ending inside a character */
    size_t text_len;
    int32_t n_tokens; /* DELTA: tokens this delta covers; PROMPT: n_prompt */
    struct eng_token_info *tokens;
    enum eng_finish finish;    /* DELTA: the choice's finish, or NONE */
    int32_t prompt_tokens;     /* DONE */
    int32_t completion_tokens; /* DONE: summed over choices */
    uint64_t queue_ns;         /* DONE: time waiting before the first step */
    uint64_t ttft_ns;          /* DONE: submit to first token */
    inf_status_t status;       /* ERROR */
    char msg[INF_ERR_LEN];     /* ERROR */
};

/* Frees an event taken from eng_events_take (and what it owns). NULL no-op. */
void eng_event_destroy(struct eng_event *ev);

/* ---- the engine -------------------------------------------------------------------------- */
/* Called on the engine thread when the outbox goes from empty to non-empty
 * (the server calls uv_async_send from it). Must not block. */
typedef void (*eng_notify_fn)(void *user);

/* Load the model and start the engine thread. On success *out owns it.
 * Thread: loop (start-up). Errors name the file and key: INF_E_NOTFOUND,
 * INF_E_FORMAT, INF_E_UNSUPPORTED, INF_E_DEVICE, INF_E_NOMEM. */
inf_status_t eng_engine_create(const struct eng_config *cfg, eng_notify_fn notify, void *user,
                               eng_engine_t **out, struct inf_err *err);
/* Stop the thread (aborting what runs) and free everything. NULL no-op. */
void eng_engine_destroy(eng_engine_t *eng);

/* Queue req. On INF_OK the engine owns req and frees it after its last event;
 * on error the caller keeps it. Thread: any.
 * Errors: INF_E_BUSY (admission queue full), INF_E_SHUTDOWN (draining),
 * INF_E_INVALID (bad ids, n, lengths). */
inf_status_t eng_request_submit(eng_engine_t *eng, struct eng_request *req, struct inf_err *err);
/* Cancel by id: its sequences are freed at the next step and it ends with an
 * ENG_FINISH_ABORT delta and DONE. Unknown ids are ignored. Thread: any. */
void eng_request_cancel(eng_engine_t *eng, uint64_t req_id);
/* Take every pending event, FIFO, as a list linked through node (the next
 * event is (struct eng_event *)ev->node.next; node is the first member). Thread: any
 * (the loop). */
struct eng_event *eng_events_take(eng_engine_t *eng);

/* Stop admitting (submit answers INF_E_SHUTDOWN); running requests go on. */
void eng_engine_drain(eng_engine_t *eng);
/* End every running and waiting request now with ENG_FINISH_ABORT. */
void eng_engine_abort_all(eng_engine_t *eng);

/* Read-only facts for the server. Thread: any after create. */
struct eng_info {
    int32_t vocab;
    int32_t max_model_len;
    int32_t bos_id;
    int64_t kv_capacity_tokens;
    int32_t max_batched_tokens; /* the step budget in force (0 resolved) */
    const char *backend_name;
    const char *kv_dtype;  /* the KV cache's elements: "fp16", "fp32", "fp8 e4m3"
                              ("none" on the mock backend) */
    int32_t kv_elem_bytes; /* bytes of one of them (0 on the mock backend) */
};
void eng_engine_info(const eng_engine_t *eng, struct eng_info *info);

/* Gauges and counters for /metrics (a snapshot). Thread: any. */
struct eng_stats {
    int32_t running, waiting; /* sequences (each started choice of a request is one) */
    int64_t kv_blocks_used, kv_blocks_total;
    uint64_t prompt_tokens_total, generation_tokens_total;
    uint64_t preemptions_total;
    uint64_t steps_total;
    uint64_t batched_steps_total; /* steps that ran more than one sequence */
    uint64_t steps_ahead_total;   /* decode steps queued before the step before them was back */
    /* The prefix cache, in tokens as vLLM counts them: queries are the
     * tokens of each request looked up at its first admission, hits those
     * of them found cached (not computed). Both 0 with prefix caching off. */
    uint64_t prefix_cache_queries_total, prefix_cache_hits_total;
    int64_t kv_blocks_cached;   /* blocks the prefix cache holds (in use or evictable) */
    int64_t kv_capacity_tokens; /* the KV pool, in tokens (what the engine planned) */
    int32_t kv_elem_bytes;      /* bytes of a KV cache element (1 fp8, 2 fp16, 4 fp32) */
    int32_t tp;                 /* tensor-parallel ranks (1: one) */
    int32_t max_running_seen;
    bool failed; /* sticky device error: /health answers 503 */
};
void eng_engine_stats(eng_engine_t *eng, struct eng_stats *st);

/* The model's tokenizer (the mock backend's is byte-level over its
 * vocabulary); NULL for a model without one. It stays the engine's and lives
 * as long as the engine. Thread: any (tokenizer/tokenizer.h: encode and
 * decode are safe from several threads at once). */
tok_tokenizer_t *eng_engine_tokenizer(const eng_engine_t *eng);

#ifdef __cplusplus
}
#endif
