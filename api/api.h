#pragma once
/* api — public header: the OpenAI wire format as pure functions over plain C
 * structs. No I/O, no threads; a json_t never leaves this module. */
#include "common/inf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The HTTP status that answers a status code: the one place this mapping
 * lives. Thread: any. */
int api_status_http(inf_status_t st);

#ifdef __cplusplus
}
#endif
