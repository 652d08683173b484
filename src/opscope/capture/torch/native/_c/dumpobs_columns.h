// The step's rows handed to Python as columns (take_columns), and the step's state cleared
// (included by dumpobs_module.h, after everything that makes rows).
namespace {

// Python strings of interned names, made once and shared by every row that holds them
std::vector<PyObject*> py_names;
PyObject* py_text[9] = {nullptr};  // "input" "output" "param" "forward" "backward" "optimizer" "cpu" "" "grad"

PyObject* name_obj(int i) {  // a new reference
  if (i < 0) Py_RETURN_NONE;
  if (static_cast<size_t>(i) >= py_names.size()) py_names.resize(names.size(), nullptr);
  PyObject*& o = py_names[i];
  if (!o) o = PyUnicode_FromString(names[i].c_str());
  Py_INCREF(o);
  return o;
}

const int IO_TEXT_AT[] = {0, 1, 2, 8};  // Io -> its text

PyObject* text(int i) {
  static const char* const t[] = {"input", "output", "param", "forward", "backward", "optimizer", "cpu", "", "grad"};
  if (!py_text[i]) py_text[i] = PyUnicode_InternFromString(t[i]);
  Py_INCREF(py_text[i]);
  return py_text[i];
}

// The names the string columns index: the interned names, the fixed texts, the step's dtype names
// (`by_slot`). The same list object while none of them changed (the steps of a run, after the
// first, share it: the writer then maps its names once for them all); a new reference.
PyObject* names_list(const std::vector<int>& by_slot) {
  static PyObject* last = nullptr;
  static size_t last_names = 0;
  static std::vector<int> last_dtypes;
  if (last && last_names == names.size() && last_dtypes == by_slot) {
    Py_INCREF(last);
    return last;
  }
  PyObject* dict = PyList_New(0);
  for (int i = 0; i < static_cast<int>(names.size()); ++i) {
    PyObject* o = name_obj(i);
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  for (int i = 0; i < 9; ++i) {  // input output param forward backward optimizer cpu "" grad
    PyObject* o = text(i);
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  for (int d : by_slot) {
    PyObject* o = PyUnicode_FromString(dtype_name(d).c_str());
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  Py_XDECREF(last);
  last = dict, last_names = names.size(), last_dtypes = by_slot;
  Py_INCREF(last);
  return last;
}

// The step's state cleared, its data flow freed here (a thread of its own that freed it measured
// no faster on the tiny step or the transformer: docs/dump.md, "The tiny step, third round")
void clear_step() {
  rows.clear(), args_bin.clear(), seq_owner.clear();
  reset_arena();  // flow, geo, views, shared, calls
  views_json.clear(), shard_names.clear(), g_writes.clear();
  drop_shard();  // a step left unfinished (capture stopped): its tensors go
  g_seq = 0;
}

// A fixed-size column written straight into the bytes object Python receives (no vector zeroed
// first and copied after: a third of take_columns' instructions); every element is written.
template <typename T>
struct Column {
  PyObject* obj;
  T* p;
  explicit Column(size_t n)
      : obj(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n * sizeof(T)))),
        p(obj ? reinterpret_cast<T*>(PyBytes_AS_STRING(obj)) : nullptr) {}
  ~Column() { Py_XDECREF(obj); }
  PyObject* take() { return std::exchange(obj, nullptr); }
};

template <typename T>
PyObject* bytes_of(const std::vector<T>& v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()), static_cast<Py_ssize_t>(v.size() * sizeof(T)));
}

void resolve_links() {  // sources come first: one pass resolves chains
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    if (r.same >= 0) {  // the statistics of the same bytes (resolved already: an earlier row)
      const Row& src = rows[r.same];
      r.stats = src.stats;
      std::memcpy(r.st, src.st, sizeof r.st);
      std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
    }
    if (r.link < 0) continue;
    const Row& s = rows[r.link];
    // the same tensor's data; an input that is a view recorded earlier has its geometry too
    // (not in a size probe: its views count as what they are, as Recorder counts them)
    if (!g_probe && s.view >= 0 && r.view < 0 && r.numel == s.numel && r.shape == s.shape) r.view = s.view;
    r.shard = s.shard, r.key = s.key;
    // a note travels from the row linked to (an "alias" output, a meta tensor's), as Recorder
    // passes it on: not from the end of the chain
    if (s.note >= 0 && s.note != N_VIEW && r.note < 0) r.note = s.note;
    if (s.link >= 0) r.link = s.link;
    const Row& src = rows[r.link];
    r.stats = src.stats;
    std::memcpy(r.st, src.st, sizeof r.st);
    std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
  }
}

