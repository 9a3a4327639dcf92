// gradscale's C++ core for Python (module gradscale._core): the precision model of SPEC §4–§5
// (ExternalBackward), rounding and statistics, and gradscale's own training engine for comparisons.
// Tensors cross as (address, element count) of contiguous float32 memory — the host's, or a GPU's for an
// ExternalBackward made for "cuda" (built with lib/cuda): no libtorch (or numpy) type is compiled in, so
// one build serves every torch version. JSON crosses as text.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gradscale/gradscale.h>

#include "lib/dist/communicator.h"
#include "lib/dist/data_parallel.h"
#include "lib/model/join.h"
#include "lib/model/spec.h"
#include "lib/optim/lr_schedule.h"
#include "lib/optim/optimizer.h"
#include "python/csrc/host_pool.h"
#ifdef GS_CORE_CPU_TARGET
#include "tests/cuda_on_cpu/executor.h"
#include "tests/cuda_on_cpu/memory.h"
#endif

namespace py = pybind11;
using namespace pybind11::literals;
using namespace gradscale;
using json = nlohmann::json;

namespace {

float* address(std::uintptr_t p) { return reinterpret_cast<float*>(p); }

// ---- HostPool's blocks as torch tensors, through DLPack ----------------------------------------------
// DLPack's ABI (dlpack.h, unchanged since v0.2 in these fields): torch.utils.dlpack.from_dlpack takes a
// capsule named "dltensor", renames it "used_dltensor" and calls `deleter` when its tensor's storage dies.
namespace dlpack {
struct Device {
  std::int32_t device_type;  // 1: kDLCPU
  std::int32_t device_id;
};
struct DataType {
  std::uint8_t code;  // 2: kDLFloat
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements
  std::uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor*);
};
}  // namespace dlpack

// One float32 tensor on a block of a HostPool: the block goes back to the pool in the deleter.
struct PooledTensor {
  dlpack::ManagedTensor managed{};
  std::shared_ptr<HostPool> pool;
  std::vector<std::int64_t> shape, strides;
  void* block = nullptr;
  std::size_t bytes = 0;

  static void release(dlpack::ManagedTensor* t) {
    auto* self = static_cast<PooledTensor*>(t->manager_ctx);
    self->pool->give_back(self->block, self->bytes);
    delete self;
  }
};

// A capsule torch never consumed (an error before from_dlpack) still gives its block back.
void release_unused_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* t = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    t->deleter(t);
  }
}

// A DLPack capsule of a float32 CPU tensor with these sizes and strides (in elements) on a pool block
// covering every element they address. Sizes must be positive and strides non-negative.
py::object pooled_tensor(const std::shared_ptr<HostPool>& pool, const std::vector<std::int64_t>& shape,
                         const std::vector<std::int64_t>& strides) {
  GS_CHECK(shape.size() == strides.size(), "HostPool.tensor: " << shape.size() << " sizes, " << strides.size()
                                                               << " strides");
  std::int64_t extent = 1;  // 1 + the largest offset addressed
  for (std::size_t i = 0; i < shape.size(); ++i) {
    GS_CHECK(shape[i] > 0 && strides[i] >= 0, "HostPool.tensor: size " << shape[i] << ", stride " << strides[i]
                                                                      << " (sizes > 0, strides >= 0)");
    GS_CHECK(strides[i] <= (std::int64_t{1} << 40) / shape[i] && extent < (std::int64_t{1} << 40),
             "HostPool.tensor: a tensor of more than 2^40 elements");
    extent += (shape[i] - 1) * strides[i];
  }
  auto owned = std::make_unique<PooledTensor>();
  owned->pool = pool;
  owned->shape = shape;
  owned->strides = strides;
  owned->bytes = static_cast<std::size_t>(extent) * sizeof(float);
  owned->block = pool->take(owned->bytes);
  PooledTensor* t = owned.get();
  t->managed.dl_tensor = {t->block, {1, 0}, static_cast<std::int32_t>(shape.size()), {2, 32, 1},
                          t->shape.data(), t->strides.data(), 0};
  t->managed.manager_ctx = t;
  t->managed.deleter = &PooledTensor::release;
  PyObject* capsule = PyCapsule_New(&t->managed, "dltensor", &release_unused_capsule);
  if (capsule == nullptr) {
    PooledTensor::release(&owned.release()->managed);
    throw py::error_already_set();
  }
  owned.release();  // the capsule's, then torch's
  return py::reinterpret_steal<py::object>(capsule);
}

