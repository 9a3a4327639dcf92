// gradscale — layer-wise adaptive loss scaling for mixed-precision training. The whole public API:
//
//   gradscale/numeric.h    formats, quantize(), tensor_stats(): how much underflows
//   gradscale/network.h    Model and layers: build a network in C++ or from a JSON spec
//   gradscale/scaler.h     make_scaler, Scaler, LayerController, register_scaler
//   gradscale/training.h   ScaledTraining: one iteration of your own loop; optimizers; traces
//   gradscale/data.h       load_data, Dataset, Batcher
//   gradscale/trainer.h    Trainer: the ready-made loop behind `gradscale train`
//   gradscale/version.h    GRADSCALE_VERSION, gradscale::kVersion
//
// Everything is in namespace gradscale. docs/api.md walks through the API by task.
#pragma once

#include "gradscale/data.h"
#include "gradscale/distributed.h"
#include "gradscale/network.h"
#include "gradscale/numeric.h"
#include "gradscale/scaler.h"
#include "gradscale/trainer.h"
#include "gradscale/training.h"
#include "gradscale/version.h"
