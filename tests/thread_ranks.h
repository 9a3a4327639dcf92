// Two ranks of data-parallel training as two threads of one test process (no MPI): the communicator
// they share, and the small residual training that tests/test_distributed_threads.cpp (CPU backend) and
// tests/test_cuda_distributed.cpp (CUDA backend) run on one process and on two ranks.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lib/backend/backend.h"
#include "lib/dist/communicator.h"
#include "lib/model/spec.h"
#include "lib/optim/optimizer.h"
#include "lib/train/scaled_training.h"

namespace gradscale::test {

// Two ranks as two threads of this process: each collective deposits the rank's bytes, waits for the
// other's, and computes the result from both in rank order (so float sums are a + b on both ranks).
class ThreadPair {
 public:
  // What a rank's collective throws once the other rank has failed (instead of waiting for it forever).
  struct Abandoned : std::exception {
    const char* what() const noexcept override { return "the other rank failed"; }
  };
  // A rank failed: every collective waiting or to come throws Abandoned.
  void abandon() {
    std::lock_guard<std::mutex> lock(mutex_);
    abandoned_ = true;
    cv_.notify_all();
  }
  // Both ranks' buffers of one collective, once both have arrived.
  std::vector<std::vector<char>> exchange(int rank, const void* data, std::size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !reading_ || abandoned_; });  // the previous collective is read by both
    if (abandoned_) throw Abandoned();
    slots_[rank].assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    if (++arrived_ == 2) {
      reading_ = true;
      ++generation_;
      cv_.notify_all();
    } else {
      const auto gen = generation_;
      cv_.wait(lock, [&] { return generation_ != gen || abandoned_; });
      if (generation_ == gen) throw Abandoned();
    }
    std::vector<std::vector<char>> both(slots_, slots_ + 2);
    if (--arrived_ == 0) {
      reading_ = false;
      cv_.notify_all();
    }
    return both;
  }

 private:
  bool abandoned_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<char> slots_[2];
  int arrived_ = 0;
  bool reading_ = false;
  std::uint64_t generation_ = 0;
};

class ThreadCommunicator final : public gradscale::Communicator {
 public:
  ThreadCommunicator(ThreadPair& pair, int rank) : pair_(pair), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string backend() const override { return "threads"; }
  void all_reduce_sum(std::uint64_t* d, std::size_t n) override { combine(d, n, [](auto a, auto b) { return a + b; }); }
  void all_reduce_sum(float* d, std::size_t n) override { combine(d, n, [](auto a, auto b) { return a + b; }); }
  void all_reduce_max(double* d, std::size_t n) override {
    combine(d, n, [](auto a, auto b) { return std::max(a, b); });
  }
  void all_gather(const double* in, std::size_t n, double* out) override {
    const auto both = pair_.exchange(rank_, in, n * sizeof(double));
    std::memcpy(out, both[0].data(), n * sizeof(double));
    std::memcpy(out + n, both[1].data(), n * sizeof(double));
  }
  void broadcast(void* bytes, std::size_t n, int root) override {
    const auto both = pair_.exchange(rank_, bytes, n);
    std::memcpy(bytes, both[static_cast<std::size_t>(root)].data(), n);
  }
  void barrier() override { pair_.exchange(rank_, nullptr, 0); }
  void abort(int code) override { std::_Exit(code); }

 private:
  template <typename T, typename Op>
  void combine(T* d, std::size_t n, Op op) {
    const auto both = pair_.exchange(rank_, d, n * sizeof(T));
    const auto* a = reinterpret_cast<const T*>(both[0].data());
    const auto* b = reinterpret_cast<const T*>(both[1].data());
    for (std::size_t i = 0; i < n; ++i) d[i] = op(a[i], b[i]);
  }
  ThreadPair& pair_;
  int rank_;
};

