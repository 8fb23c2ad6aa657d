// `tformers serve`: an OpenAI-compatible HTTP server (serve/http.h) over ServingEngine.
//
//   POST /v1/chat/completions, POST /v1/completions   streamed (SSE) or not
//   GET /v1/models, GET /health, GET /metrics
//
// The HTTP layer reads each request whole on its event loop and hands it to a worker thread,
// which submits it to the engine and waits for its events, queued by the engine's callback.
// SIGTERM or SIGINT stops admitting requests, lets the running ones finish for
// --shutdown-timeout seconds, stops the listener and exits 0.
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
