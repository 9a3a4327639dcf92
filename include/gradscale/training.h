// gradscale public API — your own training loop (docs/api.md, "Write your loop", "Read per-layer
// statistics", "Save and resume").
//
//   ScaledTraining t(model, optimizer, precision, scaler_config_or_object, seed);
//   per iteration:  t.begin_step(record);                  working weights in F, records reset
//                   const Tensor& logits = t.forward(x);   forward in F
//                   double S0 = t.loss_scale(logits, y);   the scaler's S0 (an explicit argument below)
//                   t.loss_backward(logits, y, S0);        loss gradient x S0 -> F, per-layer scales, grads
//                                                          unscaled into Parameter::grad
//                   (or t.loss_backward(logits, y): the scaler's S0, chosen on a GPU without a wait)
//                   StepResult r = t.step(lr);             verdict: applied or r.skipped
//   t.save(dir, extra) / t.load(dir)                       model + optimizer + scaler (+ your keys)
//   t.layer_scales(), t.monitor()                          per-layer s, S and underflow of the last step
//   evaluate(t, dataset_or_images_and_labels, batch)       loss and accuracy in evaluation mode (predict)
//
//   make_optimizer({"name": "sgd"|"adam"|"adamw", ...}), LrSchedule   fp32 master-weight updates with
//                     PyTorch's semantics (docs/optim.md); the learning rate is an argument of step().
//   TraceWriter       the per-layer trace of SPEC §8 (JSON Lines while running, one document at the end);
//                     its header comes from ScaledTraining::trace_header().
//   softmax_cross_entropy, LossResult   the loss (fp32/fp64) used by loss_backward.
//   ExternalBackward  the same precision model for a backward pass another engine computes (any loss,
//                     layers that are not gradscale layers): the caller hands it the fp32 loss gradient,
//                     each layer's upstream product, joins and weight gradients; it chooses S0 and the
//                     local scales, rounds, measures, unscales and gives the verdict (gradscale.torch).
//                     Its last argument names where the arrays live ("cpu", "cuda"): on a GPU its
//                     roundings and statistics are lib/cuda's kernels (arrays(): ArrayOps).
//   make_backend("cpu"|"cuda"|"cuda:N"), model.use_backend(*backend)   where the model computes (the
//                     backend must outlive the model; docs/architecture.md, "The device seam"). On a
//                     device, forward() takes host or device images and returns device logits
//                     (Tensor::to_host() reads them).
//
// Ownership: the model and the optimizer are borrowed by ScaledTraining (they must outlive it), the
// scaler is owned by it. Contracts in detail: internal/lib/train/scaled_training.h.
#pragma once

#include "lib/backend/backend.h"
#include "lib/layers/softmax_cross_entropy.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "lib/optim/parameter.h"
#include "lib/train/evaluation.h"
#include "lib/train/external_backward.h"
#include "lib/train/scaled_training.h"
#include "lib/train/trace.h"
