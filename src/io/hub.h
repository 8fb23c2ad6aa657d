// Model id resolution, as Transformers does offline: a local folder, or a Hub id ("org/name")
// found in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)
// under models--org--name/snapshots/<revision>, where the revision comes from refs/<name>
// ("main" unless given). A model that is not found is a NotFoundError listing every place looked.
#pragma once

#include <string>

namespace tformers::io {

std::string resolve_model_path(const std::string& id_or_path, const std::string& revision = "main");

}  // namespace tformers::io
