// The mini-batch iterator (see batcher.h): per-epoch permutation, gather into caller-owned buffers,
// and the JSON state for checkpoints.
#include "lib/data/batcher.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "lib/core/error.h"
#include "lib/data/shuffle.h"

namespace gradscale {

Batcher::Batcher(const Dataset& data, std::int64_t batch_size, std::uint64_t seed, bool shuffle)
    : data_(data), batch_size_(batch_size), seed_(seed), shuffle_(shuffle), size_(data.size()) {
  GS_CHECK_CONFIG(batch_size_ >= 1, "batch size must be at least 1, got " << batch_size_);
  GS_CHECK_CONFIG(size_ >= 1, "dataset '" << data.name << "' is empty: nothing to batch");
  GS_CHECK_SHAPE(data.images.rank() == 4 && data.images.dim(0) == size_,
                 "dataset '" << data.name << "' images " << shape_string(data.images.shape())
                             << " do not match its " << size_ << " labels as [N, C, H, W]");
  batch_shape_ = data.images.shape();
  example_floats_ = data.images.size() / size_;
}

void Batcher::prepare_order() {
  if (order_epoch_ == epoch_) return;
  if (shuffle_) {
    epoch_permutation(seed_, epoch_, size_, order_);
  } else if (order_epoch_ < 0) {  // the identity serves every epoch
    order_.resize(static_cast<std::size_t>(size_));
    std::iota(order_.begin(), order_.end(), std::int64_t{0});
  }
  order_epoch_ = epoch_;
}

bool Batcher::next(Tensor& images, std::vector<std::int32_t>& labels) {
  GS_CHECK(data_.size() == size_, "dataset '" << data_.name << "' changed size from " << size_ << " to "
                                              << data_.size() << " under its batcher");
  if (position_ >= size_) {
    ++epoch_;
    position_ = 0;
    return false;
  }
  prepare_order();
  const std::int64_t b = std::min(batch_size_, size_ - position_);
  batch_shape_[0] = b;
  images.resize(batch_shape_);
  labels.resize(static_cast<std::size_t>(b));
  const float* src = data_.images.data();
  float* dst = images.data();
  const auto bytes = static_cast<std::size_t>(example_floats_) * sizeof(float);
  for (std::int64_t i = 0; i < b; ++i) {
    const std::int64_t k = order_[static_cast<std::size_t>(position_ + i)];
    std::memcpy(dst + i * example_floats_, src + k * example_floats_, bytes);
    labels[static_cast<std::size_t>(i)] = data_.labels[static_cast<std::size_t>(k)];
  }
  position_ += b;
  return true;
}

nlohmann::json Batcher::state() const {
  return {{"epoch", epoch_},           {"position", position_}, {"seed", seed_},
          {"batch_size", batch_size_}, {"size", size_},         {"shuffle", shuffle_}};
}

namespace {

const nlohmann::json& state_field(const nlohmann::json& state, const char* key, bool boolean) {
  GS_CHECK_CONFIG(state.is_object(), "batcher state must be a JSON object, got " << state.type_name());
  const auto it = state.find(key);
  GS_CHECK_CONFIG(it != state.end(), "batcher state: missing key '" << key << "'");
  GS_CHECK_CONFIG(boolean ? it->is_boolean() : (it->is_number_integer() && *it >= 0),
                  "batcher state: '" << key << "' must be " << (boolean ? "true or false" : "an integer >= 0")
                                     << ", got " << it->dump());
  return *it;
}

template <typename T>
void check_same(const nlohmann::json& state, const char* key, T mine) {
  const T theirs = state_field(state, key, std::is_same<T, bool>::value).template get<T>();
  GS_CHECK_CONFIG(theirs == mine, "batcher state: '"
                                      << key << "' is " << std::boolalpha << theirs
                                      << " but this batcher has " << mine
                                      << "; restore needs the same seed, batch size, dataset and "
                                         "shuffle setting");
}

}  // namespace

void Batcher::restore(const nlohmann::json& state) {
  check_same(state, "seed", seed_);
  check_same(state, "batch_size", batch_size_);
  check_same(state, "size", size_);
  check_same(state, "shuffle", shuffle_);
  const auto epoch = state_field(state, "epoch", false).get<std::int64_t>();
  const auto position = state_field(state, "position", false).get<std::int64_t>();
  GS_CHECK_CONFIG(epoch >= 0, "batcher state: 'epoch' " << epoch << " is out of range");
  GS_CHECK_CONFIG(position >= 0 && position <= size_,
                  "batcher state: 'position' " << position << " is past the dataset size " << size_);
  epoch_ = epoch;
  position_ = position;
}

}  // namespace gradscale