// Runs fn(rank, communicator) on two threads; rethrows the first exception.
template <typename Fn>
void on_two_ranks(Fn fn) {
  ThreadPair pair;
  std::exception_ptr error[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(pair, r);
      try {
        fn(r, comm);
      } catch (const ThreadPair::Abandoned&) {  // the other rank's error is the one to report
      } catch (...) {
        error[r] = std::current_exception();
        pair.abandon();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : error)
    if (e) std::rethrow_exception(e);
}

constexpr int kResidualSteps = 6, kResidualBatch = 32;

// What one run of train_residual decided, step by step, and its weights at the end.
struct RankRecord {
  std::vector<double> s0;
  std::vector<bool> skipped;
  std::vector<std::vector<double>> scales;
  std::vector<std::vector<float>> weights;
};

// A residual network (a join) with conv and linear layers, fp16 values and fp8_e5m2 gradients, Adam,
// kResidualSteps steps of a batch of kResidualBatch (the same batches in every call). With `comm`: this
// rank's rows of each batch (rank r of N: rows [r·b/N, (r+1)·b/N)), after distribute(comm,
// gpu_collectives). `backend`: where the model runs (null: the host).
inline RankRecord train_residual(Communicator* comm, const nlohmann::json& scaler, Backend* backend,
                                 const std::string& gpu_collectives = "auto") {
  const nlohmann::json spec = nlohmann::json::parse(R"({"name": "dp-res", "input": [1, 12, 12], "layers": [
    {"type": "conv2d", "name": "c1", "out": 4, "kernel": 3, "padding": 1, "stride": 2},
    {"type": "relu", "name": "r1"},
    {"type": "conv2d", "name": "c2", "out": 4, "kernel": 3, "padding": 1},
    {"type": "add", "name": "j", "inputs": ["c2", "r1"]},
    {"type": "flatten", "name": "f"},
    {"type": "linear", "name": "fc1", "out": 32},
    {"type": "relu", "name": "r2"},
    {"type": "linear", "name": "fc", "out": 10}]})");
  Precision p;
  p.format = Format::fp16;
  p.grad_format = Format::fp8_e5m2;  // gradients that need the controller's scales
  constexpr int kSteps = kResidualSteps, kBatch = kResidualBatch;
  std::mt19937 gen(3);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, 9);
  std::vector<Tensor> xs;
  std::vector<std::vector<std::int32_t>> ys;
  for (int s = 0; s < kSteps; ++s) {
    Tensor x(Shape{kBatch, 1, 12, 12});
    for (std::int64_t i = 0; i < x.size(); ++i) x[i] = 0.01f * pixel(gen);
    xs.push_back(x);
    ys.emplace_back();
    for (int i = 0; i < kBatch; ++i) ys.back().push_back(label(gen));
  }
  Rng rng(5);
  auto model = build_model(spec, rng);
  if (backend) model->use_backend(*backend);
  auto optimizer = make_optimizer({{"name", "adam"}});
  ScaledTraining t(*model, *optimizer, p, scaler, 5);
  if (comm) t.distribute(*comm, gpu_collectives);
  const int r = comm ? comm->rank() : 0, n = comm ? comm->size() : 1;
  RankRecord rec;
  for (int s = 0; s < kSteps; ++s) {
    const std::int64_t begin = kBatch * r / n, end = kBatch * (r + 1) / n, row = 144;
    Tensor x(Shape{end - begin, 1, 12, 12});
    std::copy(xs[s].data() + begin * row, xs[s].data() + end * row, x.data());
    const std::vector<std::int32_t> y(ys[s].begin() + begin, ys[s].begin() + end);
    t.begin_step();
    const Tensor& logits = t.forward(x);
    const double s0 = t.loss_scale(logits, y);
    t.loss_backward(logits, y, s0);
    const StepResult out = t.step(1e-3);
    rec.s0.push_back(out.loss_scale);
    rec.skipped.push_back(out.skipped);
    rec.scales.emplace_back();
    for (const LayerScale& l : t.layer_scales()) rec.scales.back().push_back(l.s);
  }
  for (const Parameter* prm : model->parameters()) {
    const Tensor w = prm->value.to_host();
    rec.weights.emplace_back(w.data(), w.data() + w.size());
  }
  return rec;
}

}  // namespace gradscale::test
