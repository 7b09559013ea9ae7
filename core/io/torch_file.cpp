#include "core/io/torch_file.h"

#include <zip.h>

#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/io/atomic_io.h"

namespace moh {

namespace fs = std::filesystem;

namespace {

using pickle::Kind;
using pickle::make;
using pickle::PendingTensor;

// ---- zip container ----

class ZipArchive {
 public:
  ZipArchive(const std::string& bytes, std::string origin) : origin_(std::move(origin)), size_(bytes.size()) {
    zip_error_t err;
    zip_error_init(&err);
    zip_source_t* src = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &err);
    if (src) z_ = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (!z_) {
      std::string why = zip_error_strerror(&err);
      if (src) zip_source_free(src);
      zip_error_fini(&err);
      throw UserError(origin_, "not a readable zip archive: " + why, "truncated or corrupt torch.save file");
    }
    zip_error_fini(&err);
  }
  ~ZipArchive() { zip_discard(z_); }
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    const zip_int64_t n = zip_get_num_entries(z_, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const char* s = zip_get_name(z_, static_cast<zip_uint64_t>(i), 0);
      if (s) out.emplace_back(s);
    }
    return out;
  }
  bool has(const std::string& name) const { return zip_name_locate(z_, name.c_str(), 0) >= 0; }

  at::Tensor read(const std::string& name) const {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat(z_, name.c_str(), 0, &st) != 0)
      throw UserError(origin_, "archive has no entry '" + name + "'", "truncated file?");
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || st.comp_size > size_ ||
        st.size > 1100 * st.comp_size + 4096)
      throw UserError(origin_, "entry '" + name + "' has an impossible size", "corrupt archive");
    zip_file_t* f = zip_fopen(z_, name.c_str(), 0);
    if (!f) throw UserError(origin_, "cannot open entry '" + name + "': " + zip_strerror(z_), "corrupt archive");
    at::Tensor out = at::empty({static_cast<int64_t>(st.size)}, at::kByte);
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    zip_uint64_t got = 0;
    while (got < st.size) {
      zip_int64_t r = zip_fread(f, dst + got, st.size - got);
      if (r <= 0) {
        std::string why = r < 0 ? zip_file_strerror(f) : "entry shorter than recorded";
        zip_fclose(f);
        throw UserError(origin_, "cannot read entry '" + name + "': " + why, "corrupt archive");
      }
      got += static_cast<zip_uint64_t>(r);
    }
    // Reading past the end makes libzip verify the entry's CRC-32.
    uint8_t extra;
    zip_int64_t r = zip_fread(f, &extra, 1);
    std::string why = r < 0 ? zip_file_strerror(f) : "";
    int rc = zip_fclose(f);
    if (r != 0 || rc != 0)
      throw UserError(origin_, "entry '" + name + "' is corrupt" + (why.empty() ? "" : ": " + why),
                      "CRC mismatch: damaged file");
    return out;
  }

 private:
  std::string origin_;
  size_t size_;
  zip_t* z_ = nullptr;
};

TorchFile parse_zip(const std::string& bytes, const std::string& origin) {
  ZipArchive zip(bytes, origin);
  std::string prefix;
  for (const std::string& n : zip.names()) {
    const size_t slash = n.find('/');
    if (slash != std::string::npos && n.compare(slash, std::string::npos, "/data.pkl") == 0) {
      prefix = n.substr(0, slash + 1);
      break;
    }
  }
  if (prefix.empty()) throw UserError(origin, "zip archive without */data.pkl", "not a torch.save file");
  if (zip.has(prefix + "byteorder")) {
    at::Tensor bo = zip.read(prefix + "byteorder");
    std::string order(static_cast<const char*>(bo.data_ptr()), static_cast<size_t>(bo.numel()));
    if (order != "little")
      throw UserError(origin, "byte order '" + order + "' is not supported", "re-save on a little-endian machine");
  }
  at::Tensor pkl = zip.read(prefix + "data.pkl");
  std::map<std::string, PyRef> storages;
  std::vector<PendingTensor> tensors;
  auto persistent = [&](const PyRef& pid) -> PyRef {
    // ('storage', storage_type, key, location, numel)
    if (pid->kind != Kind::tuple || pid->items.size() < 5 || pid->items[0]->kind != Kind::string ||
        pid->items[0]->text != "storage" || pid->items[1]->kind != Kind::global || pid->items[2]->kind != Kind::string)
      throw UserError(origin, "unsupported persistent id " + pid->describe(), "not a torch.save storage reference");
    const std::string& key = pid->items[2]->text;
    auto it = storages.find(key);
    if (it != storages.end()) return it->second;
    if (key.empty() || key.find('/') != std::string::npos || key.find("..") != std::string::npos)
      throw UserError(origin, "malformed storage key '" + key + "'", "corrupt file");
    PyRef s =
        pickle::make_storage(zip.read(prefix + "data/" + key), pickle::storage_dtype(pid->items[1]->text, origin));
    storages[key] = s;
    return s;
  };
  const auto* data = static_cast<const uint8_t*>(pkl.data_ptr());
  size_t end = 0;
  TorchFile out{
      pickle::unpickle(data, static_cast<size_t>(pkl.numel()), 0, origin + " data.pkl", persistent, tensors, end),
      "zip"};
  pickle::materialize(tensors, origin);
  return out;
}