// A string column as Arrow's buffers: int32 offsets, characters, validity bits.
struct Strings {
  std::vector<int32_t> offsets{0};
  std::string chars;
  std::vector<uint8_t> bits;
  explicit Strings(size_t n) : bits((n + 7) / 8) {}
  void add(size_t i, const std::string* s) {
    if (s) chars += *s, bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    offsets.push_back(static_cast<int32_t>(chars.size()));
  }
  PyObject* take() {
    return Py_BuildValue("NNN", bytes_of(offsets), PyBytes_FromStringAndSize(chars.data(), chars.size()),
                         bytes_of(bits));
  }
};

// args_json(n, records, at, names) -> the argument column as Strings' buffers (offsets,
// characters, validity bits): row i's call's JSON from its record at offset at[i] of the
// records (-1: none), as take_columns gives them; names: take_columns' names. Called by the
// dump writer's thread; the JSON is written with the GIL released.
PyObject* py_args_json(PyObject*, PyObject* a) {
  Py_ssize_t n;
  PyObject *records, *at, *list;
  if (!PyArg_ParseTuple(a, "nSSO!", &n, &records, &at, &PyList_Type, &list)) return nullptr;
  if (n < 0 || PyBytes_GET_SIZE(at) != n * static_cast<Py_ssize_t>(sizeof(int32_t))) {
    PyErr_SetString(PyExc_ValueError, "args_json: one int32 offset a row is expected");
    return nullptr;
  }
  std::vector<std::string_view> names(static_cast<size_t>(PyList_GET_SIZE(list)));
  for (size_t i = 0; i < names.size(); ++i) {
    Py_ssize_t len;
    PyObject* s = PyList_GET_ITEM(list, static_cast<Py_ssize_t>(i));
    const char* c = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &len) : nullptr;
    if (!c) return PyErr_Occurred() ? nullptr : (PyErr_SetString(PyExc_TypeError, "names: str expected"), nullptr);
    names[i] = std::string_view(c, static_cast<size_t>(len));
  }
  const char* base = PyBytes_AS_STRING(records);
  const Py_ssize_t size = PyBytes_GET_SIZE(records);
  const char* rows_at = PyBytes_AS_STRING(at);
  Strings out(static_cast<size_t>(n));
  Py_BEGIN_ALLOW_THREADS
  std::string doc;
  int32_t last = -1;
  for (Py_ssize_t i = 0; i < n; ++i) {
    int32_t r;
    std::memcpy(&r, rows_at + i * sizeof r, sizeof r);
    if (r < 0 || r >= size) {
      out.add(static_cast<size_t>(i), nullptr);
      continue;
    }
    if (r != last) doc.clear(), format_call(doc, base + r, base + size, names), last = r;
    out.add(static_cast<size_t>(i), &doc);
  }
  Py_END_ALLOW_THREADS
  return out.take();
}

// The data columns of row i: its shard (index among the step's shards, -1: none) and the key
// and view strings.
int data_of(const Row& r, size_t i, Strings& keys, Strings& geometry) {
  bool stored = r.shard >= 0 && static_cast<size_t>(r.shard) < shard_names.size() && shard_names[r.shard];
  std::string key = stored ? "r" + std::to_string(r.key) : std::string();
  keys.add(i, stored ? &key : nullptr);
  geometry.add(i, r.view >= 0 ? &views_json[r.view] : nullptr);
  return stored ? r.shard : -1;
}

