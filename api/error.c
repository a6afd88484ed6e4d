#include "api/api.h"

int api_status_http(inf_status_t st)
{
    switch (st) {
    case INF_OK:
        return 200;
    case INF_E_AUTH:
        return 401;
    case INF_E_NOTFOUND:
        return 404;
    case INF_E_METHOD:
        return 405;
    case INF_E_TOOBIG:
        return 413;
    case INF_E_BUSY:
        return 429;
    case INF_E_SHUTDOWN:
        return 503;
    case INF_E_INVALID:
    case INF_E_FORMAT:
    case INF_E_RANGE:
    case INF_E_CONTEXT:
    case INF_E_UNSUPPORTED:
        return 400;
    default:
        return 500;
    }
}
