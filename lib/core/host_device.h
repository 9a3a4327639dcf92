// GS_HOST_DEVICE marks a function that host code and lib/cuda's kernels both call: one definition of a
// formula for both sides (lib/scaler/scale_rule.h, lib/model/join_target.h).
#pragma once

#ifdef __CUDACC__
#define GS_HOST_DEVICE __host__ __device__
#else
#define GS_HOST_DEVICE
#endif
