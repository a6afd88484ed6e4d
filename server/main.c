#define INF_LOG_MODULE "srv"
#include "common/inf.h"
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            srv_version_print(stdout);
            return 0;
        }
    }
    inf_log(ERROR, "no model runtime exists yet");
    return 1;
}