// The parts of a join's sum (sum_scaled_parts) as arrays, one scale each.
std::vector<const float*> part_addresses(const std::vector<std::uintptr_t>& parts, const std::vector<double>& scales,
                                         std::int64_t n) {
  GS_CHECK(n >= 0 && parts.size() == scales.size(),
           "sum_scaled_parts: " << parts.size() << " parts, " << scales.size() << " scales, n = " << n);
  std::vector<const float*> values;
  for (std::uintptr_t p : parts) values.push_back(address(p));
  return values;
}

// Scale handles from Python's ints.
std::vector<ScaleHandle> handles(const std::vector<int>& ids) {
  std::vector<ScaleHandle> out;
  for (int id : ids) out.push_back(ScaleHandle{id});
  return out;
}

Format format_of(const std::string& name) { return parse_format(name); }

std::vector<LayerInfo> layer_table(const std::vector<py::dict>& rows) {
  std::vector<LayerInfo> layers;
  for (const py::dict& row : rows) {
    LayerInfo l;
    l.id = static_cast<int>(layers.size());
    l.name = row["name"].cast<std::string>();
    l.kind = row["kind"].cast<std::string>();
    l.parametric = row["parametric"].cast<bool>();
    l.reduction = row["reduction"].cast<std::int64_t>();
    l.weight_shape = row["weight_shape"].cast<Shape>();
    layers.push_back(std::move(l));
  }
  return layers;
}

Precision precision_of(const std::string& format, const std::string& grad_format, bool quantize_weight_grads) {
  Precision p;
  p.format = format_of(format);
  if (!grad_format.empty()) p.grad_format = format_of(grad_format);
  p.quantize_weight_grads = quantize_weight_grads;
  return p;
}

py::dict stats_dict(const TensorStats& s) {
  return py::dict("zero"_a = s.zero, "underflow"_a = s.underflow, "subnormal"_a = s.subnormal,
                  "normal"_a = s.normal, "overflow"_a = s.overflow, "nonfinite"_a = s.nonfinite,
                  "elements"_a = s.elements, "underflow_rate"_a = s.underflow_rate(),
                  "max_abs"_a = s.max_abs);
}

py::dict step_dict(const StepResult& r) {
  return py::dict("step"_a = r.step, "loss"_a = r.loss, "loss_scale"_a = r.loss_scale,
                  "found_inf"_a = r.found_inf, "first_nonfinite_layer"_a = r.first_nonfinite_layer,
                  "skipped"_a = r.skipped, "phi"_a = r.phi, "next_scale"_a = r.report.scale,
                  "scaler_seconds"_a = r.scaler_seconds, "state"_a = r.report.state.dump());
}

py::list layer_rows(const std::vector<LayerScale>& rows, const StepMonitor& monitor) {
  py::list out;
  for (const LayerScale& r : rows) {
    py::dict d;
    d["id"] = r.id;
    d["name"] = r.name;
    d["kind"] = r.kind;
    d["parametric"] = r.parametric;
    d["ran"] = r.ran;
    d["sent"] = r.sent;
    d["s"] = r.s;
    d["unbound"] = r.unbound;
    d["S_in"] = r.scale_in;
    d["S_out"] = r.scale_out;
    d["recorded"] = r.recorded;
    d["underflow_rate"] = r.recorded ? py::cast(r.underflow_rate) : py::none();
    // Before the first step the monitor has no records.
    const bool has = r.id >= 0 && static_cast<std::size_t>(r.id) < monitor.records.size();
    const LayerRecord* rec = has ? &monitor.records[static_cast<std::size_t>(r.id)] : nullptr;
    d["weight_grad"] = rec && rec->has_weight_grad ? py::object(stats_dict(rec->weight_grad)) : py::none();
    // The factor r its weight-gradient parts were stored at this step (SPEC §6.5; 1 under a global policy).
    d["weight_grad_scale"] = rec ? rec->weight_grad_scale : 1.0;
    out.append(d);
  }
  return out;
}

