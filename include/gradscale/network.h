// gradscale public API — build a network (docs/api.md, "Build a network").
//
//   Tensor            owned, contiguous, row-major float32 array with a Shape (std::vector<int64_t>).
//   Model             a DAG of layers in definition order. add(std::make_unique<Layer>(...), {input ids})
//                     returns the new layer's id (Model::kModelInput = the model's input); finalize(sample
//                     shape, e.g. {1, 28, 28}) checks the graph and infers shapes. The last layer's output
//                     is the logits [N, classes]; every other layer must feed something. A tensor that
//                     feeds several layers (a residual fork) has its scaled gradients joined by SPEC §5's
//                     rule. The model owns its layers, their parameters and all activations.
//   Layers            Linear(name, Linear::Options{}.out_features(10))        W [out, in], K = out
//                     Conv2d(name, Conv2d::Options{}.out_channels(16).kernel(3).padding(1).bias(false))
//                                                                             W [O, C, k, k]
//                     BatchNorm(name, BatchNorm::Options{}), ReLU, Flatten, MaxPool2d(name, kernel, stride),
//                     GlobalAvgPool, Dropout(name, p), Add(name) (two inputs: the residual join).
//                     Options leave the input size to the graph: finalize(sample shape, rng) infers it
//                     and draws the weights in layer order. The positional forms (Linear(name, in, out,
//                     bias, init, rng), Conv2d(name, C, O, kernel, stride, padding, bias, init, rng),
//                     BatchNorm(name, C)) draw at construction and give the same weights.
//                     Linear and Conv2d are the parametric layers: they ask the scaler's controller for a
//                     local scale s. Forward values and working weights are in F, GEMMs accumulate in
//                     fp32; master weights and gradients (Parameter::value / ::grad) are fp32.
//   InitSpec, Rng     weight initialisation (kaiming_normal by default, gain √2) from a seeded
//                     std::mt19937_64: the same weights on every platform.
//   build_model(spec, rng), builtin_model_spec("cnn")   a model from a JSON spec (docs/models.md).
//   set_threads(n)    the CPU threads the engine computes with (0: every core); threads() reads it.
//   Precision         format (forward values, working weights), grad_format (gradients; unset = format),
//                     quantize_weight_grads (false keeps weight gradients in fp32: an ablation).
//
// Errors are exceptions derived from gradscale::Error (ConfigError, ShapeError, ...) whose message names
// the layer and the value. Contracts in detail: internal/lib/model/model.h, internal/lib/layers/*.h.
#pragma once

#include "lib/core/error.h"
#include "lib/core/random.h"
#include "lib/core/threads.h"
#include "lib/layers/add.h"
#include "lib/layers/batchnorm.h"
#include "lib/layers/conv2d.h"
#include "lib/layers/dropout.h"
#include "lib/layers/init.h"
#include "lib/layers/layer.h"
#include "lib/layers/linear.h"
#include "lib/layers/pool.h"
#include "lib/layers/relu.h"
#include "lib/model/model.h"
#include "lib/model/spec.h"
#include "lib/tensor/tensor.h"
