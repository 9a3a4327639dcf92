// Layers that select or copy values, or round what they compute to F again (ReLU, Flatten, Dropout,
// MaxPool2d's forward): their output holds values of F whenever their input does, and their input
// gradient values of the gradient format whenever the output gradient does (Layer::output_in_format).
#pragma once

#include "lib/layers/layer.h"

namespace gradscale {

class FormatPreservingLayer : public Layer {
 public:
  using Layer::Layer;
  bool output_in_format(bool in) const override { return in; }
  bool input_grads_in_format(bool out) const override { return out; }
};

}  // namespace gradscale