// ---- legacy container ----

TorchFile parse_legacy(const std::string& bytes, const std::string& origin) {
  const auto* d = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  std::vector<PendingTensor> tensors;
  struct Root {
    PyRef storage;
    at::ScalarType dtype;
    int64_t numel;
  };
  std::map<std::string, Root> roots;
  struct View {
    PyRef storage;
    std::string root;
    int64_t offset, size;
  };
  std::vector<View> views;

  size_t p = 0;  // read position: five pickles, then the raw storages
  PyRef m = pickle::unpickle(d, n, p, origin, nullptr, tensors, p);
  static const std::string kMagic("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);  // 0x1950a86a20f9469cfc6c
  if (m->kind != Kind::big_integer || m->text != kMagic)
    throw UserError(origin, "not a torch.save file (legacy magic number missing)",
                    "expected a .pt/.pth written by torch.save");
  PyRef version = pickle::unpickle(d, n, p, origin, nullptr, tensors, p);
  if (version->kind != Kind::integer || version->integer != 1001)
    throw UserError(origin, "unsupported legacy protocol version", "re-save with a recent torch.save");
  PyRef info = pickle::unpickle(d, n, p, origin, nullptr, tensors, p);
  if (info->kind == Kind::dict) {
    PyRef le = info->get("little_endian");
    if (le && le->kind == Kind::boolean && !le->boolean)
      throw UserError(origin, "big-endian file", "re-save on a little-endian machine");
  }
  auto persistent = [&](const PyRef& pid) -> PyRef {
    // ('storage', storage_type, root_key, location, numel, view_metadata)
    if (pid->kind != Kind::tuple || pid->items.size() < 6 || pid->items[0]->kind != Kind::string ||
        pid->items[0]->text != "storage" || pid->items[1]->kind != Kind::global ||
        pid->items[2]->kind != Kind::string || pid->items[4]->kind != Kind::integer)
      throw UserError(origin, "unsupported persistent id " + pid->describe(), "not a torch.save storage reference");
    const std::string& key = pid->items[2]->text;
    const at::ScalarType dtype = pickle::storage_dtype(pid->items[1]->text, origin);
    auto it = roots.find(key);
    if (it == roots.end()) it = roots.emplace(key, Root{make(Kind::storage), dtype, pid->items[4]->integer}).first;
    it->second.storage->dtype = it->second.dtype;
    const PyRef& view = pid->items[5];
    if (view->kind == Kind::none) return it->second.storage;
    if (view->kind != Kind::tuple || view->items.size() != 3 || view->items[1]->kind != Kind::integer ||
        view->items[2]->kind != Kind::integer)
      throw UserError(origin, "malformed storage view", "corrupt file");
    PyRef s = make(Kind::storage);
    s->dtype = dtype;
    views.push_back({s, key, view->items[1]->integer, view->items[2]->integer});
    return s;
  };
  TorchFile out{pickle::unpickle(d, n, p, origin, persistent, tensors, p), "legacy"};
  PyRef keys = pickle::unpickle(d, n, p, origin, nullptr, tensors, p);
  if (keys->kind != Kind::list) throw UserError(origin, "storage key list missing", "truncated file?");
  for (const PyRef& k : keys->items) {
    if (k->kind != Kind::string) throw UserError(origin, "storage key is " + k->describe(), "corrupt file");
    auto it = roots.find(k->text);
    if (it == roots.end()) throw UserError(origin, "storage '" + k->text + "' is not referenced", "corrupt file");
    if (n - p < 8) throw UserError(origin, "storage '" + k->text + "' is cut off", "truncated file");
    uint64_t count = 0;
    for (int i = 0; i < 8; ++i) count |= uint64_t(d[p + i]) << (8 * i);
    p += 8;
    const uint64_t es = c10::elementSize(it->second.dtype);
    if (count > (n - p) / es)
      throw UserError(origin, "storage '" + k->text + "' runs past the end of the file", "truncated file");
    PyRef fresh = pickle::make_storage(pickle::bytes_tensor(d + p, count * es), it->second.dtype);
    it->second.storage->tensor = fresh->tensor;
    p += count * es;
  }
  for (View& v : views) {
    const PyValue& root = *roots.at(v.root).storage;
    if (!root.tensor.defined()) continue;  // reported by materialize
    const int64_t es = static_cast<int64_t>(c10::elementSize(root.dtype));
    const int64_t count = root.tensor.numel() / es;
    if (v.offset < 0 || v.size < 0 || v.offset > count || v.size > count - v.offset)
      throw UserError(origin, "storage view outside its storage", "corrupt file");
    v.storage->tensor = root.tensor.narrow(0, v.offset * es, v.size * es).clone();
  }
  pickle::materialize(tensors, origin);
  return out;
}

}  // namespace

