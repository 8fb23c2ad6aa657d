#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` for bench/peer_serve.sh into build/peers/llama.cpp/bin/, from
# the llama.cpp that the llama-cpp-python sdist pinned in pyproject.toml (group `peer-llama-cpp`)
# carries: PyPI is where this project's Python-side pins come from, and that sdist holds the whole
# llama.cpp tree at a known commit. The sdist is fetched from the package index ($PIP_INDEX_URL,
# else PyPI's simple index) and checked against the sha256 the index gives for it. A native build
# (-DGGML_NATIVE=ON), as llama.cpp's users build it: the peer at its best on this machine.
#   tools/peer/build_llama_server.sh        (scripts/setup.sh --peers runs it)
set -euo pipefail
cd "$(dirname "$0")/../.."

pin=$(python3 -c 'import tomllib
print(tomllib.load(open("pyproject.toml", "rb"))["dependency-groups"]["peer-llama-cpp"][0])')
name=${pin%%==*} version=${pin##*==}
[ "$name" != "$pin" ] || { echo "$0: pyproject.toml pins '$pin', not NAME==VERSION" >&2; exit 1; }
out=build/peers
server=$out/llama.cpp/bin/llama-server
if [ -x "$server" ] && [ -f "$out/llama.cpp/.pin" ] && [ "$(cat "$out/llama.cpp/.pin")" = "$pin" ]; then
  echo "llama-server of $pin: $server"
  exit 0
fi
mkdir -p "$out"

# The sdist's link on the simple index page ends in #sha256=HEX (PEP 503).
index=${PIP_INDEX_URL:-https://pypi.org/simple}
file=${name//-/_}-$version.tar.gz
link=$(curl -fsSL "${index%/}/$name/" | grep -o "href=\"[^\"]*/$file#sha256=[0-9a-f]*\"" | head -1 |
       sed 's/^href="//; s/"$//' || true)
[ -n "$link" ] || { echo "$0: no $file on $index/$name/" >&2; exit 1; }
case "$link" in
  http*) url=${link%%#*} ;;
  *) echo "$0: relative link $link on $index: not supported" >&2; exit 1 ;;
esac
sha=${link##*#sha256=}
curl -fsSL -o "$out/$file" "$url"
echo "$sha  $out/$file" | sha256sum -c --quiet - ||
  { echo "$0: $file does not match the index's sha256 $sha" >&2; exit 1; }

rm -rf "$out/src"
mkdir -p "$out/src"
tar -xzf "$out/$file" -C "$out/src" --strip-components 1
cmake -S "$out/src/vendor/llama.cpp" -B "$out/llama.cpp" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$out/llama.cpp" --target llama-server
echo "$pin" >"$out/llama.cpp/.pin"
echo "llama-server of $pin: $server"
