#include "core/torch_file.h"

#include <zip.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <unordered_map>

#include "core/atomic_io.h"
#include "core/error.h"

namespace moh {

namespace fs = std::filesystem;

PyValue::~PyValue() {
  // Children whose last owner is being destroyed are emptied here, in a loop, before they die: no recursion.
  std::vector<PyRef> pending;
  auto take = [&pending](PyValue& v) {
    for (auto& i : v.items) pending.push_back(std::move(i));
    for (auto& [k, x] : v.entries) pending.push_back(std::move(k)), pending.push_back(std::move(x));
    if (v.state) pending.push_back(std::move(v.state));
    v.items.clear();
    v.entries.clear();
  };
  take(*this);
  while (!pending.empty()) {
    PyRef p = std::move(pending.back());
    pending.pop_back();
    if (p && p.use_count() == 1) take(*p);
  }
}

PyRef PyValue::get(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k && k->kind == Kind::string && k->text == key) return v;
  return nullptr;
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return boolean ? "True" : "False";
    case Kind::integer: return "int " + std::to_string(integer);
    case Kind::big_integer: return "int (" + std::to_string(text.size()) + " bytes)";
    case Kind::floating: return "float " + std::to_string(floating);
    case Kind::string: return "str '" + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + "'";
    case Kind::bytes: return "bytes (" + std::to_string(text.size()) + ")";
    case Kind::list: return "list of " + std::to_string(items.size());
    case Kind::tuple: return "tuple of " + std::to_string(items.size());
    case Kind::set: return "set of " + std::to_string(items.size());
    case Kind::dict: return "dict with " + std::to_string(entries.size()) + " keys";
    case Kind::tensor:
      return tensor.defined() ? "tensor " + std::string(c10::toString(tensor.scalar_type())) + " " + c10::str(tensor.sizes())
                              : "tensor";
    case Kind::storage: return "storage";
    case Kind::global: return "class " + text;
    case Kind::object: return "object " + text;
  }
  return "?";
}

