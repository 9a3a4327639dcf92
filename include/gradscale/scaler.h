// gradscale public API — loss scalers and per-layer controllers (docs/api.md, "Attach a scaler" and
// "Add your own controller"; the built-in policies and their parameters: docs/scalers.md).
//
//   make_scaler(config, grad_format)   a Scaler from {"policy": NAME, ...} or the text forms "torch",
//                     "static:1024". Global policies (none, static, torch, deepspeed, megatron, apex, keras,
//                     jmp, cerebras, popart_als) scale at the loss only; per-layer ones (adaptive with
//                     method approx_range | abs_range | element_wise | fixed | measured, te_delayed) own a
//                     LayerController that picks a local scale s at every Linear / Conv2d.
//   Scaler            the loss-level policy: S0 (loss_scale / choose_loss_scale), update(StepStatistics) ->
//                     StepReport{skipped, scale, state}; config(), state() / restore_state().
//   LayerController   bind(layer table, grad format) once; begin_step({step, phi}); needs(layer) = the
//                     statistics to compute (StatNeeds bits); decide(LocalScaleQuery) -> LocalScale{s,
//                     unbound}; end_step(StepMonitor). The engine computes the statistics (never the
//                     controller) and applies s to the fp32 upstream product before its one rounding.
//   register_scaler(name, factory, ScalerKind)   makes a policy of your own available by name to
//                     make_scaler, Trainer and `gradscale train --scaler NAME` in your program.
//   StepMonitor, LayerRecord   what one iteration's backward observed, per layer: s, S_in, S_out, max|g|,
//                     and on recording steps the §3 statistics of every gradient it rounded.
//
// A Scaler is owned by whoever trains with it (ScaledTraining, Trainer); its controller by the Scaler.
// Contracts in detail: internal/lib/scaler/scaler.h and controller.h.
#pragma once

#include "lib/instrument/step_monitor.h"
#include "lib/scaler/controller.h"
#include "lib/scaler/scaler.h"
