// `gradscale ablate --shard K/N`: the K-th of N disjoint subsets of an ablation's runs, so that N
// processes (a Slurm job array, scripts/slurm_ablate.sh) share one ablation and one --out directory.
// The subset depends only on the ablation file: run i (in the expansion's order) belongs to shard
// (i mod N) + 1, which also spreads each configuration's seeds, and so its cost, over the shards.
#pragma once

#include <cstddef>
#include <string>

namespace gradscale::ablate {

struct Shard {
  int index = 1;       // K, from 1
  int count = 1;       // N
  bool given = false;  // from --shard K/N (1/1 too): a shard, which writes no tables
  // No --shard: the whole ablation, which writes the tables. (--shard 1/1 holds every run, as a shard.)
  bool all() const { return !given; }
  bool holds(std::size_t run_index) const {
    return static_cast<int>(run_index % static_cast<std::size_t>(count)) == index - 1;
  }
  std::string label() const { return std::to_string(index) + "/" + std::to_string(count); }
};

// Parses "K/N" (1 <= K <= N <= 100000). ConfigError naming the text and the allowed form otherwise.
Shard parse_shard(const std::string& text);

}  // namespace gradscale::ablate
