// tformers._core: the C++ library as a Python extension module. It only converts: the Python
// package (python/tformers/) gives it Transformers' names, argument forms and tensor types, and
// every computation stays in libtformers.
//
// The GIL is released whenever the library runs (loading, encoding a batch, generating, a
// forward pass), so other Python threads run meanwhile, including another model's generate().
// During generate() each step (each new token, each beam-search step) briefly takes the GIL back
// to run pending signal handlers (Ctrl-C raises KeyboardInterrupt there), and each new token to
// run the streamer; an exception from either stops generation there and is raised from
// generate().
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "tformers/accelerator.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/generation.h"
#include "tformers/kernels.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Ids = std::vector<std::vector<int32_t>>;
using IdArray = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The library's error classes as the exceptions Transformers raises for the same failures: a
// missing model folder or file is FileNotFoundError (an OSError), an unreadable one OSError,
// malformed content and impossible arguments ValueError.
void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const tformers::NotFoundError& e) {
    PyErr_SetString(PyExc_FileNotFoundError, e.what());
  } catch (const tformers::IoError& e) {
    PyErr_SetString(PyExc_OSError, e.what());
  } catch (const tformers::ResourceError& e) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const tformers::InvalidArgumentError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const tformers::FormatError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const tformers::UnsupportedError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const tformers::Error& e) {
    // DeviceError, InternalError.
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

tformers::PaddingStrategy padding_strategy(const std::string& name) {
  if (name == "do_not_pad") return tformers::PaddingStrategy::kDoNotPad;
  if (name == "longest") return tformers::PaddingStrategy::kLongest;
  if (name == "max_length") return tformers::PaddingStrategy::kMaxLength;
  throw tformers::InvalidArgumentError("padding='" + name +
                                       "' is not a padding strategy: use True or 'longest', "
                                       "'max_length', or False or 'do_not_pad'");
}

tformers::CausalLM load_model(const std::string& path, const std::optional<std::string>& dtype,
                              const std::string& device_map, const std::string& revision,
                              bool distributed, std::optional<int64_t> tp_size,
                              const std::map<std::string, std::string>& tp_plan,
                              std::optional<double> tp_timeout, const std::string& quantize,
                              const std::string& load_mode) {
  tformers::LoadOptions o;
  if (dtype) o.dtype = tformers::parse_dtype(*dtype);
  o.device_map = device_map;
  o.revision = revision;
  o.quantize = quantize;
  o.load_mode = load_mode;
  if (distributed)
    o.distributed_config = {.tp_size = tp_size, .tp_plan = tp_plan, .timeout = tp_timeout};
  nb::gil_scoped_release unlocked;
  return tformers::AutoModelForCausalLM::from_pretrained(path, o);
}

// A kernel mapping as Python holds it: layer -> device -> (repo id, major version, layer name).
using PyKernelMapping =
    std::map<std::string, std::map<std::string, std::tuple<std::string, int, std::string>>>;

PyKernelMapping default_kernel_mapping() {
  PyKernelMapping out;
  for (const auto& [layer, devices] : tformers::default_kernel_mapping())
    for (const auto& [device, r] : devices)
      out[layer][device] = {r.repo_id, r.version, r.layer_name};
  return out;
}

// tformers::kernelize; what it decided per layer as (layer, kernel, note).
std::vector<std::tuple<std::string, std::string, std::string>> kernelize(
    tformers::CausalLM& model, const PyKernelMapping& mapping, bool use_fallback,
    const std::map<std::string, std::string>& local_overrides, bool allow_unpinned,
    const std::string& lock_file) {
  tformers::KernelMapping m;
  for (const auto& [layer, devices] : mapping)
    for (const auto& [device, r] : devices)
      m[layer][device] = {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
  tformers::KernelizeOptions o;
  o.use_fallback = use_fallback;
  o.kernel_options.local_overrides = local_overrides;
  o.kernel_options.allow_unpinned = allow_unpinned;
  o.kernel_options.lock_file = lock_file;
  std::vector<std::tuple<std::string, std::string, std::string>> out;
  for (const tformers::KernelizedLayer& k : tformers::kernelize(model, m, o))
    out.emplace_back(k.layer, k.kernel, k.note);
  return out;
}

// Per-step rows × vocab arrays (GenerateOutput's scores or logits) as one float32 array (steps,
// rows, vocab), or None when they were not asked for.
nb::object steps_array(const std::vector<std::vector<float>>& steps, int64_t vocab_size) {
  if (steps.empty()) return nb::none();
  const size_t vocab = size_t(vocab_size), rows = steps[0].size() / vocab;
  auto* data = new std::vector<float>();
  data->reserve(steps.size() * rows * vocab);
  for (const auto& s : steps) data->insert(data->end(), s.begin(), s.end());
  nb::capsule owner(data, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return nb::cast(
      nb::ndarray<nb::numpy, float, nb::ndim<3>>(data->data(), {steps.size(), rows, vocab}, owner));
}

// generate(): `config_json` holds the call's GenerationConfig fields; `streamer`, when not None,
// is called as streamer(row, token_id) for each new token. Returns GenerateOutput's fields as a
// dict: sequences, sequences_scores (None without beam search), finish_reasons, and scores and
// logits (steps, rows, vocab), None unless output_scores / output_logits.
nb::dict generate(tformers::CausalLM& model, const Ids& input_ids, const std::string& config_json,
                  nb::object streamer, const tformers::Tokenizer* tokenizer,
                  tformers::CausalLM* assistant) {
  const auto config =
      tformers::GenerationConfig::from_json_string(config_json, "generate() arguments");
  const bool beams = model.generation_config().merged_with(config).num_beams.value_or(1) > 1;
  if (beams && !streamer.is_none())
    throw tformers::InvalidArgumentError(
        "generate(): a streamer cannot be used with beam search (num_beams > 1), whose tokens "
        "are final only at the end, as in Transformers; drop the streamer or set num_beams=1");
  bool failed = false;
  // Runs `f` with the GIL; a Python exception it raises stops generation (returns false). Once
  // one is pending nothing more runs, since Python code must not run over a set exception.
  auto with_python = [&](const auto& f) {
    if (failed) return false;
    nb::gil_scoped_acquire locked;
    try {
      f();
    } catch (nb::python_error& e) {
      e.restore();
      failed = true;
    }
    return !failed;
  };
  const tformers::StepCallback on_step = [&] {
    return with_python([] {
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    });
  };
  tformers::TokenCallback on_token;
  if (!streamer.is_none())
    on_token = [&](int64_t row, int32_t id) { return with_python([&] { streamer(row, id); }); };
  tformers::GenerateOutput out;
  {
    nb::gil_scoped_release unlocked;
    out = tformers::generate(model, input_ids, config, on_token, tokenizer, on_step, nullptr,
                             assistant);
  }
  if (failed) throw nb::python_error();
  nb::dict d;
  d["sequences"] = std::move(out.sequences);
  d["sequences_scores"] =
      beams ? nb::cast(std::move(out.sequences_scores)) : nb::object(nb::none());
  d["finish_reasons"] = std::move(out.finish_reasons);
  d["scores"] = steps_array(out.scores, model.config().vocab_size);
  d["logits"] = steps_array(out.logits, model.config().vocab_size);
  return d;
}

// One forward pass over a fresh cache of exactly the input's length: logits (B, T, V) float32 for
// every position, as Transformers' model(input_ids).logits.
nb::ndarray<nb::numpy, float, nb::ndim<3>> forward(tformers::CausalLM& model, IdArray input_ids,
                                                   std::optional<IdArray> attention_mask) {
  const int64_t batch = int64_t(input_ids.shape(0)), len = int64_t(input_ids.shape(1));
  if (batch == 0 || len == 0)
    throw tformers::InvalidArgumentError("forward(): input_ids has shape (" +
                                         std::to_string(batch) + ", " + std::to_string(len) +
                                         "); give at least one token in each of at least one row");
  if (attention_mask &&
      (int64_t(attention_mask->shape(0)) != batch || int64_t(attention_mask->shape(1)) != len))
    throw tformers::InvalidArgumentError("forward(): attention_mask must have input_ids' shape (" +
                                         std::to_string(batch) + ", " + std::to_string(len) +
                                         "), got (" + std::to_string(attention_mask->shape(0)) +
                                         ", " + std::to_string(attention_mask->shape(1)) + ")");
  const int64_t positions = model.config().max_position_embeddings;
  if (len > positions)
    throw tformers::InvalidArgumentError(
        "forward(): input_ids has " + std::to_string(len) + " tokens, more than the model's " +
        std::to_string(positions) + " positions (max_position_embeddings)");
  tformers::Tensor* logits = nullptr;
  {
    nb::gil_scoped_release unlocked;
    model.reset_cache(batch, len);
    tformers::ForwardArgs args;
    args.input_ids = tformers::Tensor::zeros({batch, len}, tformers::DType::i32);
    std::memcpy(args.input_ids.raw(), input_ids.data(), args.input_ids.nbytes());
    if (attention_mask) {
      // The mask covers cache slots; slots past the input stay 0 (empty).
      const int64_t slots = model.max_cache_len();
      args.attention_mask = tformers::Tensor::zeros({batch, slots}, tformers::DType::i32);
      for (int64_t b = 0; b < batch; ++b)
        std::memcpy(args.attention_mask.data<int32_t>() + b * slots,
                    attention_mask->data() + b * len, size_t(len) * sizeof(int32_t));
    }
    args.logits_to_keep = 0;
    logits = new tformers::Tensor(model.forward(args));
  }
  nb::capsule owner(logits, [](void* p) noexcept { delete static_cast<tformers::Tensor*>(p); });
  return {logits->data<float>(),
          {size_t(logits->dim(0)), size_t(logits->dim(1)), size_t(logits->dim(2))},
          owner};
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "The tformers C++ library; use the tformers package, which wraps it.";
  m.attr("__version__") = TFORMERS_VERSION;
  nb::register_exception_translator(translate_error);

  nb::class_<tformers::Tokenizer>(m, "Tokenizer",
                                  "A tokenizer.json with its tokenizer_config.json.")
      .def_static(
          "from_pretrained",
          [](const std::string& path, const std::string& revision) {
            nb::gil_scoped_release unlocked;
            return tformers::AutoTokenizer::from_pretrained(path, revision);
          },
          "path"_a, "revision"_a = "main", "Reads a model folder or a Hub id in the local cache.")
      .def("encode", &tformers::Tokenizer::encode, "text"_a, "add_special_tokens"_a = true,
           nb::call_guard<nb::gil_scoped_release>(), "Token ids of one text.")
      .def(
          "batch",
          [](const tformers::Tokenizer& t, const std::vector<std::string>& texts,
             bool add_special_tokens, const std::string& padding, bool truncation,
             std::optional<int64_t> max_length, std::optional<int64_t> pad_to_multiple_of,
             std::optional<std::string> padding_side) {
            tformers::CallOptions o{.add_special_tokens = add_special_tokens,
                                    .padding = padding_strategy(padding),
                                    .truncation = truncation,
                                    .max_length = max_length,
                                    .pad_to_multiple_of = pad_to_multiple_of,
                                    .padding_side = padding_side};
            tformers::BatchEncoding e;
            {
              nb::gil_scoped_release unlocked;
              e = t(texts, o);
            }
            return std::make_pair(std::move(e.input_ids), std::move(e.attention_mask));
          },
          "texts"_a, "add_special_tokens"_a, "padding"_a, "truncation"_a, "max_length"_a,
          "pad_to_multiple_of"_a, "padding_side"_a,
          "(input_ids, attention_mask) of a batch, as lists of rows.")
      .def("tokenize", &tformers::Tokenizer::tokenize, "text"_a, "add_special_tokens"_a = false)
      .def(
          "decode",
          [](const tformers::Tokenizer& t, const std::vector<int32_t>& ids,
             bool skip_special_tokens, std::optional<bool> clean_up) {
            return t.decode(ids, {skip_special_tokens, clean_up});
          },
          "ids"_a, "skip_special_tokens"_a = false, "clean_up_tokenization_spaces"_a = nb::none())
      .def(
          "batch_decode",
          [](const tformers::Tokenizer& t, const Ids& ids, bool skip_special_tokens,
             std::optional<bool> clean_up) {
            nb::gil_scoped_release unlocked;
            return t.batch_decode(ids, {skip_special_tokens, clean_up});
          },
          "ids"_a, "skip_special_tokens"_a = false, "clean_up_tokenization_spaces"_a = nb::none())
      .def(
          "apply_chat_template",
          [](const tformers::Tokenizer& t, const std::string& messages_json,
             bool add_generation_prompt, const std::string& tools_json,
             const std::string& extra_json, const std::string& chat_template) {
            using nlohmann::ordered_json;
            return t.apply_chat_template(ordered_json::parse(messages_json), add_generation_prompt,
                                         ordered_json::parse(tools_json),
                                         ordered_json::parse(extra_json), chat_template);
          },
          "messages_json"_a, "add_generation_prompt"_a, "tools_json"_a, "extra_json"_a,
          "chat_template"_a, "The rendered chat template; arguments as JSON text.")
      .def("token_to_id", &tformers::Tokenizer::token_to_id, "token"_a)
      .def("id_to_token", &tformers::Tokenizer::id_to_token, "id"_a)
      .def(
          "convert_ids_to_tokens",
          [](const tformers::Tokenizer& t, const std::vector<int32_t>& ids) {
            return t.convert_ids_to_tokens(ids);
          },
          "ids"_a)
      .def("is_special_id", &tformers::Tokenizer::is_special_id, "id"_a)
      .def("__len__", &tformers::Tokenizer::vocab_size)
      .def_prop_ro("bos_token", &tformers::Tokenizer::bos_token)
      .def_prop_ro("eos_token", &tformers::Tokenizer::eos_token)
      .def_prop_ro("unk_token", &tformers::Tokenizer::unk_token)
      .def_prop_ro("bos_token_id", &tformers::Tokenizer::bos_token_id)
      .def_prop_ro("eos_token_id", &tformers::Tokenizer::eos_token_id)
      .def_prop_ro("unk_token_id", &tformers::Tokenizer::unk_token_id)
      .def_prop_rw("pad_token", &tformers::Tokenizer::pad_token,
                   &tformers::Tokenizer::set_pad_token)
      .def_prop_ro("pad_token_id", &tformers::Tokenizer::pad_token_id)
      .def_prop_ro("model_max_length", &tformers::Tokenizer::model_max_length)
      .def_prop_rw("padding_side", &tformers::Tokenizer::padding_side,
                   &tformers::Tokenizer::set_padding_side)
      .def_prop_ro("chat_template", &tformers::Tokenizer::chat_template)
      .def_prop_ro("folder", &tformers::Tokenizer::folder)
      .def(
          "token_bytes",
          [](const tformers::Tokenizer& t, int32_t id) -> std::optional<nb::bytes> {
            const std::optional<std::string> b = t.token_bytes(id);
            if (!b) return std::nullopt;
            return nb::bytes(b->data(), b->size());
          },
          "id"_a, "The bytes a vocabulary token stands for; None for added tokens.")
      .def("encode_pair", &tformers::Tokenizer::encode_pair, "text"_a, "pair"_a,
           "add_special_tokens"_a = true, nb::call_guard<nb::gil_scoped_release>(),
           "Token ids of a text and its pair, with the post-processor's pair template.")
      .def_prop_ro(
          "config_json", [](const tformers::Tokenizer& t) { return t.config().dump(); },
          "tokenizer_config.json as read, as JSON text.");

  nb::class_<tformers::TokenStreamer>(m, "TokenStreamer",
                                      "Incremental decoding: text that became final per id.")
      .def(nb::init<const tformers::Tokenizer&, bool>(), "tokenizer"_a,
           "skip_special_tokens"_a = false, nb::keep_alive<1, 2>())
      .def("put", &tformers::TokenStreamer::put, "id"_a)
      .def("end", &tformers::TokenStreamer::end);

  nb::class_<tformers::CausalLM>(m, "CausalLM", "A causal LM loaded from a checkpoint folder.")
      .def_static("from_pretrained", &load_model, "path"_a, "dtype"_a, "device_map"_a, "revision"_a,
                  "distributed"_a, "tp_size"_a, "tp_plan"_a, "tp_timeout"_a, "quantize"_a,
                  "load_mode"_a)
      .def("generate", &generate, "input_ids"_a, "config_json"_a, "streamer"_a.none(),
           "tokenizer"_a.none(), "assistant"_a.none() = nb::none(),
           "Prompts (rows of any lengths) followed by their new tokens, with scores, as a dict.")
      .def("forward", &forward, "input_ids"_a, "attention_mask"_a = nb::none(),
           "Logits (B, T, V) of every position of a fresh cache.")
      .def_prop_ro("config_json",
                   [](const tformers::CausalLM& c) { return c.config().json.dump(); })
      .def_prop_ro("device", &tformers::CausalLM::device)
      .def_prop_ro("folder", &tformers::CausalLM::folder)
      .def_prop_ro(
          "dtype",
          [](const tformers::CausalLM& c) { return std::string(tformers::dtype_name(c.dtype())); })
      .def_prop_ro("max_position_embeddings",
                   [](const tformers::CausalLM& c) { return c.config().max_position_embeddings; })
      .def_prop_ro("vocab_size", [](const tformers::CausalLM& c) { return c.config().vocab_size; });

  m.def("supported_architectures", &tformers::supported_architectures);
  m.def("default_kernel_mapping", &default_kernel_mapping);
  m.def("kernelize", &kernelize, "model"_a, "mapping"_a, "use_fallback"_a, "local_overrides"_a,
        "allow_unpinned"_a, "lock_file"_a);
  m.def("accelerator_is_available", &tformers::accelerator::is_available);
  m.def("accelerator_device_count", &tformers::accelerator::device_count);
  m.def("current_accelerator", &tformers::accelerator::current_accelerator);
  m.def("set_python_site_packages", &tformers::accelerator::set_python_site_packages, "dirs"_a,
        "Where PJRT plugin packages are looked for first: this interpreter's site-packages.");
  m.def("world_rank", &tformers::distributed::world_rank);
  m.def("world_size", &tformers::distributed::world_size);
  m.def("is_main_process", &tformers::distributed::is_main_process);
}