namespace {

using Kind = PyValue::Kind;

PyRef make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

/// A tensor whose storage bytes may arrive later (legacy format): rebuilt once every storage is read.
struct PendingTensor {
  PyRef value, storage;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
};

/// Element type of a torch storage class ("torch.FloatStorage", ...).
at::ScalarType storage_dtype(const std::string& name, const std::string& origin) {
  static const std::map<std::string, at::ScalarType> table = {
      {"torch.FloatStorage", at::kFloat},     {"torch.DoubleStorage", at::kDouble}, {"torch.HalfStorage", at::kHalf},
      {"torch.BFloat16Storage", at::kBFloat16}, {"torch.LongStorage", at::kLong},   {"torch.IntStorage", at::kInt},
      {"torch.ShortStorage", at::kShort},     {"torch.CharStorage", at::kChar},     {"torch.ByteStorage", at::kByte},
      {"torch.BoolStorage", at::kBool},       {"torch.UntypedStorage", at::kByte},
      {"torch.ComplexFloatStorage", at::kComplexFloat}, {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  auto it = table.find(name);
  if (it == table.end()) throw UserError(origin, "unsupported storage type '" + name + "'", "re-save with a standard dtype");
  return it->second;
}

/// The pickle virtual machine (protocols 0-5, the opcodes checkpoints use).
class Unpickler {
 public:
  using PersistentLoad = std::function<PyRef(const PyRef&)>;
  Unpickler(const uint8_t* data, size_t size, size_t start, std::string origin, PersistentLoad persistent,
            std::vector<PendingTensor>* tensors)
      : d_(data), n_(size), p_(start), origin_(std::move(origin)), persistent_(std::move(persistent)), tensors_(tensors) {}

  PyRef run();
  size_t position() const { return p_; }

 private:
  [[noreturn]] void fail(const std::string& why, const std::string& hint = "not a valid torch.save file, or truncated") const {
    throw UserError(origin_, why + " (pickle byte " + std::to_string(p_) + ")", hint);
  }
  void need(size_t k) const {
    if (k > n_ - p_) fail("unexpected end of data");
  }
  uint64_t read_le(size_t k) {
    need(k);
    uint64_t v = 0;
    for (size_t i = 0; i < k; ++i) v |= uint64_t(d_[p_ + i]) << (8 * i);
    p_ += k;
    return v;
  }
  std::string read_bytes(uint64_t k) {
    if (k > n_ - p_) fail("length " + std::to_string(k) + " runs past the end of the data");
    std::string s(reinterpret_cast<const char*>(d_ + p_), k);
    p_ += k;
    return s;
  }
  std::string read_line() {
    const void* nl = std::memchr(d_ + p_, '\n', n_ - p_);
    if (!nl) fail("unterminated text argument");
    size_t len = static_cast<const uint8_t*>(nl) - (d_ + p_);
    std::string s(reinterpret_cast<const char*>(d_ + p_), len);
    p_ += len + 1;
    return s;
  }
  PyRef pop() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    PyRef v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  PyRef& top() {
    if (stack_.size() <= floor()) fail("pickle stack underflow");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  std::vector<PyRef> pop_mark() {
    if (marks_.empty()) fail("pickle MARK missing");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> out(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(m)),
                           std::make_move_iterator(stack_.end()));
    stack_.resize(m);
    return out;
  }
  void push(PyRef v) { stack_.push_back(std::move(v)); }
  PyRef memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("pickle memo key " + std::to_string(key) + " was never stored");
    return it->second;
  }
  void memo_put(uint64_t key) {
    if (memo_.size() > (n_ + 16)) fail("pickle memo larger than the file");
    memo_[key] = top();
  }

  PyRef make_int(int64_t v) {
    PyRef r = make(Kind::integer);
    r->integer = v;
    return r;
  }
  PyRef make_long(const std::string& le);
  PyRef make_string(std::string s, Kind k = Kind::string) {
    PyRef r = make(k);
    r->text = std::move(s);
    return r;
  }
  int64_t as_int(const PyRef& v, const char* what) const {
    if (!v || (v->kind != Kind::integer && v->kind != Kind::boolean)) fail(std::string(what) + " is not an int");
    return v->kind == Kind::boolean ? v->boolean : v->integer;
  }
  std::vector<int64_t> as_int_tuple(const PyRef& v, const char* what) const {
    if (!v || (v->kind != Kind::tuple && v->kind != Kind::list)) fail(std::string(what) + " is not a tuple");
    if (v->items.size() > 64) fail(std::string(what) + " has too many dimensions");
    std::vector<int64_t> out;
    for (const auto& i : v->items) out.push_back(as_int(i, what));
    return out;
  }
  PyRef call(const PyRef& callable, const std::vector<PyRef>& args, int depth = 0);
  PyRef rebuild_tensor(const std::vector<PyRef>& args);
  void set_item(const PyRef& target, PyRef key, PyRef value) {
    if (target->kind != Kind::dict && target->kind != Kind::object) fail("SETITEM on " + target->describe());
    target->entries.emplace_back(std::move(key), std::move(value));
  }
  void append(const PyRef& target, std::vector<PyRef> values) {
    if (target->kind != Kind::list && target->kind != Kind::set && target->kind != Kind::object)
      fail("APPEND on " + target->describe());
    for (auto& v : values) target->items.push_back(std::move(v));
  }

  const uint8_t* d_;
  size_t n_, p_;
  std::string origin_;
  PersistentLoad persistent_;
  std::vector<PendingTensor>* tensors_;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PyRef> memo_;
};

PyRef Unpickler::make_long(const std::string& le) {
  if (le.empty()) return make_int(0);
  if (le.size() <= 8) {
    uint64_t u = 0;
    for (size_t i = 0; i < le.size(); ++i) u |= uint64_t(uint8_t(le[i])) << (8 * i);
    if (le.size() < 8 && (uint8_t(le.back()) & 0x80)) u |= ~uint64_t(0) << (8 * le.size());  // sign-extend
    return make_int(static_cast<int64_t>(u));
  }
  return make_string(le, Kind::big_integer);
}

// UTF-8 → Latin-1 bytes (how protocol 2 stores Python 3 `bytes`: _codecs.encode(str, 'latin1')).
std::string utf8_to_latin1(const std::string& s, bool& ok) {
  std::string out;
  ok = true;
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = uint8_t(s[i]);
    if (c < 0x80) {
      out.push_back(char(c));
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() && (uint8_t(s[i + 1]) & 0xC0) == 0x80) {
      unsigned cp = ((c & 0x1Fu) << 6) | (uint8_t(s[i + 1]) & 0x3Fu);
      if (cp > 0xFF) ok = false;
      out.push_back(char(cp & 0xFF));
      ++i;
    } else {
      ok = false;
      return out;
    }
  }
  return out;
}

PyRef Unpickler::rebuild_tensor(const std::vector<PyRef>& args) {
  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  // _rebuild_tensor(storage, storage_offset, size, stride)
  if (args.size() < 4) fail("tensor rebuild with " + std::to_string(args.size()) + " arguments");
  if (!args[0] || args[0]->kind != Kind::storage) fail("tensor rebuilt from " + (args[0] ? args[0]->describe() : "null"));
  PendingTensor t;
  t.value = make(Kind::tensor);
  t.storage = args[0];
  t.offset = as_int(args[1], "storage offset");
  t.size = as_int_tuple(args[2], "tensor size");
  t.stride = as_int_tuple(args[3], "tensor stride");
  if (t.size.size() != t.stride.size()) fail("tensor size and stride differ in length");
  tensors_->push_back(t);
  return t.value;
}

PyRef Unpickler::call(const PyRef& callable, const std::vector<PyRef>& args, int depth) {
  if (depth > 8) fail("nested tensor rebuilds");
  const std::string name = callable && callable->kind == Kind::global ? callable->text : "";
  if (name == "collections.OrderedDict" || name == "builtins.dict" || name == "__builtin__.dict") {
    PyRef d = make(Kind::dict);
    if (!args.empty() && args[0] && (args[0]->kind == Kind::list || args[0]->kind == Kind::tuple))
      for (const auto& pair : args[0]->items) {
        if (!pair || pair->kind != Kind::tuple || pair->items.size() != 2) fail("dict built from a non-pair");
        d->entries.emplace_back(pair->items[0], pair->items[1]);
      }
    return d;
  }
  if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") return rebuild_tensor(args);
  if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
    if (args.empty() || !args[0] || args[0]->kind != Kind::tensor) fail("parameter rebuilt from a non-tensor");
    return args[0];
  }
  if (name == "torch._tensor._rebuild_from_type_v2" || name == "torch._tensor._rebuild_from_type") {
    if (args.size() < 3 || !args[2] || args[2]->kind != Kind::tuple) fail("malformed _rebuild_from_type arguments");
    return call(args[0], args[2]->items, depth + 1);
  }
  if (name == "_codecs.encode") {
    if (args.empty() || !args[0] || args[0]->kind != Kind::string) fail("_codecs.encode of a non-string");
    bool ok = true;
    PyRef b = make_string(utf8_to_latin1(args[0]->text, ok), Kind::bytes);
    if (!ok) fail("_codecs.encode of a string outside Latin-1");
    return b;
  }
  if (name == "builtins.set" || name == "__builtin__.set" || name == "builtins.frozenset" || name == "torch.Size" ||
      name == "builtins.tuple") {
    PyRef s = make(name == "torch.Size" || name == "builtins.tuple" ? Kind::tuple : Kind::set);
    if (!args.empty() && args[0] && (args[0]->kind == Kind::list || args[0]->kind == Kind::tuple)) s->items = args[0]->items;
    return s;
  }
  // Anything else is kept as an opaque record (argparse.Namespace, numpy scalars, torch.device, modules, ...).
  PyRef o = make(Kind::object);
  o->text = name.empty() ? "<result of calling " + (callable ? callable->describe() : "null") + ">" : name;
  o->items = args;
  return o;
}

