/* emucuda: stand-in for cuda_runtime.h (C only: just the runtime API). */
#ifndef EMUCUDA_CUDA_RUNTIME_H
#define EMUCUDA_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"
#endif
