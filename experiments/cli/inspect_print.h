// The text output of `gradscale inspect`: the header line, the per-layer table (with what held s and
// the fp32 shadow's figures when the trace has them), the run totals, or one step for --at. Each
// takes the JSON that inspect_gather.h builds (the same object --json prints) and writes to stdout.
#pragma once

#include <nlohmann/json.hpp>

namespace gradscale::cli::inspect {

// "FILE: schema, model M, format F, grad_format G, scaler P, N steps, T traced steps" from run_json.
void print_header_line(const nlohmann::json& run);

// The table of table_json's "layers" and "loss" ("-" where there is nothing to show), then what held
// s and the fp32 shadow's means when a layer has them.
void print_table(const nlohmann::json& table);

// The run totals of run_json, or "run did not finish" with the counts up to the last traced step.
void print_totals(const nlohmann::json& run);

// One traced step: at_json's step fields, then each layer's s, S, log2 S, underflow and overflow.
void print_at(const nlohmann::json& at);

}  // namespace gradscale::cli::inspect
