// gradscale public API — the ready-made loop (docs/config.md): Trainer(TrainConfig).run() trains a
// built-in model or a JSON model spec on a data spec for some epochs with evaluation, progress lines,
// checkpoints, resume and traces — what `gradscale train` runs. Each of its iterations is one
// ScaledTraining iteration (training.h); use that directly for your own network or loop.
//
//   TrainConfig c;  c.model = "cnn";  c.format = Format::fp16;  c.scaler = {{"policy", "torch"}};
//   Trainer trainer(c, &std::cerr);   nlohmann::json result = trainer.run();
//
// Contracts in detail: internal/lib/train/trainer.h and config.h.
#pragma once

#include "lib/train/config.h"
#include "lib/train/trainer.h"
