// Where tformers keeps files between runs.
#pragma once

#include <string>

namespace tformers {

// $XDG_CACHE_HOME/tformers/<sub>, else $HOME/.cache/tformers/<sub>, as the XDG base directory
// specification places a user's caches; empty when neither variable is set.
std::string user_cache_dir(const std::string& sub);

}  // namespace tformers
