// Non-tensor arguments of a recorded op as JSON, and dtype names (included by dumpobs.cpp,
// inside its anonymous namespace).
// ---- non-tensor arguments, as JSON (what args_of + the writer produce in Python) -----------------
std::string dtype_name(int v) {  // "float32": str(dtype) without "torch."
  try {
    return std::string(c10::getDtypeNames(static_cast<c10::ScalarType>(v)).first);
  } catch (const std::exception&) {
    return c10::toString(static_cast<c10::ScalarType>(v));
  }
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += c10::str("\\u00", (c < 16 ? "0" : ""), std::hex, int(c));
    else out += c;
  }
  out += '"';
}

// A finite double as Python's repr writes it (what json.dumps writes, so the Python capture's
// text too): the shortest digits that read back the same number (std::to_chars, ~200
// instructions where snprintf took ~1,100), in fixed notation when the decimal point falls
// within 4 places left of the first digit or 16 right of it, else as d.ddde+XX.
void repr_double(std::string& out, double v) {
  char buf[32];
  char* end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific).ptr;
  char* e = std::find(buf, end, 'e');
  const char* p = buf;
  if (*p == '-') out += '-', ++p;
  char digits[20];
  int n = 0;
  for (; p < e; ++p)
    if (*p != '.') digits[n++] = *p;
  int exp = 0;
  std::from_chars(e + 1 + (e[1] == '+'), end, exp);
  int point = exp + 1;  // digits before the decimal point
  if (point <= -4 || point > 16) {
    out += digits[0];
    if (n > 1) out += '.', out.append(digits + 1, n - 1);
    out += exp < 0 ? "e-" : "e+";
    int a = exp < 0 ? -exp : exp;
    if (a < 10) out += '0';
    out += std::to_string(a);
  } else if (point <= 0) {
    out += "0.", out.append(-point, '0'), out.append(digits, n);
  } else if (point < n) {
    out.append(digits, point), out += '.', out.append(digits + point, n - point);
  } else {
    out.append(digits, n), out.append(point - n, '0'), out += ".0";
  }
}

void json_double(std::string& out, double v) {
  if (std::isnan(v)) out += "NaN";
  else if (std::isinf(v)) out += v > 0 ? "Infinity" : "-Infinity";
  else repr_double(out, v);
}

bool json_value(std::string& out, const c10::IValue& v, int8_t kind) {
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) {
    const at::Tensor& t = v.toTensor();  // a Python number: read where it lies (what item() returns)
    if (t.is_cpu() && t.scalar_type() == at::kDouble) return json_value(out, c10::IValue(*t.const_data_ptr<double>()), 0);
    if (t.is_cpu() && t.scalar_type() == at::kLong) return json_value(out, c10::IValue(*t.const_data_ptr<int64_t>()), 0);
    if (t.is_cpu() && t.scalar_type() == at::kBool) return json_value(out, c10::IValue(*t.const_data_ptr<bool>()), 0);
    Internal guard;
    return json_value(out, c10::IValue(t.item()), 0);
  }
  if (v.isNone()) out += "null";
  else if (v.isBool()) out += v.toBool() ? "true" : "false";
  else if (v.isInt()) {
    std::string dtype = kind == 1 ? "torch." + dtype_name(static_cast<int>(v.toInt())) : "";
    const char* text = kind == 1 ? dtype.c_str() : nullptr;
    if (kind == 2) text = v.toInt() == 0 ? "torch.strided" : "torch.sparse_coo";
    if (kind == 3) {
      static const char* const mf[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                       "torch.channels_last_3d"};
      text = v.toInt() >= 0 && v.toInt() < 4 ? mf[v.toInt()] : nullptr;
    }
    if (text) json_string(out, text);
    else out += std::to_string(v.toInt());
  } else if (v.isDouble()) json_double(out, v.toDouble());
  else if (v.isString()) json_string(out, v.toStringRef());
  else if (v.isDevice()) json_string(out, v.toDevice().str());
  else if (v.isScalar()) {
    auto s = v.toScalar();
    if (s.isBoolean()) out += s.toBool() ? "true" : "false";
    else if (s.isIntegral(false)) out += std::to_string(s.toLong());
    else if (s.isFloatingPoint()) json_double(out, s.toDouble());
    else json_string(out, c10::str(s));
  } else if (v.isList()) {
    out += '[';
    bool first = true;
    for (const auto& x : v.toListRef()) {
      if (x.isTensor()) return false;
      if (!first) out += ", ";
      first = false;
      if (!json_value(out, x, 0)) return false;
    }
    out += ']';
  } else if (v.isTensor() || v.isGenerator()) return false;
  else json_string(out, c10::str(v));
  return true;
}

// ---- the arguments of a call, in a compact binary form ------------------------------------------
// The training thread only copies each argument's value into the step's `args_bin` (args_of,
// ~1.6k instructions a call less than writing its JSON there); the dump writer's thread turns
// the records into JSON (args_json, dumpobs_columns.h), character for character what
// json_value writes. A call's record: entries, each a head and its payload, then A_END.
enum ArgTag : uint8_t { A_END = 0, A_NULL, A_BOOL, A_INT, A_DOUBLE, A_INTS, A_DOUBLES, A_BOOLS, A_TEXT, A_RNG, A_DOC };
struct ArgHead {
  uint8_t tag, kw, kind, flag;  // kw: a keyword argument; kind: OpKind::arg_kinds; flag: a bool's value
  int32_t key;                  // its position, or (kw) its interned name
};

