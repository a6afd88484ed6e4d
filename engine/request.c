/* engine/request.c — requests and events as plain owned structs. */
#include "engine/eng.h"

#include <stdlib.h>

struct eng_request *eng_request_create(void)
{
    struct eng_request *req = calloc(1, sizeof *req);
    if (!req)
        return NULL;
    req->n = 1;
    req->max_tokens = 16;
    req->sampling.temperature = 1.0f;
    req->sampling.top_p = 1.0f;
    req->sampling.top_k = -1;
    req->sampling.repetition_penalty = 1.0f;
    req->sampling.logprobs = -1;
    return req;
}

void eng_request_destroy(struct eng_request *req)
{
    if (!req)
        return;
    free(req->prompt);
    free(req->sampling.logit_bias_ids);
    free(req->sampling.logit_bias_vals);
    for (int i = 0; i < ENG_MAX_STOP; i++)
        free(req->stop[i]);
    free(req);
}

void eng_event_destroy(struct eng_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    free(ev->tokens);
    free(ev);
}
