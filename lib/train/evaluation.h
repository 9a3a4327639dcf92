// Loss and accuracy of a model over a labelled set, in evaluation mode (ScaledTraining::predict: working
// weights in F, forward in F, no dropout, BatchNorm on its running statistics) — what a loop of one's
// own reports after training, without writing it. Public through <gradscale/training.h>.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/data/dataset.h"
#include "lib/tensor/tensor.h"
#include "lib/train/scaled_training.h"

namespace gradscale {

struct Evaluation {
  double loss = 0;             // mean softmax cross-entropy of the logits (fp32/fp64), over the samples
  double accuracy = 0;         // correct / samples
  std::int64_t samples = 0;
  std::int64_t correct = 0;    // samples whose largest logit is their label
};

// `images` [N, sample shape of the model] (fp32, on the host) with N labels in [0, classes), taken in
// order `batch` rows at a time (the last batch may be shorter; batch ≥ 1). Between iterations only
// (predict's rule); changes no training state. ConfigError for a label count that is not N or a batch
// < 1; ShapeError for images the model does not take. An empty set gives zeros.
Evaluation evaluate(ScaledTraining& training, const Tensor& images, const std::vector<std::int32_t>& labels,
                    std::int64_t batch = 1000);
// The same over a dataset (load_data's train or test split).
Evaluation evaluate(ScaledTraining& training, const Dataset& data, std::int64_t batch = 1000);

}  // namespace gradscale
