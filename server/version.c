#include "server/srv.h"
#include "kernels/krn.h"

void srv_version_print(FILE *f)
{
    fprintf(f, "int4serve %s (%s)\n", INT4SERVE_VERSION,
            krn_have_cuda() ? "cpu, cuda" : "cpu only");
}
