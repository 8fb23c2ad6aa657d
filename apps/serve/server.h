// `tformers serve`: an OpenAI-compatible HTTP server (cpp-httplib) over ServingEngine.
//
//   POST /v1/chat/completions, POST /v1/completions   streamed (SSE) or not
//   GET /v1/models, GET /health, GET /metrics
//
// Each connection has a thread; a request's thread submits it to the engine and waits for its
// events, which the engine's callback queues. SIGTERM or SIGINT stops admitting requests, lets
// the running ones finish for --shutdown-timeout seconds, stops the listener and exits 0.
#pragma once

#include <functional>

#include "cli.h"
#include "tformers/model.h"

namespace tformers::serve {

// Loads the model named by the arguments (the CLI's loader, so flags mean what they mean for
// generate).
using ModelLoader = std::function<CausalLM(const cli::ServeArgs&)>;

// Serves until SIGTERM or SIGINT; returns the exit status.
int run_serve(const cli::ServeArgs& args, const ModelLoader& load_model);

}  // namespace tformers::serve
