// gradscale public API — data for the examples and experiments (docs/data.md).
//
//   load_data("fashion-mnist" | "mnist:DIR" | "synthetic[:N]", seed) -> DataSplit{train, test, source}
//                     Fashion-MNIST from $GRADSCALE_FASHION_MNIST_DIR or /usr/share/datasets/fashion-mnist;
//                     a synthetic split instead (`source` says so) when its files are absent.
//   Dataset           images [N, C, H, W] float32, normalised; labels (int32, in [0, classes)).
//   Batcher           seeded, shuffled mini-batches whose state a checkpoint can save (optional: a loop may
//                     feed its own batches).
//
// Contracts in detail: internal/lib/data/dataset.h and batcher.h.
#pragma once

#include "lib/data/batcher.h"
#include "lib/data/dataset.h"