PyRef Unpickler::run() {
  for (;;) {
    need(1);
    const uint8_t op = d_[p_++];
    switch (op) {
      case 0x80: need(1), ++p_; break;                   // PROTO
      case 0x95: read_le(8); break;                       // FRAME (ignored: data is already in memory)
      case '.': {                                         // STOP
        if (!marks_.empty() || stack_.size() != 1) fail("pickle ended with " + std::to_string(stack_.size()) + " values on the stack");
        return pop();
      }
      case '(': marks_.push_back(stack_.size()); break;   // MARK
      case '0': pop(); break;                             // POP
      case '1': pop_mark(); break;                        // POP_MARK
      case '2': push(top()); break;                       // DUP
      case 'N': push(make(Kind::none)); break;
      case 0x88: case 0x89: {                             // NEWTRUE / NEWFALSE
        PyRef b = make(Kind::boolean);
        b->boolean = op == 0x88;
        push(b);
        break;
      }
      case 'J': push(make_int(static_cast<int32_t>(read_le(4)))); break;   // BININT
      case 'K': push(make_int(static_cast<int64_t>(read_le(1)))); break;   // BININT1
      case 'M': push(make_int(static_cast<int64_t>(read_le(2)))); break;   // BININT2
      case 0x8a: { uint64_t k = read_le(1); push(make_long(read_bytes(k))); break; }  // LONG1
      case 0x8b: { uint64_t k = read_le(4); push(make_long(read_bytes(k))); break; }  // LONG4
      case 'I': case 'L': {                                // INT / LONG (text)
        std::string s = read_line();
        if (!s.empty() && s.back() == 'L') s.pop_back();
        if (op == 'I' && (s == "00" || s == "01")) {
          PyRef b = make(Kind::boolean);
          b->boolean = s == "01";
          push(b);
          break;
        }
        try {
          size_t used = 0;
          long long v = std::stoll(s, &used);
          if (used != s.size()) fail("malformed integer '" + s + "'");
          push(make_int(v));
        } catch (const std::logic_error&) {
          fail("malformed or too large integer '" + s.substr(0, 30) + "'");
        }
        break;
      }
      case 'G': {                                          // BINFLOAT (big-endian double)
        need(8);
        uint64_t u = 0;
        for (int i = 0; i < 8; ++i) u = (u << 8) | d_[p_ + i];
        p_ += 8;
        PyRef f = make(Kind::floating);
        std::memcpy(&f->floating, &u, 8);
        push(f);
        break;
      }
      case 'F': {                                          // FLOAT (text)
        std::string s = read_line();
        PyRef f = make(Kind::floating);
        try {
          f->floating = std::stod(s);
        } catch (const std::logic_error&) {
          fail("malformed float '" + s.substr(0, 30) + "'");
        }
        push(f);
        break;
      }
      case 'X': { uint64_t k = read_le(4); push(make_string(read_bytes(k))); break; }      // BINUNICODE
      case 0x8c: { uint64_t k = read_le(1); push(make_string(read_bytes(k))); break; }     // SHORT_BINUNICODE
      case 0x8d: { uint64_t k = read_le(8); push(make_string(read_bytes(k))); break; }     // BINUNICODE8
      case 'T': { uint64_t k = read_le(4); push(make_string(read_bytes(k))); break; }      // BINSTRING
      case 'U': { uint64_t k = read_le(1); push(make_string(read_bytes(k))); break; }      // SHORT_BINSTRING
      case 'B': { uint64_t k = read_le(4); push(make_string(read_bytes(k), Kind::bytes)); break; }   // BINBYTES
      case 'C': { uint64_t k = read_le(1); push(make_string(read_bytes(k), Kind::bytes)); break; }   // SHORT_BINBYTES
      case 0x8e: { uint64_t k = read_le(8); push(make_string(read_bytes(k), Kind::bytes)); break; }  // BINBYTES8
      case ']': push(make(Kind::list)); break;
      case '}': push(make(Kind::dict)); break;
      case ')': push(make(Kind::tuple)); break;
      case 0x8f: push(make(Kind::set)); break;            // EMPTY_SET
      case 'l': case 't': case 0x91: {                    // LIST / TUPLE / FROZENSET (from mark)
        PyRef v = make(op == 'l' ? Kind::list : op == 't' ? Kind::tuple : Kind::set);
        v->items = pop_mark();
        push(v);
        break;
      }
      case 0x85: case 0x86: case 0x87: {                  // TUPLE1/2/3
        PyRef v = make(Kind::tuple);
        const size_t k = op - 0x84;
        v->items.resize(k);
        for (size_t i = k; i-- > 0;) v->items[i] = pop();
        push(v);
        break;
      }
      case 'd': {                                          // DICT (from mark)
        std::vector<PyRef> kv = pop_mark();
        if (kv.size() % 2) fail("DICT with an odd number of items");
        PyRef v = make(Kind::dict);
        for (size_t i = 0; i < kv.size(); i += 2) v->entries.emplace_back(kv[i], kv[i + 1]);
        push(v);
        break;
      }
      case 'a': { PyRef v = pop(); append(top(), {v}); break; }   // APPEND
      case 'e': case 0x90: {                                      // APPENDS / ADDITEMS
        std::vector<PyRef> vs = pop_mark();
        append(top(), std::move(vs));
        break;
      }
      case 's': {                                          // SETITEM
        PyRef v = pop(), k = pop();
        set_item(top(), k, v);
        break;
      }
      case 'u': {                                          // SETITEMS
        std::vector<PyRef> kv = pop_mark();
        if (kv.size() % 2) fail("SETITEMS with an odd number of items");
        PyRef target = top();
        for (size_t i = 0; i < kv.size(); i += 2) set_item(target, kv[i], kv[i + 1]);
        break;
      }
      case 'c': {                                          // GLOBAL
        std::string module = read_line(), name = read_line();
        push(make_string(module + "." + name, Kind::global));
        break;
      }
      case 0x93: {                                         // STACK_GLOBAL
        PyRef name = pop(), module = pop();
        if (name->kind != Kind::string || module->kind != Kind::string) fail("STACK_GLOBAL of non-strings");
        push(make_string(module->text + "." + name->text, Kind::global));
        break;
      }
      case 'R': {                                          // REDUCE
        PyRef args = pop(), callable = pop();
        if (args->kind != Kind::tuple) fail("REDUCE arguments are " + args->describe());
        push(call(callable, args->items));
        break;
      }
      case 0x81: case 0x92: {                              // NEWOBJ / NEWOBJ_EX
        if (op == 0x92) pop();                             // kwargs
        PyRef args = pop(), cls = pop();
        if (args->kind != Kind::tuple) fail("NEWOBJ arguments are " + args->describe());
        push(call(cls, args->items));
        break;
      }
      case 'b': {                                          // BUILD
        PyRef state = pop();
        PyRef& target = top();
        if (target->kind == Kind::dict || target->kind == Kind::object || target->kind == Kind::list) target->state = state;
        break;                                             // tensors etc.: state is not needed
      }
      case 'Q': case 'P': {                                // BINPERSID / PERSID
        PyRef pid = op == 'Q' ? pop() : make_string(read_line());
        if (!persistent_) fail("persistent id outside the object pickle");
        push(persistent_(pid));
        break;
      }
      case 'q': memo_put(read_le(1)); break;              // BINPUT
      case 'r': memo_put(read_le(4)); break;              // LONG_BINPUT
      case 0x94: memo_put(memo_.size()); break;           // MEMOIZE
      case 'p': {                                          // PUT (text)
        std::string s = read_line();
        try {
          memo_put(std::stoull(s));
        } catch (const std::logic_error&) {
          fail("malformed memo key");
        }
        break;
      }
      case 'h': push(memo_get(read_le(1))); break;        // BINGET
      case 'j': push(memo_get(read_le(4))); break;        // LONG_BINGET
      case 'g': {                                          // GET (text)
        std::string s = read_line();
        try {
          push(memo_get(std::stoull(s)));
        } catch (const std::logic_error&) {
          fail("malformed memo key");
        }
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        --p_;
        fail(std::string("unsupported pickle opcode ") + hex,
             "only the pickle subset torch.save writes for checkpoints is read; re-save the state_dict with torch.save");
      }
    }
  }
}

