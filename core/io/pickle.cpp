#include "core/io/pickle.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>

#include "core/error.h"

namespace moh {

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
    case Kind::none:
      return "None";
    case Kind::boolean:
      return boolean ? "True" : "False";
    case Kind::integer:
      return "int " + std::to_string(integer);
    case Kind::big_integer:
      return "int (" + std::to_string(text.size()) + " bytes)";
    case Kind::floating:
      return "float " + std::to_string(floating);
    case Kind::string:
      return "str '" + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + "'";
    case Kind::bytes:
      return "bytes (" + std::to_string(text.size()) + ")";
    case Kind::list:
      return "list of " + std::to_string(items.size());
    case Kind::tuple:
      return "tuple of " + std::to_string(items.size());
    case Kind::set:
      return "set of " + std::to_string(items.size());
    case Kind::dict:
      return "dict with " + std::to_string(entries.size()) + " keys";
    case Kind::tensor:
      return tensor.defined()
                 ? "tensor " + std::string(c10::toString(tensor.scalar_type())) + " " + c10::str(tensor.sizes())
                 : "tensor";
    case Kind::storage:
      return "storage";
    case Kind::global:
      return "class " + text;
    case Kind::object:
      return "object " + text;
  }
  return "?";
}

namespace pickle {

PyRef make(Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

/// Element type of a torch storage class ("torch.FloatStorage", ...).
at::ScalarType storage_dtype(const std::string& name, const std::string& origin) {
  static const std::map<std::string, at::ScalarType> table = {{"torch.FloatStorage", at::kFloat},
                                                              {"torch.DoubleStorage", at::kDouble},
                                                              {"torch.HalfStorage", at::kHalf},
                                                              {"torch.BFloat16Storage", at::kBFloat16},
                                                              {"torch.LongStorage", at::kLong},
                                                              {"torch.IntStorage", at::kInt},
                                                              {"torch.ShortStorage", at::kShort},
                                                              {"torch.CharStorage", at::kChar},
                                                              {"torch.ByteStorage", at::kByte},
                                                              {"torch.BoolStorage", at::kBool},
                                                              {"torch.UntypedStorage", at::kByte},
                                                              {"torch.ComplexFloatStorage", at::kComplexFloat},
                                                              {"torch.ComplexDoubleStorage", at::kComplexDouble}};
  auto it = table.find(name);
  if (it == table.end())
    throw UserError(origin, "unsupported storage type '" + name + "'", "re-save with a standard dtype");
  return it->second;
}

namespace {

/// The pickle virtual machine (protocols 0-5, the opcodes checkpoints use).
class Unpickler {
 public:
  using PersistentLoad = std::function<PyRef(const PyRef&)>;
  Unpickler(const uint8_t* data, size_t size, size_t start, std::string origin, PersistentLoad persistent,
            std::vector<PendingTensor>* tensors)
      : d_(data),
        n_(size),
        p_(start),
        origin_(std::move(origin)),
        persistent_(std::move(persistent)),
        tensors_(tensors) {}

  PyRef run();
  size_t position() const { return p_; }

 private:
  // One family of opcodes each: true when `op` belongs to it (and was executed).
  bool stack_op(uint8_t op);
  bool scalar_op(uint8_t op);
  bool string_op(uint8_t op);
  bool container_op(uint8_t op);
  bool object_op(uint8_t op);
  [[noreturn]] void fail(const std::string& why,
                         const std::string& hint = "not a valid torch.save file, or truncated") const {
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
  if (!args[0] || args[0]->kind != Kind::storage)
    fail("tensor rebuilt from " + (args[0] ? args[0]->describe() : "null"));
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
    if (!args.empty() && args[0] && (args[0]->kind == Kind::list || args[0]->kind == Kind::tuple))
      s->items = args[0]->items;
    return s;
  }
  // Anything else is kept as an opaque record (argparse.Namespace, numpy scalars, torch.device, modules, ...).
  PyRef o = make(Kind::object);
  o->text = name.empty() ? "<result of calling " + (callable ? callable->describe() : "null") + ">" : name;
  o->items = args;
  return o;
}

// PROTO, FRAME, MARK, POP, POP_MARK, DUP and the memo (PUT / GET in their forms).
bool Unpickler::stack_op(uint8_t op) {
  switch (op) {
    case 0x80:
      need(1), ++p_;
      return true;  // PROTO
    case 0x95:
      read_le(8);
      return true;  // FRAME (ignored: data is already in memory)
    case '(':
      marks_.push_back(stack_.size());
      return true;  // MARK
    case '0':
      pop();
      return true;  // POP
    case '1':
      pop_mark();
      return true;  // POP_MARK
    case '2':
      push(top());
      return true;  // DUP
    case 'q':
      memo_put(read_le(1));
      return true;  // BINPUT
    case 'r':
      memo_put(read_le(4));
      return true;  // LONG_BINPUT
    case 0x94:
      memo_put(memo_.size());
      return true;  // MEMOIZE
    case 'p': {     // PUT (text)
      std::string s = read_line();
      try {
        memo_put(std::stoull(s));
      } catch (const std::logic_error&) {
        fail("malformed memo key");
      }
      return true;
    }
    case 'h':
      push(memo_get(read_le(1)));
      return true;  // BINGET
    case 'j':
      push(memo_get(read_le(4)));
      return true;  // LONG_BINGET
    case 'g': {     // GET (text)
      std::string s = read_line();
      try {
        push(memo_get(std::stoull(s)));
      } catch (const std::logic_error&) {
        fail("malformed memo key");
      }
      return true;
    }
    default:
      return false;
  }
}

// None, booleans, integers (binary and text, LONG1 / LONG4) and floats.
bool Unpickler::scalar_op(uint8_t op) {
  switch (op) {
    case 'N':
      push(make(Kind::none));
      return true;
    case 0x88:
    case 0x89: {  // NEWTRUE / NEWFALSE
      PyRef b = make(Kind::boolean);
      b->boolean = op == 0x88;
      push(b);
      return true;
    }
    case 'J':
      push(make_int(static_cast<int32_t>(read_le(4))));
      return true;  // BININT
    case 'K':
      push(make_int(static_cast<int64_t>(read_le(1))));
      return true;  // BININT1
    case 'M':
      push(make_int(static_cast<int64_t>(read_le(2))));
      return true;  // BININT2
    case 0x8a: {
      uint64_t k = read_le(1);
      push(make_long(read_bytes(k)));
      return true;
    }  // LONG1
    case 0x8b: {
      uint64_t k = read_le(4);
      push(make_long(read_bytes(k)));
      return true;
    }  // LONG4
    case 'I':
    case 'L': {  // INT / LONG (text)
      std::string s = read_line();
      if (!s.empty() && s.back() == 'L') s.pop_back();
      if (op == 'I' && (s == "00" || s == "01")) {
        PyRef b = make(Kind::boolean);
        b->boolean = s == "01";
        push(b);
        return true;
      }
      try {
        size_t used = 0;
        long long v = std::stoll(s, &used);
        if (used != s.size()) fail("malformed integer '" + s + "'");
        push(make_int(v));
      } catch (const std::logic_error&) {
        fail("malformed or too large integer '" + s.substr(0, 30) + "'");
      }
      return true;
    }
    case 'G': {  // BINFLOAT (big-endian double)
      need(8);
      uint64_t u = 0;
      for (int i = 0; i < 8; ++i) u = (u << 8) | d_[p_ + i];
      p_ += 8;
      PyRef f = make(Kind::floating);
      std::memcpy(&f->floating, &u, 8);
      push(f);
      return true;
    }
    case 'F': {  // FLOAT (text)
      std::string s = read_line();
      PyRef f = make(Kind::floating);
      try {
        f->floating = std::stod(s);
      } catch (const std::logic_error&) {
        fail("malformed float '" + s.substr(0, 30) + "'");
      }
      push(f);
      return true;
    }
    default:
      return false;
  }
}

// Text and byte strings of every length prefix.
bool Unpickler::string_op(uint8_t op) {
  switch (op) {
    case 'X': {
      uint64_t k = read_le(4);
      push(make_string(read_bytes(k)));
      return true;
    }  // BINUNICODE
    case 0x8c: {
      uint64_t k = read_le(1);
      push(make_string(read_bytes(k)));
      return true;
    }  // SHORT_BINUNICODE
    case 0x8d: {
      uint64_t k = read_le(8);
      push(make_string(read_bytes(k)));
      return true;
    }  // BINUNICODE8
    case 'T': {
      uint64_t k = read_le(4);
      push(make_string(read_bytes(k)));
      return true;
    }  // BINSTRING
    case 'U': {
      uint64_t k = read_le(1);
      push(make_string(read_bytes(k)));
      return true;
    }  // SHORT_BINSTRING
    case 'B': {
      uint64_t k = read_le(4);
      push(make_string(read_bytes(k), Kind::bytes));
      return true;
    }  // BINBYTES
    case 'C': {
      uint64_t k = read_le(1);
      push(make_string(read_bytes(k), Kind::bytes));
      return true;
    }  // SHORT_BINBYTES
    case 0x8e: {
      uint64_t k = read_le(8);
      push(make_string(read_bytes(k), Kind::bytes));
      return true;
    }  // BINBYTES8
    default:
      return false;
  }
}

// Lists, tuples, dicts and sets: built empty, from the mark, or filled (APPEND(S), SETITEM(S)).
bool Unpickler::container_op(uint8_t op) {
  switch (op) {
    case ']':
      push(make(Kind::list));
      return true;
    case '}':
      push(make(Kind::dict));
      return true;
    case ')':
      push(make(Kind::tuple));
      return true;
    case 0x8f:
      push(make(Kind::set));
      return true;  // EMPTY_SET
    case 'l':
    case 't':
    case 0x91: {  // LIST / TUPLE / FROZENSET (from mark)
      PyRef v = make(op == 'l' ? Kind::list : op == 't' ? Kind::tuple : Kind::set);
      v->items = pop_mark();
      push(v);
      return true;
    }
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1/2/3
      PyRef v = make(Kind::tuple);
      const size_t k = op - 0x84;
      v->items.resize(k);
      for (size_t i = k; i-- > 0;) v->items[i] = pop();
      push(v);
      return true;
    }
    case 'd': {  // DICT (from mark)
      std::vector<PyRef> kv = pop_mark();
      if (kv.size() % 2) fail("DICT with an odd number of items");
      PyRef v = make(Kind::dict);
      for (size_t i = 0; i < kv.size(); i += 2) v->entries.emplace_back(kv[i], kv[i + 1]);
      push(v);
      return true;
    }
    case 'a': {
      PyRef v = pop();
      append(top(), {v});
      return true;
    }  // APPEND
    case 'e':
    case 0x90: {  // APPENDS / ADDITEMS
      std::vector<PyRef> vs = pop_mark();
      append(top(), std::move(vs));
      return true;
    }
    case 's': {  // SETITEM
      PyRef v = pop(), k = pop();
      set_item(top(), k, v);
      return true;
    }
    case 'u': {  // SETITEMS
      std::vector<PyRef> kv = pop_mark();
      if (kv.size() % 2) fail("SETITEMS with an odd number of items");
      PyRef target = top();
      for (size_t i = 0; i < kv.size(); i += 2) set_item(target, kv[i], kv[i + 1]);
      return true;
    }
    default:
      return false;
  }
}

// GLOBAL / STACK_GLOBAL, REDUCE, NEWOBJ(_EX), BUILD and persistent ids: objects through call().
bool Unpickler::object_op(uint8_t op) {
  switch (op) {
    case 'c': {  // GLOBAL
      std::string module = read_line(), name = read_line();
      push(make_string(module + "." + name, Kind::global));
      return true;
    }
    case 0x93: {  // STACK_GLOBAL
      PyRef name = pop(), module = pop();
      if (name->kind != Kind::string || module->kind != Kind::string) fail("STACK_GLOBAL of non-strings");
      push(make_string(module->text + "." + name->text, Kind::global));
      return true;
    }
    case 'R': {  // REDUCE
      PyRef args = pop(), callable = pop();
      if (args->kind != Kind::tuple) fail("REDUCE arguments are " + args->describe());
      push(call(callable, args->items));
      return true;
    }
    case 0x81:
    case 0x92: {              // NEWOBJ / NEWOBJ_EX
      if (op == 0x92) pop();  // kwargs
      PyRef args = pop(), cls = pop();
      if (args->kind != Kind::tuple) fail("NEWOBJ arguments are " + args->describe());
      push(call(cls, args->items));
      return true;
    }
    case 'b': {  // BUILD
      PyRef state = pop();
      PyRef& target = top();
      if (target->kind == Kind::dict || target->kind == Kind::object || target->kind == Kind::list)
        target->state = state;
      return true;  // tensors etc.: state is not needed
    }
    case 'Q':
    case 'P': {  // BINPERSID / PERSID
      PyRef pid = op == 'Q' ? pop() : make_string(read_line());
      if (!persistent_) fail("persistent id outside the object pickle");
      push(persistent_(pid));
      return true;
    }
    default:
      return false;
  }
}

PyRef Unpickler::run() {
  for (;;) {
    need(1);
    const uint8_t op = d_[p_++];
    if (op == '.') {  // STOP
      if (!marks_.empty() || stack_.size() != 1)
        fail("pickle ended with " + std::to_string(stack_.size()) + " values on the stack");
      return pop();
    }
    if (stack_op(op) || scalar_op(op) || string_op(op) || container_op(op) || object_op(op)) continue;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    --p_;
    fail(std::string("unsupported pickle opcode ") + hex,
         "only the pickle subset torch.save writes for checkpoints is read; re-save the state_dict with torch.save");
  }
}

}  // namespace

PyRef unpickle(const uint8_t* data, size_t size, size_t start, const std::string& origin,
               const PersistentLoad& persistent, std::vector<PendingTensor>& tensors, size_t& end) {
  Unpickler u(data, size, start, origin, persistent, &tensors);
  PyRef v = u.run();
  end = u.position();
  return v;
}

/// Turns every pending tensor into a strided view of its storage, after checking that it stays inside it.
void materialize(std::vector<PendingTensor>& tensors, const std::string& origin) {
  for (PendingTensor& t : tensors) {
    const PyValue& st = *t.storage;
    if (!st.tensor.defined())
      throw UserError(origin, "a tensor refers to a storage that is not in the file", "truncated file?");
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
    // Largest element index reached, every product and sum checked: a corrupt size or stride must not wrap around
    // into a small index.
    int64_t last = t.offset;
    bool overflow = false;
    for (size_t i = 0; i < t.size.size() && !overflow; ++i) {
      int64_t reach = 0;
      overflow =
          __builtin_mul_overflow(t.size[i] - 1, t.stride[i], &reach) || __builtin_add_overflow(last, reach, &last);
    }
    if (overflow || last >= numel)
      throw UserError(
          origin, "tensor " + c10::str(t.size) + " extends past its storage of " + std::to_string(numel) + " elements",
          "corrupt file");
    at::Tensor keep = st.tensor;
    at::Tensor typed = at::from_blob(
        keep.data_ptr(), {numel}, [keep](void*) {}, options);
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

}  // namespace pickle
}  // namespace moh
