// The README's C++ example, with the model folder from the command line.
#include <iostream>

#include "tformers/model.h"
#include "tformers/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: readme_example MODEL_DIR\n";
    return 2;
  }
  try {
    auto tok = tformers::AutoTokenizer::from_pretrained(argv[1]);
    auto model = tformers::AutoModelForCausalLM::from_pretrained(
        argv[1], {.dtype = tformers::bfloat16, .device_map = "auto"});
    auto ids = tok.encode("The French Bread Law states");  // stays on the host
    auto out = model.generate({ids}, {.max_new_tokens = 50, .do_sample = true, .seed = 0},
                              /*on_token=*/{}, &tok);
    std::cout << tok.decode(out[0], {.skip_special_tokens = true}) << "\n";
  } catch (const tformers::Error& e) {  // model.h is enough to catch tformers errors
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