// take_columns() -> the step's rows as columns, ready for Arrow without a Python object per
// value (see native/table.py, Columns): (n, ints, strs, names, args, shape_offsets,
// shape_values, stats_f, stats_i, stats_valid, slow_links, keys, views). ints: int64 id, seq,
// call, slot, numel, producer (-1: none), column after column; strs: int32 indices into names
// (-1: none) of phase, module, op, io, arg, dtype, device, param, fwd_op, node, note, data;
// stats_f: float64 min..absmax; stats_i: uint64 nan, inf, zeros, hash; stats_valid: one byte
// per row, bit i set when statistic i (STAT_NAMES order) has a value; args: (the step's argument
// records, int32 offset of each row's record or -1), made a string column by args_json; keys,
// views: string columns (Strings); names: one list object for as long as it holds the same names. The step's last shard is handed over first; the step's state is cleared.
PyObject* py_take_columns(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  flush_shard();
  resolve_links();
  size_t n = rows.size();
  int fixed = static_cast<int>(names.size());  // phase, io and "cpu" texts follow the names
  Column<int64_t> ints(n * 6);
  Column<int32_t> strs(n * 12), offsets(n + 1);
  Column<double> sf(n * 6);
  Column<uint64_t> si(n * 4);
  Column<uint16_t> valid(n);
  Column<int32_t> args(n);  // the call's record in args_bin on each of its rows (-1: none): JSON on the writer's thread
  if (!ints.p || !strs.p || !offsets.p || !sf.p || !si.p || !valid.p || !args.p) return nullptr;  // no memory: the error is set
  Strings keys(n), geometry(n);
  std::vector<int64_t> shape;
  std::vector<int> by_slot;  // the step's dtypes in order of first use
  int slot_of[256];          // dtype (a c10::ScalarType, < 256) -> its place among them, -1: none yet
  std::fill(std::begin(slot_of), std::end(slot_of), -1);
  PyObject* links = PyList_New(0);
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    int64_t iv[6] = {r.id, r.seq, r.call, r.slot, r.numel, r.producer};
    for (int c = 0; c < 6; ++c) ints.p[c * n + i] = iv[c];
    int32_t sv[11] = {fixed + 3 + r.phase, r.module < 0 ? fixed + 7 : r.module, r.op, fixed + IO_TEXT_AT[r.io], r.arg, -1, r.device < 0 ? fixed + 6 : r.device,
                      r.param, r.fwd, r.node, r.note};
    for (int c = 0; c < 11; ++c) strs.p[c * n + i] = sv[c];
    int& slot = slot_of[r.dtype & 255];
    if (slot < 0) slot = static_cast<int>(by_slot.size()), by_slot.push_back(r.dtype);
    strs.p[5 * n + i] = fixed + 9 + slot;  // the step's dtype names follow the fixed texts
    offsets.p[i] = static_cast<int32_t>(shape.size());
    shape.insert(shape.end(), r.shape.begin(), r.shape.end());
    uint16_t bits = 0;
    bool have = r.stats == HAVE, empty = r.numel == 0;
    for (int c = 0; c < 6; ++c) {
      sf.p[c * n + i] = have ? r.st[c] : 0.0;
      if (have && (!empty || c == 4)) bits |= 1u << c;
    }
    for (int c = 0; c < 4; ++c) {
      si.p[c * n + i] = !have || (empty && c < 3) ? 0 : r.cnt[c];
      if (have) bits |= 1u << (6 + c);
    }
    valid.p[i] = bits;
    strs.p[11 * n + i] = data_of(r, i, keys, geometry);
    args.p[i] = r.args;
    if (r.link >= 0 && rows[r.link].stats == SLOW) {
      PyObject* pair = Py_BuildValue("nn", static_cast<Py_ssize_t>(i), static_cast<Py_ssize_t>(r.link));
      PyList_Append(links, pair);
      Py_DECREF(pair);
    }
  }
  offsets.p[n] = static_cast<int32_t>(shape.size());
  PyObject* dict = names_list(by_slot);
  int shards_at = static_cast<int>(PyList_GET_SIZE(dict));  // the step's shard names follow
  if (!shard_names.empty()) {  // a list of the step's own (the names' list is shared by later steps)
    PyObject* own = PyList_GetSlice(dict, 0, shards_at);
    Py_DECREF(dict);
    dict = own;
  }
  for (const auto& name : shard_names) {
    PyObject* o = PyUnicode_FromString(name ? name->c_str() : "");
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  for (size_t i = 0; i < n; ++i)
    if (strs.p[11 * n + i] >= 0) strs.p[11 * n + i] += shards_at;
  PyObject* out = Py_BuildValue("nNNN(NN)NNNNNNNN", static_cast<Py_ssize_t>(n), ints.take(), strs.take(), dict,
                                PyBytes_FromStringAndSize(args_bin.data(), static_cast<Py_ssize_t>(args_bin.size())),
                                args.take(), offsets.take(), bytes_of(shape), sf.take(), si.take(),
                                valid.take(), links, keys.take(), geometry.take());
  clear_step();
  return out;
}

}  // namespace
