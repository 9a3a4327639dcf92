// Seeded, shuffled mini-batches over a Dataset, with a state a checkpoint can save and restore exactly.
// The order of epoch e is epoch_permutation(seed, e, N) (shuffle.h): the same on every platform, and a
// resumed batcher yields exactly the batches an uninterrupted one would have.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "lib/data/dataset.h"

namespace gradscale {

class Batcher {
 public:
  // Batches of `batch_size` (>= 1) examples of `data` (N >= 1). Holds a reference: `data` must outlive
  // the batcher and not change size. shuffle = false visits the dataset in order every epoch (evaluation).
  // Starts at epoch 0, position 0. Throws ConfigError for a bad batch size or an empty dataset.
  Batcher(const Dataset& data, std::int64_t batch_size, std::uint64_t seed, bool shuffle = true);

  // Copies the next batch of the current epoch into the caller's buffers: `images` becomes
  // [b, C, H, W] and `labels` b long, b = min(batch_size, N - position); the last batch of an epoch is
  // the partial remainder (kept, not dropped). Returns true. When the epoch is used up it fills nothing,
  // moves to the next epoch (position 0) and returns false, so `while (batcher.next(x, y))` runs one
  // epoch. The buffers keep their storage between batches: no allocation after the first full batch.
  bool next(Tensor& images, std::vector<std::int32_t>& labels);

  std::int64_t epoch() const { return epoch_; }
  std::int64_t position() const { return position_; }  // examples already served in this epoch
  std::int64_t batch_size() const { return batch_size_; }
  std::int64_t size() const { return size_; }  // N
  std::int64_t batches_per_epoch() const { return (size_ + batch_size_ - 1) / batch_size_; }

  // {"epoch", "position", "seed", "batch_size", "size", "shuffle"}: everything that fixes what comes next.
  nlohmann::json state() const;
  // Continues from a state() of a batcher built with the same seed, batch size, dataset size and
  // shuffle flag; ConfigError naming the key when one is missing, of the wrong type or different.
  void restore(const nlohmann::json& state);

 private:
  void prepare_order();  // the permutation of epoch_, computed once per epoch into order_

  const Dataset& data_;
  std::int64_t batch_size_;
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t size_;
  std::int64_t example_floats_;  // C * H * W
  Shape batch_shape_;            // reused, so next() builds no temporary shapes
  std::int64_t epoch_ = 0;
  std::int64_t position_ = 0;
  std::int64_t order_epoch_ = -1;  // the epoch order_ holds, -1 for none
  std::vector<std::int64_t> order_;
};

}  // namespace gradscale
