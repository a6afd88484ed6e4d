#include "engine/eng.h"
#include "kernels/krn.h"