/// Turns every pending tensor into a strided view of its storage, after checking that it stays inside it.
void materialize(std::vector<PendingTensor>& tensors, const std::string& origin) {
  for (PendingTensor& t : tensors) {
    const PyValue& st = *t.storage;
    if (!st.tensor.defined()) throw UserError(origin, "a tensor refers to a storage that is not in the file", "truncated file?");
    const int64_t es = static_cast<int64_t>(c10::elementSize(st.dtype));
    const int64_t nbytes = st.tensor.numel();
    if (nbytes % es) throw UserError(origin, "storage size is not a multiple of its element size", "corrupt file");
    const int64_t numel = nbytes / es;
    if (t.offset < 0) throw UserError(origin, "negative storage offset", "corrupt file");
    bool empty = false;
    for (size_t i = 0; i < t.size.size(); ++i) {
      if (t.size[i] < 0 || t.stride[i] < 0) throw UserError(origin, "negative tensor size or stride", "corrupt file");
      empty = empty || t.size[i] == 0;
    }
    auto options = at::TensorOptions().dtype(st.dtype);
    if (empty) {
      t.value->tensor = at::empty(t.size, options);
      continue;
    }
    // Largest element index reached, in 128-bit arithmetic so that no size/stride can overflow it.
    __int128 last = t.offset;
    for (size_t i = 0; i < t.size.size(); ++i) last += static_cast<__int128>(t.size[i] - 1) * t.stride[i];
    if (last >= numel)
      throw UserError(origin, "tensor " + c10::str(t.size) + " extends past its storage of " + std::to_string(numel) + " elements",
                      "corrupt file");
    at::Tensor keep = st.tensor;
    at::Tensor typed = at::from_blob(keep.data_ptr(), {numel}, [keep](void*) {}, options);
    t.value->tensor = typed.as_strided(t.size, t.stride, t.offset);
  }
}

