// `moh export-images --images SOURCE --out DIR`: writes a labelled image source (e.g. fashion_mnist:train) as an
// ImageFolder split DIR/<NN>_<class>/<index>.png, so the same data can be trained through data.dataset: image_folder.
#include <iostream>

#include "apps/cli.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/io/atomic_io.h"
#include "datasets/image_folder.h"
#include "datasets/image_source.h"

namespace moh::apps {

int cmd_export_images(int argc, char** argv) {
  cxxopts::Options opts(argv[0], "Write labelled images as an ImageFolder split (<out>/<NN>_<class>/<index>.png)");
  auto flag = opts.add_options();
  flag("images", "labelled source: fashion_mnist:train|test[:N] or an .npz with arr_1 labels",
       cxxopts::value<std::string>());
  flag("out", "split directory to create, e.g. fm_tree/train", cxxopts::value<std::string>());
  flag("format", "png (lossless) or jpg (quality 95, as ImageNet's files)",
       cxxopts::value<std::string>()->default_value("png"));
  flag("h,help", "show this help");
  auto args = parse_or_throw(opts, argc, argv);
  if (print_help_if_asked(opts, args)) return 0;
  for (const char* required : {"images", "out"})
    if (!args.count(required)) throw UserError(argv[0], std::string("missing --") + required, "see --help");
  const std::string spec = args["images"].as<std::string>(), out = args["out"].as<std::string>();
  const std::string format = args["format"].as<std::string>();
  if (format != "png" && format != "jpg") throw UserError("--format " + format, "unknown image format", "png or jpg");
  check_output_dir(out, "--out " + out);
  auto source = datasets::open_image_source(spec);
  if (!source->has_labels())
    throw UserError("--images " + spec, "has no labels", "an ImageFolder needs one class per image");
  std::vector<at::Tensor> images, labels;
  for (datasets::ImageBlock b; source->next(4096, b);) images.push_back(b.images), labels.push_back(b.labels);
  datasets::ImageSet set{at::cat(images), at::cat(labels)};
  if (set.images.size(3) == 1) set.images = set.images.squeeze(3);
  const int64_t classes = set.labels.max().item<int64_t>() + 1;
  const bool fm = spec.rfind("fashion_mnist:", 0) == 0;
  std::vector<std::string> names;
  for (int64_t k = 0; k < classes; ++k) {
    std::string n = fm ? datasets::fashion_mnist_classes()[static_cast<size_t>(k)] : "class" + std::to_string(k);
    for (char& c : n)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    char prefix[32];
    std::snprintf(prefix, sizeof prefix, "%0*lld_", classes > 100 ? 4 : 2,
                  static_cast<long long>(k));  // sorted = label order
    names.push_back(prefix + n);
  }
  datasets::write_image_folder(out, set, names, format);
  std::cout << "wrote " << set.size() << " images in " << classes << " class folders under " << out << "\n";
  return 0;
}

}  // namespace moh::apps
