#pragma once
/* engine — public header: what the server sees of the engine. */
#include "common/inf.h"
#include "engine/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