/// Makes a storage value from raw bytes (bool bytes normalised to 0/1).
PyRef make_storage(at::Tensor bytes, at::ScalarType dtype) {
  PyRef s = make(Kind::storage);
  s->dtype = dtype;
  s->tensor = dtype == at::kBool ? bytes.ne(0).to(at::kByte) : std::move(bytes);
  return s;
}

at::Tensor bytes_tensor(const uint8_t* data, size_t n) {
  at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kByte);
  if (n) std::memcpy(t.data_ptr(), data, n);
  return t;
}

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
    if (zip_stat(z_, name.c_str(), 0, &st) != 0) throw UserError(origin_, "archive has no entry '" + name + "'", "truncated file?");
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
      throw UserError(origin_, "entry '" + name + "' is corrupt" + (why.empty() ? "" : ": " + why), "CRC mismatch: damaged file");
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
    if (order != "little") throw UserError(origin, "byte order '" + order + "' is not supported", "re-save on a little-endian machine");
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
    PyRef s = make_storage(zip.read(prefix + "data/" + key), storage_dtype(pid->items[1]->text, origin));
    storages[key] = s;
    return s;
  };
  const auto* data = static_cast<const uint8_t*>(pkl.data_ptr());
  Unpickler u(data, static_cast<size_t>(pkl.numel()), 0, origin + " data.pkl", persistent, &tensors);
  TorchFile out{u.run(), "zip"};
  materialize(tensors, origin);
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

  Unpickler magic(d, n, 0, origin, nullptr, &tensors);
  PyRef m = magic.run();
  static const std::string kMagic("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);  // 0x1950a86a20f9469cfc6c
  if (m->kind != Kind::big_integer || m->text != kMagic)
    throw UserError(origin, "not a torch.save file (legacy magic number missing)", "expected a .pt/.pth written by torch.save");
  Unpickler proto(d, n, magic.position(), origin, nullptr, &tensors);
  PyRef version = proto.run();
  if (version->kind != Kind::integer || version->integer != 1001)
    throw UserError(origin, "unsupported legacy protocol version", "re-save with a recent torch.save");
  Unpickler sysinfo(d, n, proto.position(), origin, nullptr, &tensors);
  PyRef info = sysinfo.run();
  if (info->kind == Kind::dict) {
    PyRef le = info->get("little_endian");
    if (le && le->kind == Kind::boolean && !le->boolean)
      throw UserError(origin, "big-endian file", "re-save on a little-endian machine");
  }
  auto persistent = [&](const PyRef& pid) -> PyRef {
    // ('storage', storage_type, root_key, location, numel, view_metadata)
    if (pid->kind != Kind::tuple || pid->items.size() < 6 || pid->items[0]->kind != Kind::string ||
        pid->items[0]->text != "storage" || pid->items[1]->kind != Kind::global || pid->items[2]->kind != Kind::string ||
        pid->items[4]->kind != Kind::integer)
      throw UserError(origin, "unsupported persistent id " + pid->describe(), "not a torch.save storage reference");
    const std::string& key = pid->items[2]->text;
    const at::ScalarType dtype = storage_dtype(pid->items[1]->text, origin);
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
  Unpickler object(d, n, sysinfo.position(), origin, persistent, &tensors);
  TorchFile out{object.run(), "legacy"};
  Unpickler keys_u(d, n, object.position(), origin, nullptr, &tensors);
  PyRef keys = keys_u.run();
  if (keys->kind != Kind::list) throw UserError(origin, "storage key list missing", "truncated file?");
  size_t p = keys_u.position();
  for (const PyRef& k : keys->items) {
    if (k->kind != Kind::string) throw UserError(origin, "storage key is " + k->describe(), "corrupt file");
    auto it = roots.find(k->text);
    if (it == roots.end()) throw UserError(origin, "storage '" + k->text + "' is not referenced", "corrupt file");
    if (n - p < 8) throw UserError(origin, "storage '" + k->text + "' is cut off", "truncated file");
    uint64_t count = 0;
    for (int i = 0; i < 8; ++i) count |= uint64_t(d[p + i]) << (8 * i);
    p += 8;
    const uint64_t es = c10::elementSize(it->second.dtype);
    if (count > (n - p) / es) throw UserError(origin, "storage '" + k->text + "' runs past the end of the file", "truncated file");
    PyRef fresh = make_storage(bytes_tensor(d + p, count * es), it->second.dtype);
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
  materialize(tensors, origin);
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
  throw UserError(origin, "not a torch.save file (neither a zip archive nor a pickle)", "expected a .pt/.pth/.bin written by torch.save");
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
        throw UserError(origin, "key '" + part + "' asked of a " + node->describe(), "check --weights-key / model.weights_key");
      PyRef next = node->get(part);
      if (!next && node->kind == Kind::object && node->state && node->state->kind == Kind::dict) next = node->state->get(part);
      if (!next)
        throw UserError(origin, "no entry '" + part + "'", "entries: " + join(keys_of(node)));
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
  if (node->kind != Kind::dict) throw UserError(origin, "entry '" + key + "' is a " + node->describe(), "not a state_dict");
  TensorMap out;
  for (const auto& [k, v] : node->entries) {
    if (!k || k->kind != Kind::string) throw UserError(origin, "state_dict key is a " + (k ? k->describe() : "null"), "not a state_dict");
    if (!v || v->kind != Kind::tensor)
      throw UserError(origin, "entry '" + k->text + "' is a " + (v ? v->describe() : "null"), "not a state_dict of tensors");
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
    if (!key.empty()) throw UserError(path, "a weights key applies to nested torch.save checkpoints", "drop the key for .safetensors");
    return load_safetensors(path).tensors;
  }
  std::string bytes = read_file(path);
  if (!looks_like_torch_file(bytes)) {
    // A safetensors file with another extension still loads.
    if (bytes.size() >= 9 && bytes[8] == '{' && key.empty()) return parse_safetensors(
        reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path).tensors;
  }
  return torch_state_dict(parse_torch_file(bytes, path), key, path);
}

}  // namespace moh