// gradscale's own engine on a model spec, for the plug-in's agreement test: the given initial
// parameters (by name), `steps` iterations of SGD on the same batch, the per-step scales out.
py::list reference_run(const std::string& spec, const std::vector<std::pair<std::string, std::uintptr_t>>& params,
                       std::uintptr_t images, const Shape& image_shape, const std::vector<std::int32_t>& labels,
                       int steps, double lr, const std::string& scaler, const std::string& format,
                       const std::string& grad_format) {
  Rng rng(0);
  std::unique_ptr<Model> model = build_model(json::parse(spec), rng);
  for (Parameter* p : model->parameters()) {
    bool found = false;
    for (const auto& [name, ptr] : params)
      if (name == p->name) {
        std::copy(address(ptr), address(ptr) + p->value.size(), p->value.data());
        found = true;
      }
    GS_CHECK_CONFIG(found, "reference_run: no initial value for parameter '" << p->name << "'");
  }
  std::unique_ptr<Optimizer> sgd = make_optimizer(json{{"name", "sgd"}});
  ScaledTraining t(*model, *sgd, precision_of(format, grad_format, true), json::parse(scaler));
  Tensor x(image_shape);
  std::copy(address(images), address(images) + x.size(), x.data());
  py::list out;
  for (int i = 0; i < steps; ++i) {
    t.begin_step(false);
    const Tensor& logits = t.forward(x);
    const double s0 = t.loss_scale(logits, labels);
    t.loss_backward(logits, labels, s0);
    const StepResult r = t.step(lr);
    py::dict d = step_dict(r);
    d["layers"] = layer_rows(t.layer_scales(), t.monitor());
    out.append(d);
  }
  for (Parameter* p : model->parameters())
    for (const auto& [name, ptr] : params)
      if (name == p->name) std::copy(p->value.data(), p->value.data() + p->value.size(), address(ptr));
  return out;
}

// The collectives of torch.distributed, as gradscale's Communicator: each one is a call of the Python
// function `collective(op, values) -> values` (op: "sum_int", "sum_float", "max", "gather", "barrier";
// "gather" returns the ranks' values one rank after another), which the plug-in runs on its process
// group. With DataParallel over it, the plug-in reduces its statistics as gradscale's own
// data-parallel training does (lib/dist, docs/distributed.md).
class PythonCommunicator final : public Communicator {
 public:
  PythonCommunicator(int rank, int size, py::function collective)
      : rank_(rank), size_(size), collective_(std::move(collective)) {
    GS_CHECK_CONFIG(size >= 1 && rank >= 0 && rank < size,
                    "gradscale._core.Reducer: rank " << rank << " of " << size << " ranks");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "torch.distributed"; }
  void all_reduce_sum(std::uint64_t* data, std::size_t n) override { call("sum_int", data, n, n, data); }
  void all_reduce_sum(float* data, std::size_t n) override { call("sum_float", data, n, n, data); }
  void all_reduce_max(double* data, std::size_t n) override { call("max", data, n, n, data); }
  void all_gather(const double* in, std::size_t n, double* out) override {
    call("gather", in, n, n * static_cast<std::size_t>(size_), out);
  }
  void broadcast(void*, std::size_t, int) override {
    throw DistributedError("gradscale._core.Reducer: broadcast is not used by the plug-in");
  }
  void barrier() override { collective_("barrier", py::list()); }
  [[noreturn]] void abort(int code) override {
    throw DistributedError("gradscale._core.Reducer: rank " + std::to_string(rank_) + " aborted (" +
                           std::to_string(code) + ")");
  }

 private:
  template <class T>
  void call(const char* op, const T* in, std::size_t n, std::size_t expected, T* out) {
    const py::object result = collective_(op, std::vector<T>(in, in + n));
    const auto values = result.cast<std::vector<T>>();
    GS_CHECK_AS(DistributedError, values.size() == expected,
                "gradscale._core.Reducer: the collective '" << op << "' returned " << values.size()
                                                           << " values, expected " << expected);
    std::copy(values.begin(), values.end(), out);
  }

  int rank_, size_;
  py::function collective_;
};

