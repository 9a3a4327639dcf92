// Loss and accuracy over a labelled set (see evaluation.h): the predict path, batch by batch, and the
// backend's loss, so the figures are those Trainer reports for the same batches.
#include "lib/train/evaluation.h"

#include <algorithm>

#include "lib/backend/backend.h"
#include "lib/core/error.h"

namespace gradscale {

Evaluation evaluate(ScaledTraining& training, const Tensor& images, const std::vector<std::int32_t>& labels,
                    std::int64_t batch) {
  GS_CHECK_CONFIG(batch >= 1, "evaluate: batch must be >= 1, got " << batch);
  GS_CHECK_CONFIG(images.on_host(), "evaluate: the images must be on the host (they are copied to the model's "
                                    "device batch by batch)");
  const auto n = static_cast<std::int64_t>(labels.size());
  GS_CHECK_CONFIG(!images.shape().empty() && images.dim(0) == n,
                  "evaluate: " << n << " labels for images " << shape_string(images.shape())
                               << " (one label per image)");
  Evaluation e;
  if (n == 0) return e;
  const std::int64_t row = images.size() / n;
  Shape shape = images.shape();
  Tensor x;
  std::vector<std::int32_t> y;
  double loss_sum = 0;
  for (std::int64_t at = 0; at < n; at += batch) {
    const std::int64_t b = std::min(batch, n - at);
    shape[0] = b;
    x.resize(shape);
    std::copy_n(images.data() + at * row, b * row, x.data());
    y.assign(labels.begin() + at, labels.begin() + at + b);
    const Tensor& logits = training.predict(x);
    const LossResult r = training.model().backend().softmax_cross_entropy(logits, y);
    loss_sum += r.loss * static_cast<double>(b);
    e.correct += r.correct;
  }
  e.samples = n;
  e.loss = loss_sum / static_cast<double>(n);
  e.accuracy = static_cast<double>(e.correct) / static_cast<double>(n);
  return e;
}

Evaluation evaluate(ScaledTraining& training, const Dataset& data, std::int64_t batch) {
  return evaluate(training, data.images, data.labels, batch);
}

}  // namespace gradscale
