// Models from a JSON model spec, and the built-in models (mlp, cnn, resnet-mini, deep-mlp), which are
// themselves written as specs so there is one way to build a model. The format is in docs/models.md.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "lib/core/random.h"
#include "lib/model/model.h"

namespace gradscale {

// Builds and finalizes a model from a spec (see docs/models.md). Every error is a ConfigError that
// names the layer (by name or index) and the key.
std::unique_ptr<Model> build_model(const nlohmann::json& spec, Rng& rng);

// The spec of a built-in model: "mlp", "cnn", "resnet-mini[:n=N]", "deep-mlp[:depth=D,width=W,gain=G]".
// Unknown names or parameters → ConfigError listing what is allowed.
nlohmann::json builtin_model_spec(const std::string& name);

}  // namespace gradscale