template <typename T>
void put(const T& v) {
  size_t at = args_bin.size();
  args_bin.resize(at + sizeof(T));
  std::memcpy(args_bin.data() + at, &v, sizeof(T));
}

void put_text(ArgHead h, uint8_t tag, const char* s, size_t n) {
  h.tag = tag;
  put(h), put(static_cast<uint32_t>(n));
  args_bin.append(s, n);
}

template <typename T>
void put_list(ArgHead h, uint8_t tag, const c10::IValue& v) {
  h.tag = tag;
  auto list = v.toListRef();
  put(h), put(static_cast<uint32_t>(list.size()));
  for (const auto& x : list) put(static_cast<T>(tag == A_DOUBLES ? x.toDouble() : tag == A_INTS ? x.toInt() : x.toBool()));
}

// One argument appended (head and payload); false, nothing appended, for one the JSON leaves out
// (a list holding a tensor, a generator).
bool put_value(ArgHead h, const c10::IValue& v) {
  if (v.isTensor()) {  // an optional tensor not given (None, as a mode sees it), or a Python number
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return h.tag = A_NULL, put(h), true;
    h.kind = 0;  // read where it lies (what item() returns)
    if (t.is_cpu() && t.scalar_type() == at::kDouble) return h.tag = A_DOUBLE, put(h), put(*t.const_data_ptr<double>()), true;
    if (t.is_cpu() && t.scalar_type() == at::kLong) return h.tag = A_INT, put(h), put(*t.const_data_ptr<int64_t>()), true;
    if (t.is_cpu() && t.scalar_type() == at::kBool)
      return h.tag = A_BOOL, h.flag = *t.const_data_ptr<bool>(), put(h), true;
    Internal guard;
    return put_value(h, c10::IValue(t.item()));
  }
  if (v.isNone()) return h.tag = A_NULL, put(h), true;
  if (v.isBool()) return h.tag = A_BOOL, h.flag = v.toBool(), put(h), true;
  if (v.isInt()) return h.tag = A_INT, put(h), put(v.toInt()), true;
  if (v.isDouble()) return h.tag = A_DOUBLE, put(h), put(v.toDouble()), true;
  if (v.isScalar() && !v.toScalar().isComplex()) {
    auto s = v.toScalar();
    h.kind = 0;
    if (s.isBoolean()) return h.tag = A_BOOL, h.flag = s.toBool(), put(h), true;
    if (s.isIntegral(false)) return h.tag = A_INT, put(h), put(s.toLong()), true;
    return h.tag = A_DOUBLE, put(h), put(s.toDouble()), true;
  }
  if (v.isIntList()) return put_list<int64_t>(h, A_INTS, v), true;
  if (v.isDoubleList()) return put_list<double>(h, A_DOUBLES, v), true;
  if (v.isBoolList()) return put_list<uint8_t>(h, A_BOOLS, v), true;
  static std::string text;  // anything else written as JSON now (strings, devices, other lists); under mu
  text.clear();
  if (!json_value(text, v, h.kind)) return false;
  put_text(h, A_TEXT, text.data(), text.size());
  return true;
}

// What op kind `k`'s schema says (OpKind::defaults, unmarked), looked up once (under mu).
const OpKind& schema_of(const OpKind& k) {
  if (k.schema_known) return k;
  k.schema_known = true;
  std::string_view qual = names[k.name];  // "aten.add_.Tensor"
  size_t dot = qual.find('.'), last = qual.rfind('.');
  if (dot == std::string_view::npos || last == dot) return k;
  std::string overload(qual.substr(last + 1));
  auto op = c10::Dispatcher::singleton().findSchema(
      {std::string(qual.substr(0, dot)) + "::" + std::string(qual.substr(dot + 1, last - dot - 1)),
       overload == "default" ? "" : overload});
  if (!op) return k;
  const auto& args = op->schema().arguments();
  for (const auto& a : args) k.defaults.push_back(a.default_value());
  if (!k.collective)  // (a collective's outputs say what it wrote)
    for (int pos : k.written)
      if (pos < static_cast<int>(args.size()) && !(args[pos].alias_info() && args[pos].alias_info()->isWrite()))
        k.unmarked.push_back(pos);
  return k;
}

bool is_default(const std::vector<std::optional<c10::IValue>>& d, size_t i, const c10::IValue& v) {
  if (i >= d.size() || !d[i].has_value() || (v.isTensor() && v.toTensor().defined())) return false;  // (no default is a tensor)
  try {
    return *d[i] == v;  // (as torch compares them)
  } catch (const std::exception&) {
    return false;
  }
}