bool looks_like_torch_file(const std::string& bytes) {
  return (bytes.size() >= 4 && bytes.compare(0, 4, "PK\x03\x04") == 0) ||
         (bytes.size() >= 2 && uint8_t(bytes[0]) == 0x80 && uint8_t(bytes[1]) <= 5);
}

TorchFile parse_torch_file(const std::string& bytes, const std::string& origin) {
  if (bytes.size() >= 4 && bytes.compare(0, 4, "PK\x03\x04") == 0) return parse_zip(bytes, origin);
  if (bytes.size() >= 2 && uint8_t(bytes[0]) == 0x80) return parse_legacy(bytes, origin);
  if (bytes.size() > 262 && bytes.compare(257, 5, "ustar") == 0)
    throw UserError(origin, "tar-format torch file (PyTorch < 0.4)", "re-save it with a recent torch.save");
  throw UserError(origin, "not a torch.save file (neither a zip archive nor a pickle)",
                  "expected a .pt/.pth/.bin written by torch.save");
}

TorchFile load_torch_file(const std::string& path) {
  if (!fs::exists(path)) throw UserError(path, "no such file", "check the path");
  return parse_torch_file(read_file(path), path);
}

TensorMap torch_state_dict(const TorchFile& file, const std::string& key, const std::string& origin) {
  PyRef node = file.root;
  auto keys_of = [](const PyRef& d) {
    std::vector<std::string> ks;
    for (const auto& [k, v] : d->entries)
      if (k && k->kind == Kind::string) ks.push_back(k->text);
    return ks;
  };
  auto all_tensors = [](const PyRef& d) {
    if (d->kind != Kind::dict || d->entries.empty()) return false;
    for (const auto& [k, v] : d->entries)
      if (!v || v->kind != Kind::tensor) return false;
    return true;
  };
  if (!key.empty()) {
    size_t start = 0;
    while (start <= key.size()) {
      const size_t dot = key.find('.', start);
      const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (node->kind != Kind::dict && node->kind != Kind::object)
        throw UserError(origin, "key '" + part + "' asked of a " + node->describe(),
                        "check --weights-key / model.weights_key");
      PyRef next = node->get(part);
      if (!next && node->kind == Kind::object && node->state && node->state->kind == Kind::dict)
        next = node->state->get(part);
      if (!next) throw UserError(origin, "no entry '" + part + "'", "entries: " + join(keys_of(node)));
      node = next;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
  } else if (!all_tensors(node)) {
    if (node->kind == Kind::dict)
      throw UserError(origin, "holds a nested checkpoint, not a state_dict",
                      "choose an entry with --weights-key / model.weights_key: " + join(keys_of(node)));
    throw UserError(origin, "holds a " + node->describe() + ", not a state_dict", "save model.state_dict() instead");
  }
  if (node->kind != Kind::dict)
    throw UserError(origin, "entry '" + key + "' is a " + node->describe(), "not a state_dict");
  TensorMap out;
  for (const auto& [k, v] : node->entries) {
    if (!k || k->kind != Kind::string)
      throw UserError(origin, "state_dict key is a " + (k ? k->describe() : "null"), "not a state_dict");
    if (!v || v->kind != Kind::tensor)
      throw UserError(origin, "entry '" + k->text + "' is a " + (v ? v->describe() : "null"),
                      "not a state_dict of tensors");
    out[k->text] = v->tensor;
  }
  bool all_module = !out.empty();
  for (const auto& [k, v] : out) all_module = all_module && k.rfind("module.", 0) == 0;
  if (all_module) {
    TensorMap stripped;
    for (auto& [k, v] : out) stripped[k.substr(7)] = v;
    out.swap(stripped);
  }
  return out;
}

TensorMap load_weights_file(const std::string& path, const std::string& key) {
  if (fs::is_directory(path)) throw UserError(path, "is a directory", "give a .safetensors or torch.save file");
  if (!fs::exists(path)) throw UserError(path, "no such file", "check the path");
  if (path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0) {
    if (!key.empty())
      throw UserError(path, "a weights key applies to nested torch.save checkpoints", "drop the key for .safetensors");
    return load_safetensors(path).tensors;
  }
  std::string bytes = read_file(path);
  if (!looks_like_torch_file(bytes)) {
    // A safetensors file with another extension still loads.
    if (bytes.size() >= 9 && bytes[8] == '{' && key.empty())
      return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path).tensors;
  }
  return torch_state_dict(parse_torch_file(bytes, path), key, path);
}

}  // namespace moh