// What ExternalBackward::set_reducer borrows: the communicator and the data-parallel reductions over it.
struct Reducer {
  Reducer(int rank, int size, py::function collective) : comm(rank, size, std::move(collective)), dp(comm) {}
  PythonCommunicator comm;
  DataParallel dp;
};

}  // namespace

// The module's name: _core, or _core_cpu_target when built over lib/cuda's CPU execution target (the
// tests' stand-in for a GPU, tests/cuda_on_cpu; CMakeLists.txt, gs_python_core).
#ifndef GS_CORE_NAME
#define GS_CORE_NAME _core
#endif

PYBIND11_MODULE(GS_CORE_NAME, m) {
  m.doc() = "gradscale's C++ core (SPEC §2-§7) for the PyTorch plug-in";
#ifdef GS_CORE_CPU_TARGET
  gs_emu::set_system_memory_is_device(true);  // CPU tensors stand in for device memory (memory.h)
  m.def("kernel_launches", &gs_emu::launches,
        "kernel launches run so far in this process (the CPU execution target counts them: executor.h)");
#endif
  m.attr("__version__") = GRADSCALE_VERSION;
  // pybind11 tries the translators last-registered first: the base class goes first. Types and
  // translators are local to the module: _core and _core_cpu_target bind the same C++ types in one
  // process (pybind11's registry is otherwise shared between modules).
  py::register_local_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_local_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_local_exception<DataError>(m, "DataError", PyExc_ValueError);

  m.def("policies", &scaler_policies, "the registered scaler policies");
  m.def("cuda_built", &cuda_backend_built, "whether this core has lib/cuda (ExternalBackward(device='cuda'))");
  m.def("check_format", [](const std::string& f) { return format_name(format_of(f)); },
        "the canonical name of a format (ValueError naming the allowed ones otherwise)");
  m.def("max_finite", [](const std::string& f) { return format_info(format_of(f)).max_finite; });
  m.def("quantize_", [](std::uintptr_t p, std::int64_t n, const std::string& f) {
        quantize(address(p), address(p), static_cast<std::size_t>(n), format_of(f));
      }, "round n float32 values in place to a format (SPEC §2)");
  m.def("max_abs", [](std::uintptr_t p, std::int64_t n) {
        return static_cast<double>(max_abs(address(p), static_cast<std::size_t>(n)));
      }, "max|v| over n float32 values (inf when one is not finite)");
  // SPEC §5's join sum as gradscale's own join computes it (lib/model/join.h), for a join whose parts
  // are in host memory: `out` (n values) = Σ parts[k] · float(target / scales[k]), from 0, in order.
  m.def("sum_scaled_parts", [](std::uintptr_t out, std::int64_t n, const std::vector<std::uintptr_t>& parts,
                               const std::vector<double>& scales, double target) {
        const std::vector<const float*> values = part_addresses(parts, scales, n);
        sum_scaled_parts(values.data(), scales.data(), values.size(), target, address(out),
                         static_cast<std::size_t>(n));
      }, py::arg("out"), py::arg("n"), py::arg("parts"), py::arg("scales"), py::arg("target"),
      "out = the sum of n float32 values of each part times float(target / its scale), in host memory");
  m.def("tensor_stats", [](std::uintptr_t p, std::int64_t n, const std::string& f) {
        return stats_dict(tensor_stats(address(p), static_cast<std::size_t>(n), format_of(f)));
      }, "SPEC §3 counts of n float32 values against a format");
  m.def("reference_run", &reference_run);
  // The optimizer and learning-rate schedule of a config, checked as `gradscale train` checks them
  // (python -m gradscale.run; lib/optim): the resolved JSON, or ValueError naming the key and its range.
  m.def("optimizer_config", [](const std::string& cfg) { return make_optimizer(json::parse(cfg))->config().dump(); });
  m.def("lr_schedule_config", [](const std::string& cfg) { return LrSchedule::from_json(json::parse(cfg)).config().dump(); });

  // The per-layer trace of SPEC §8 (docs/trace.md), the same writer the CLI uses.
  py::class_<TraceWriter>(m, "TraceWriter", py::module_local())
      .def(py::init([](const std::string& base, const std::string& header, std::int64_t every, bool histograms) {
        return std::make_unique<TraceWriter>(base, json::parse(header), every, histograms);
      }))
      .def("samples", &TraceWriter::samples)
      .def("write_step", [](TraceWriter& w, const ExternalBackward& e, std::int64_t step, std::int64_t epoch,
                            double loss, double loss_scale, double phi, bool skipped) {
        TraceStep s;
        s.step = step;
        s.epoch = epoch;
        s.loss = loss;
        s.loss_scale = loss_scale;
        s.phi = phi;
        s.skipped = skipped;
        return w.write_step(s, e.monitor());
      })
      .def("finish", [](TraceWriter& w, const std::string& summary) { w.finish(json::parse(summary)); })
      .def_property_readonly("jsonl_path", &TraceWriter::jsonl_path)
      .def_property_readonly("json_path", &TraceWriter::json_path);

  // Host memory for the plug-in's rounded tensors on the CPU (host_pool.h; python/gradscale/torch/_functions.py, new_like).
  py::class_<HostPool, std::shared_ptr<HostPool>>(m, "HostPool", py::module_local())
      .def(py::init([] { return std::make_shared<HostPool>(); }))
      .def_property_readonly_static("mapped_bytes", [](py::object) { return HostPool::kMapped; },
                                    "blocks of this size and more are mapped outside malloc's heap")
      .def("tensor", &pooled_tensor, py::arg("shape"), py::arg("strides"),
           "a DLPack capsule of a float32 CPU tensor with these sizes and strides on a block of the pool "
           "(torch.utils.dlpack.from_dlpack makes it a tensor; the block comes back when torch frees it)")
      .def("trim", &HostPool::trim, "releases the blocks that stayed free since the last trim; the bytes freed")
      .def_property_readonly("held_bytes", &HostPool::held_bytes)
      .def_property_readonly("free_bytes", &HostPool::free_bytes)
      .def_property_readonly("taken", &HostPool::taken)
      .def_property_readonly("reused", &HostPool::reused);

  // Data-parallel statistics over torch.distributed (see PythonCommunicator).
  py::class_<Reducer>(m, "Reducer", py::module_local())
      .def(py::init<int, int, py::function>(), py::arg("rank"), py::arg("size"), py::arg("collective"))
      .def_property_readonly("collectives", [](const Reducer& r) { return r.dp.counts().statistics_collectives; })
      .def_property_readonly("bytes", [](const Reducer& r) { return r.dp.counts().statistics_bytes; })
      .def_property_readonly("seconds", [](const Reducer& r) { return r.dp.counts().statistics_seconds; });

  py::class_<ExternalBackward>(m, "ExternalBackward", py::module_local())
      .def(py::init([](const std::vector<py::dict>& layers, const std::string& format, const std::string& grad_format,
                       bool quantize_weight_grads, const std::string& scaler, const std::string& device) {
             return std::make_unique<ExternalBackward>(layer_table(layers),
                                                       precision_of(format, grad_format, quantize_weight_grads),
                                                       json::parse(scaler), device);
           }),
           py::arg("layers"), py::arg("format"), py::arg("grad_format"), py::arg("quantize_weight_grads"),
           py::arg("scaler"), py::arg("device") = "cpu")
      .def_property_readonly("device", &ExternalBackward::device)
      .def_property_readonly("host_waits", &ExternalBackward::host_waits)
      // The caller's own steps on arrays of that device: forward values and working weights rounded to
      // a format, a join part's maximum; set_stream orders the device's work on the caller's stream.
      .def("quantize_", [](ExternalBackward& e, std::uintptr_t p, std::int64_t n, const std::string& f) {
        e.arrays().quantize(address(p), address(p), static_cast<std::size_t>(n), format_of(f),
                            e.precision().round);
      })
      // dst = src rounded to a format, one pass (a rounded copy: no clone before the rounding).
      .def("quantize_into", [](ExternalBackward& e, std::uintptr_t src, std::uintptr_t dst, std::int64_t n,
                               const std::string& f) {
        e.arrays().quantize(address(src), address(dst), static_cast<std::size_t>(n), format_of(f),
                            e.precision().round);
      })
      .def("max_abs", [](ExternalBackward& e, std::uintptr_t p, std::int64_t n) {
        return static_cast<double>(e.arrays().max_abs(address(p), static_cast<std::size_t>(n)));
      })
      // max|v| of each array (a join's parts): one wait on a device for all of them.
      .def("max_abs_each", [](ExternalBackward& e, const std::vector<std::uintptr_t>& ps,
                              const std::vector<std::int64_t>& ns) {
        GS_CHECK(ps.size() == ns.size(),
                 "max_abs_each: " << ps.size() << " arrays, " << ns.size() << " sizes");
        std::vector<const float*> arrays;
        std::vector<std::size_t> sizes;
        for (std::size_t k = 0; k < ps.size(); ++k) {
          GS_CHECK(ns[k] >= 0 && (ns[k] == 0 || ps[k] != 0),
                   "max_abs_each: array " << k << " of " << ns[k] << " values");
          arrays.push_back(address(ps[k]));
          sizes.push_back(static_cast<std::size_t>(ns[k]));
        }
        std::vector<float> out(ps.size());
        e.arrays().max_abs_each(arrays.data(), sizes.data(), arrays.size(), out.data());
        return std::vector<double>(out.begin(), out.end());
      })
      .def("set_stream", [](ExternalBackward& e, std::uintptr_t stream) { e.arrays().set_stream(stream); })
      // The join's sum where the parts live: out = Σ part·float(T/S) (scales and T: handles).
      .def("sum_scaled_parts", [](ExternalBackward& e, std::uintptr_t out, std::int64_t n,
                                  const std::vector<std::uintptr_t>& parts, const std::vector<int>& scales,
                                  int target) {
        GS_CHECK(n >= 0 && parts.size() == scales.size(),
                 "sum_scaled_parts: " << parts.size() << " parts, " << scales.size() << " scales, n = " << n);
        std::vector<const float*> values;
        for (std::uintptr_t p : parts) values.push_back(address(p));
        e.sum_scaled_parts(values, handles(scales), ScaleHandle{target}, address(out), n);
      })
      // SPEC §8's trace header as gradscale train writes it (make_trace_header): this backward's formats
      // and scaler, the caller's `config` object, seed and layer table, as JSON text.
      .def("trace_header",
           [](const ExternalBackward& e, const std::string& config, std::uint64_t seed, const std::string& layers) {
             return e.trace_header(json::parse(config), seed, json::parse(layers)).dump();
           })
      .def("set_layer_inputs", &ExternalBackward::set_layer_inputs)
      .def("layer_inputs", [](const ExternalBackward& e) {
        std::vector<std::vector<int>> inputs;
        for (const LayerInfo& l : e.layers()) inputs.push_back(l.inputs);
        return inputs;
      })
      // Borrowed: the Reducer lives as long as this object (keep_alive), None detaches it.
      .def("set_reducer", [](ExternalBackward& e, Reducer* r) { e.set_reducer(r ? &r->dp : nullptr); },
           py::arg("reducer").none(true), py::keep_alive<1, 2>())
      .def("begin_step", &ExternalBackward::begin_step)
      // Each gradient step takes an optional `source`: the values are then read there and written to
      // the first address (one pass fewer than copying them there first); 0: in place.
      // S0's handle (ExternalBackward::loss_gradient_held: chosen on the device where it can be).
      .def("loss_gradient",
           [](ExternalBackward& e, std::uintptr_t g, std::int64_t n, std::uintptr_t source) {
             return e.loss_gradient_held(address(source ? source : g), address(g), n).id;
           },
           py::arg("g"), py::arg("n"), py::arg("source") = 0)
      .def_property_readonly("loss_scale", &ExternalBackward::loss_scale)
      // Scales as handles (ExternalBackward::scale_handle): ints of this iteration's table. On a device
      // that keeps a scale table the local scales and join targets are decided there, and only
      // scale_value / local_value wait for one.
      .def("scale_handle", [](ExternalBackward& e, double value) { return e.scale_handle(value).id; })
      .def("scale_value", [](ExternalBackward& e, int h) { return e.scale_value(ScaleHandle{h}); })
      .def("local_value", [](ExternalBackward& e, int h) { return e.local_value(ScaleHandle{h}); })
      // S_in a handle; returns the handle of s·S_in.
      .def("upstream",
           [](ExternalBackward& e, int layer, std::uintptr_t up, const Shape& up_shape, std::uintptr_t g,
              const Shape& g_shape, std::uintptr_t w, const Shape& w_shape, int scale_in,
              std::uintptr_t source) {
             return e
                 .upstream(layer, address(source ? source : up), address(up), up_shape, address(g), g_shape,
                           address(w), w_shape, ScaleHandle{scale_in})
                 .id;
           },
           py::arg("layer"), py::arg("up"), py::arg("up_shape"), py::arg("g"), py::arg("g_shape"), py::arg("w"),
           py::arg("w_shape"), py::arg("scale_in"), py::arg("source") = 0)
      .def("join_target", &ExternalBackward::join_target)
      // The join target T of the parts (addresses, sizes, scale handles): its handle.
      .def("join", [](ExternalBackward& e, const std::vector<std::uintptr_t>& parts,
                      const std::vector<std::int64_t>& sizes, const std::vector<int>& scales) {
        GS_CHECK(parts.size() == sizes.size(),
                 "join: " << parts.size() << " parts, " << sizes.size() << " sizes");
        std::vector<const float*> arrays;
        for (std::size_t k = 0; k < parts.size(); ++k) {
          GS_CHECK(sizes[k] >= 0 && (sizes[k] == 0 || parts[k] != 0),
                   "join: part " << k << " of " << sizes[k] << " values");
          arrays.push_back(address(parts[k]));
        }
        return e.join(arrays, sizes, handles(scales)).id;
      })
      .def("round_join", [](ExternalBackward& e, int layer, std::uintptr_t p, std::int64_t n) {
        e.round_join(layer, address(p), n);
      })
      .def("round_received",
           [](ExternalBackward& e, int layer, std::uintptr_t p, std::int64_t n, std::uintptr_t source) {
             e.round_received(layer, address(source ? source : p), address(p), n);
           },
           py::arg("layer"), py::arg("p"), py::arg("n"), py::arg("source") = 0)
      // The part at the scale of handle `scale`.
      .def("weight_gradient",
           [](ExternalBackward& e, int layer, std::uintptr_t p, std::int64_t n, int scale,
              std::uintptr_t source) {
             e.weight_gradient(layer, address(source ? source : p), address(p), n, ScaleHandle{scale});
           },
           py::arg("layer"), py::arg("p"), py::arg("n"), py::arg("scale"), py::arg("source") = 0)
      .def("note_layer",
           [](ExternalBackward& e, int layer, int scale_in) { e.note_layer(layer, ScaleHandle{scale_in}); })
      .def("note_shadow", [](ExternalBackward& e, int layer, bool weight, double mass, double rel, double cosine) {
        e.note_shadow(layer, weight, ShadowMetrics{mass, rel, cosine});
      })
      .def("agreement_buffer", &ExternalBackward::agreement_buffer)
      .def("agree", &ExternalBackward::agree)
      .def("overflow_buffer", &ExternalBackward::overflow_buffer)
      .def("agree_overflows", &ExternalBackward::agree_overflows)
      .def("finish_step", [](ExternalBackward& e, double loss) { return step_dict(e.finish_step(loss)); })
      .def("abandon_step", &ExternalBackward::abandon_step)
      .def_property_readonly("steps", &ExternalBackward::steps)
      .def("layer_scales", [](const ExternalBackward& e) { return layer_rows(e.layer_scales(), e.monitor()); })
      .def("loss_grad_stats", [](const ExternalBackward& e) {
        return e.monitor().has_loss_grad ? py::object(stats_dict(e.monitor().loss_grad)) : py::none();
      })
      .def("scaler_config", [](ExternalBackward& e) { return e.scaler().config().dump(); })
      .def("scaler_policy", [](ExternalBackward& e) { return e.scaler().policy(); })
      .def("current_scale", [](ExternalBackward& e) { return e.scaler().loss_scale(); })
      .def("per_layer", [](ExternalBackward& e) { return e.scaler().layer_controller() != nullptr; })
      .def("state", [](const ExternalBackward& e) { return e.state().dump(); })
      .def("restore_state", [](ExternalBackward& e, const std::string& s) { e.restore_state(json::parse(s)); });
}
