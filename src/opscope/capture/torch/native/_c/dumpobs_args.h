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

void json_double(std::string& out, double v) {
  if (std::isnan(v)) out += "NaN";
  else if (std::isinf(v)) out += v > 0 ? "Infinity" : "-Infinity";
  else {
    // what printf's "%.17g" writes, character for character (the standard defines it so), at a
    // fraction of snprintf's cost (~1,100 instructions a number: the largest item of args_of)
    char buf[32];
    char* end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 17).ptr;
    out.append(buf, end);
    if (std::find_if(buf, end, [](char c) { return c == '.' || c == 'e' || c == 'E'; }) == end) out += ".0";
  }
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

int args_of(const OpKind& k) {
  static thread_local std::string pos, kw, value;  // kept: no allocation per op
  pos.assign("["), kw.assign("{");
  for (size_t i = 0; i < t_args.size(); ++i) {
    const auto& v = t_args[i];
    bool number = v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number();
    bool none = v.isTensor() && !v.toTensor().defined();  // an optional tensor not given: None, as a mode sees it
    if ((v.isTensor() && !number && !none) || v.isTensorList() || v.isGenerator()) continue;
    value.assign(none ? "null" : "");
    if (!none && !json_value(value, v, i < k.arg_kinds.size() ? k.arg_kinds[i] : 0)) continue;
    if (i < k.kwarg_only.size() && k.kwarg_only[i]) {
      if (kw.size() > 1) kw += ", ";
      json_string(kw, names[k.arg_names[i]]);
      kw += ": ", kw += value;
    } else {
      if (pos.size() > 1) pos += ", ";
      char index[24];
      index[0] = '[';
      char* end = std::to_chars(index + 1, index + sizeof index - 2, i).ptr;
      end[0] = ',', end[1] = ' ';
      pos.append(index, end + 2), pos += value, pos += ']';
    }
  }
  if (pos == "[" && kw == "{" && t_rng.empty()) return -1;
  std::string doc;
  doc.reserve(pos.size() + kw.size() + t_rng.size() + 32);
  doc += "{\"args\": ", doc += pos, doc += "], \"kwargs\": ", doc += kw, doc += '}';
  if (!t_rng.empty()) doc += ", \"rng\": ", doc += t_rng;
  doc += '}';
  args_json.push_back(std::move(doc));
  return static_cast<int>(args_json.size()) - 1;
}

