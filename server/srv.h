#pragma once
/* server — public header: configuration and the daemon's entry points. */
#include "common/inf.h"

#include <stdio.h>

/* Print "int4serve <version>" and the build's features to f. Thread: any. */
void srv_version_print(FILE *f);