// The arguments a dispatch mode is given are those torch picks from the call's (which hold
// all of the schema's): keyword-only ones equal to their default are left out, and so are
// positional ones from the last back while they equal theirs. The positions [0, end) kept.
size_t positional_end(const OpKind& k, const std::vector<c10::IValue>& args,
                      const std::vector<std::optional<c10::IValue>>& d) {
  size_t end = args.size();
  while (end > 0 && end - 1 < k.kwarg_only.size() && k.kwarg_only[end - 1]) --end;
  while (end > 0 && is_default(d, end - 1, args[end - 1])) --end;
  return end;
}

// The recorded op's arguments (T.args) and random state (g_rng) as a record in args_bin: its
// offset, or -1 when it has none (under mu).
int args_of(const Thread& T, const OpKind& k) {
  size_t start = args_bin.size();
  const auto& d = schema_of(k).defaults;
  size_t end = positional_end(k, T.args, d);
  for (size_t i = 0; i < T.args.size(); ++i) {
    const auto& v = T.args[i];
    bool kw = i < k.kwarg_only.size() && k.kwarg_only[i];
    if (kw ? is_default(d, i, v) : i >= end) continue;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number()) continue;
    } else if (v.isTensorList() || v.isGenerator()) {
      continue;
    }
    ArgHead h{A_END, kw, static_cast<uint8_t>(i < k.arg_kinds.size() ? k.arg_kinds[i] : 0), 0,
              kw ? k.arg_names[i] : static_cast<int32_t>(i)};
    size_t at = args_bin.size();
    if (!put_value(h, v)) args_bin.resize(at);
  }
  if (!g_rng.empty()) put_text(ArgHead{}, A_RNG, g_rng.data(), g_rng.size());
  if (args_bin.size() == start) return -1;
  put(ArgHead{});
  return static_cast<int>(start);
}

// A call's whole document given as JSON (the api level's, from Python): its record's offset.
int args_doc(const char* s, size_t n) {
  size_t start = args_bin.size();
  put_text(ArgHead{}, A_DOC, s, n);
  put(ArgHead{});
  return static_cast<int>(start);
}

// ---- the writer's side: a record as JSON ---------------------------------------------------------
template <typename T>
T get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

// Entry `h`'s value (its payload at p) as json_value writes it.
void format_value(std::string& out, const ArgHead& h, const char*& p) {
  switch (h.tag) {
    case A_NULL: out += "null"; break;
    case A_BOOL: out += h.flag ? "true" : "false"; break;
    case A_INT: {
      int64_t v = get<int64_t>(p);
      if (h.kind == 1) json_string(out, "torch." + dtype_name(static_cast<int>(v)));
      else if (h.kind == 2) json_string(out, v == 0 ? "torch.strided" : "torch.sparse_coo");
      else if (h.kind == 3 && v >= 0 && v < 4) {
        static const char* const mf[] = {"torch.contiguous_format", "torch.preserve_format", "torch.channels_last",
                                         "torch.channels_last_3d"};
        json_string(out, mf[v]);
      } else {
        out += std::to_string(v);
      }
      break;
    }
    case A_DOUBLE: json_double(out, get<double>(p)); break;
    case A_INTS: case A_DOUBLES: case A_BOOLS: {
      uint32_t n = get<uint32_t>(p);
      out += '[';
      for (uint32_t i = 0; i < n; ++i) {
        if (i) out += ", ";
        if (h.tag == A_INTS) out += std::to_string(get<int64_t>(p));
        else if (h.tag == A_DOUBLES) json_double(out, get<double>(p));
        else out += get<uint8_t>(p) ? "true" : "false";
      }
      out += ']';
      break;
    }
    default: {  // A_TEXT
      uint32_t n = get<uint32_t>(p);
      out.append(p, n);
      p += n;
    }
  }
}

// The record at p (ending before `end`) as the call's JSON document, appended to out; kwarg names
// from `names` (the interned names, by index).
void format_call(std::string& out, const char* p, const char* end, const std::vector<std::string_view>& names) {
  std::string pos = "[", kw = "{";
  std::string_view rng;
  while (p + sizeof(ArgHead) <= end) {
    ArgHead h = get<ArgHead>(p);
    if (h.tag == A_END) break;
    if (h.tag == A_DOC || h.tag == A_RNG) {
      uint32_t n = get<uint32_t>(p);
      if (h.tag == A_DOC) out.append(p, n);
      else rng = std::string_view(p, n);
      p += n;
      continue;
    }
    if (h.kw) {
      if (kw.size() > 1) kw += ", ";
      json_string(kw, h.key >= 0 && static_cast<size_t>(h.key) < names.size() ? std::string(names[h.key]) : "");
      kw += ": ";
      format_value(kw, h, p);
    } else {
      if (pos.size() > 1) pos += ", ";
      pos += '[', pos += std::to_string(h.key), pos += ", ";
      format_value(pos, h, p);
      pos += ']';
    }
  }
  if (pos.size() == 1 && kw.size() == 1 && rng.empty()) return;  // a document given whole (A_DOC)
  out += "{\"args\": ", out += pos, out += "], \"kwargs\": ", out += kw, out += '}';
  if (!rng.empty()) out += ", \"rng\": ", out.append(rng);
  out += '}';
}
