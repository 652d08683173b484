// The step's rows handed to Python as columns (take_columns), and the step's state cleared
// (included by dumpobs_module.h, after everything that makes rows).
namespace {

// Python strings of interned names, made once and shared by every row that holds them
std::vector<PyObject*> py_names;
PyObject* py_text[10] = {nullptr};  // "input" "output" "param" "forward" "backward" "optimizer" "cpu" "" "grad" "recompute"
constexpr int N_TEXT = 10;

PyObject* name_obj(int i) {  // a new reference
  if (i < 0) Py_RETURN_NONE;
  if (static_cast<size_t>(i) >= py_names.size()) py_names.resize(names.size(), nullptr);
  PyObject*& o = py_names[i];
  if (!o) o = PyUnicode_FromString(names[i].c_str());
  Py_INCREF(o);
  return o;
}

const int IO_TEXT_AT[] = {0, 1, 2, 8};     // Io -> its text
const int PHASE_TEXT_AT[] = {3, 4, 5, 9};  // Phase -> its text

PyObject* text(int i) {
  static const char* const t[] = {"input", "output", "param", "forward", "backward", "optimizer", "cpu", "", "grad",
                                  "recompute"};
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
  for (int i = 0; i < N_TEXT; ++i) {  // input output param forward backward optimizer cpu "" grad recompute
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
// no faster on the tiny step or the transformer: docs/dump-performance.md, "The tiny step, third round")
void clear_step() {
  rows.clear(), args_bin.clear(), seq_owner.clear();
  reset_arena();  // flow, geo, views, shared, calls, g_writes
  views_json.clear(), shard_names.clear();
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

// A step's rows as take_columns hands them over: moved out of the observer's state at the step's
// end, made columns later by `build_columns`, which the dump writer's thread calls (the loop over
// the rows without the GIL): the training thread only moves them (a tiny step's ~190 rows took
// ~30 us of its CPU to become columns).
struct StepRows {
  std::vector<Row> rows;
  std::vector<std::string> views;                    // views_json
  std::vector<std::optional<std::string>> shards;    // shard_names
  std::string args;                                  // args_bin
  int fixed = 0, shards_at = 0, n_view = -1;         // names.size(), the shard names' start in `names`, N_VIEW
  bool probe = false;                                // g_probe
  int slot_of[256];                                  // dtype -> its place among the step's dtype names
  PyObject* names = nullptr;                         // the names' list (owned until the columns are built)
  ~StepRows() { Py_XDECREF(names); }                 // (with the GIL: the capsule's destructor, or take_columns)
};

void resolve_links(StepRows& s) {  // sources come first: one pass resolves chains
  std::vector<Row>& rows = s.rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    if (r.same >= 0) {  // the statistics of the same bytes (resolved already: an earlier row)
      const Row& src = rows[r.same];
      r.stats = src.stats;
      std::memcpy(r.st, src.st, sizeof r.st);
      std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
    }
    if (r.link < 0) continue;
    const Row& s0 = rows[r.link];
    // the same tensor's data; an input that is a view recorded earlier has its geometry too
    // (not in a size probe: its views count as what they are, as Recorder counts them)
    if (!s.probe && s0.view >= 0 && r.view < 0 && r.numel == s0.numel && r.shape == s0.shape) r.view = s0.view;
    r.shard = s0.shard, r.key = s0.key;
    // a note travels from the row linked to (an "alias" output, a meta tensor's), as Recorder
    // passes it on: not from the end of the chain
    if (s0.note >= 0 && s0.note != s.n_view && r.note < 0) r.note = s0.note;
    if (s0.link >= 0) r.link = s0.link;
    const Row& src = rows[r.link];
    r.stats = src.stats;
    std::memcpy(r.st, src.st, sizeof r.st);
    std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
    if (src.note == N_UNINITIALIZED) r.note = N_UNINITIALIZED;  // (a view of memory that held no data)
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
int data_of(const StepRows& s, const Row& r, size_t i, Strings& keys, Strings& geometry) {
  bool stored = r.shard >= 0 && static_cast<size_t>(r.shard) < s.shards.size() && s.shards[r.shard];
  std::string key = stored ? "r" + std::to_string(r.key) : std::string();
  keys.add(i, stored ? &key : nullptr);
  geometry.add(i, r.view >= 0 ? &s.views[r.view] : nullptr);
  return stored ? r.shard : -1;
}

// Row i of the step into the columns (see build_columns); without the GIL. A row whose statistics
// are Python's (SLOW) linked to: (i, its source) appended to `slow`.
struct Filled {
  int64_t* ints;
  int32_t* strs;
  int32_t* offsets;
  double* sf;
  uint64_t* si;
  uint16_t* valid;
  int32_t* args;
};

void fill_row(const StepRows& s, size_t i, const Filled& c, std::vector<int64_t>& shape, Strings& keys,
              Strings& geometry, std::vector<std::pair<Py_ssize_t, Py_ssize_t>>& slow) {
  const size_t n = s.rows.size();
  const int fixed = s.fixed;  // phase, io and "cpu" texts follow the names
  const Row& r = s.rows[i];
  int64_t iv[6] = {r.id, r.seq, r.call, r.slot, r.numel, r.producer};
  for (int k = 0; k < 6; ++k) c.ints[k * n + i] = iv[k];
  int32_t sv[11] = {fixed + PHASE_TEXT_AT[r.phase], r.module < 0 ? fixed + 7 : r.module, r.op, fixed + IO_TEXT_AT[r.io], r.arg, -1,
                    r.device < 0 ? fixed + 6 : r.device, r.param, r.fwd, r.node, r.note};
  for (int k = 0; k < 11; ++k) c.strs[k * n + i] = sv[k];
  c.strs[5 * n + i] = fixed + N_TEXT + s.slot_of[r.dtype & 255];  // the step's dtype names follow the fixed texts
  c.offsets[i] = static_cast<int32_t>(shape.size());
  shape.insert(shape.end(), r.shape.begin(), r.shape.end());
  uint16_t bits = 0;
  bool have = r.stats == HAVE, empty = r.numel == 0;
  for (int k = 0; k < 6; ++k) {
    c.sf[k * n + i] = have ? r.st[k] : 0.0;
    if (have && (!empty || k == 4)) bits |= 1u << k;
  }
  for (int k = 0; k < 4; ++k) {
    c.si[k * n + i] = !have || (empty && k < 3) ? 0 : r.cnt[k];
    if (have) bits |= 1u << (6 + k);
  }
  c.valid[i] = bits;
  int shard = data_of(s, r, i, keys, geometry);
  c.strs[11 * n + i] = shard < 0 ? -1 : shard + s.shards_at;  // the step's shard names follow in its names
  c.args[i] = r.args;
  if (r.link >= 0 && s.rows[r.link].stats == SLOW) slow.emplace_back(static_cast<Py_ssize_t>(i), r.link);
}

PyObject* pairs_list(const std::vector<std::pair<Py_ssize_t, Py_ssize_t>>& pairs) {  // [(i, j), ...]
  PyObject* out = PyList_New(0);
  for (auto [i, j] : pairs) {
    PyObject* pair = Py_BuildValue("nn", i, j);
    PyList_Append(out, pair);
    Py_DECREF(pair);
  }
  return out;
}

// columns() of take_columns -> the step's rows as columns, ready for Arrow without a Python
// object per value (see native/table.py, Columns): (n, ints, strs, names, args, shape_offsets,
// shape_values, stats_f, stats_i, stats_valid, slow_links, keys, views). ints: int64 id, seq,
// call, slot, numel, producer (-1: none), column after column; strs: int32 indices into names
// (-1: none) of phase, module, op, io, arg, dtype, device, param, fwd_op, node, note, data;
// stats_f: float64 min..absmax; stats_i: uint64 nan, inf, zeros, hash; stats_valid: one byte
// per row, bit i set when statistic i (STAT_NAMES order) has a value; args: (the step's argument
// records, int32 offset of each row's record or -1), made a string column by args_json; keys,
// views: string columns (Strings); names: one list object for as long as it holds the same names.
// Once per step (the rows are let go).
PyObject* py_build_columns(PyObject* capsule, PyObject*) {
  auto* s = static_cast<StepRows*>(PyCapsule_GetPointer(capsule, "opscope.step_rows"));
  if (!s) return nullptr;
  if (!s->names) {
    PyErr_SetString(PyExc_RuntimeError, "columns(): this step's columns were built already");
    return nullptr;
  }
  PyObject* names = std::exchange(s->names, nullptr);  // taken now: a second call finds none, also while this one runs
  size_t n = s->rows.size();
  // fixed-size columns written straight into the bytes objects Python receives
  Column<int64_t> ints(n * 6);
  Column<int32_t> strs(n * 12), offsets(n + 1);
  Column<double> sf(n * 6);
  Column<uint64_t> si(n * 4);
  Column<uint16_t> valid(n);
  Column<int32_t> args(n);  // the call's record in args on each of its rows (-1: none): JSON by args_json
  if (!ints.p || !strs.p || !offsets.p || !sf.p || !si.p || !valid.p || !args.p) {  // no memory: the error is set
    Py_DECREF(names);
    return nullptr;
  }
  Strings keys(n), geometry(n);
  std::vector<int64_t> shape;
  std::vector<std::pair<Py_ssize_t, Py_ssize_t>> slow;
  Filled c{ints.p, strs.p, offsets.p, sf.p, si.p, valid.p, args.p};
  Py_BEGIN_ALLOW_THREADS
  resolve_links(*s);
  for (size_t i = 0; i < n; ++i) fill_row(*s, i, c, shape, keys, geometry, slow);
  offsets.p[n] = static_cast<int32_t>(shape.size());
  Py_END_ALLOW_THREADS
  PyObject* out = Py_BuildValue("nNNN(NN)NNNNNNNN", static_cast<Py_ssize_t>(n), ints.take(), strs.take(),
                                names,
                                PyBytes_FromStringAndSize(s->args.data(), static_cast<Py_ssize_t>(s->args.size())),
                                args.take(), offsets.take(), bytes_of(shape), sf.take(), si.take(),
                                valid.take(), pairs_list(slow), keys.take(), geometry.take());
  std::vector<Row>().swap(s->rows);  // the step's memory goes now, not with the callable
  std::string().swap(s->args);
  return out;
}

PyMethodDef build_columns_def = {"columns", py_build_columns, METH_NOARGS,
                                 "columns(): the step's rows as columns (see py_build_columns); once"};

void free_step_rows(PyObject* capsule) {
  delete static_cast<StepRows*>(PyCapsule_GetPointer(capsule, "opscope.step_rows"));
}

// take_columns() -> (n, columns): the step's n rows, and a callable that makes them columns
// (py_build_columns; the dump writer's thread calls it). The step's last shard is handed over
// first; the names the columns index are fixed now; the step's state is cleared.
PyObject* py_take_columns(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  flush_shard();
  auto s = std::make_unique<StepRows>();
  s->fixed = static_cast<int>(names.size()), s->probe = g_probe, s->n_view = N_VIEW;
  std::vector<int> by_slot;  // the step's dtypes in order of first use
  std::fill(std::begin(s->slot_of), std::end(s->slot_of), -1);
  for (const Row& r : rows) {
    int& slot = s->slot_of[r.dtype & 255];
    if (slot < 0) slot = static_cast<int>(by_slot.size()), by_slot.push_back(r.dtype);
  }
  PyObject* dict = names_list(by_slot);
  s->shards_at = static_cast<int>(PyList_GET_SIZE(dict));  // the step's shard names follow
  if (!shard_names.empty()) {  // a list of the step's own (the names' list is shared by later steps)
    PyObject* own = PyList_GetSlice(dict, 0, s->shards_at);
    Py_DECREF(dict);
    dict = own;
  }
  for (const auto& name : shard_names) {
    PyObject* o = PyUnicode_FromString(name ? name->c_str() : "");
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  s->names = dict;
  size_t n = rows.size();
  s->rows.swap(rows);
  rows.reserve(n);  // the next step's rows, likely as many
  s->views.swap(views_json), s->shards.swap(shard_names), s->args.swap(args_bin);
  clear_step();
  PyObject* capsule = PyCapsule_New(s.get(), "opscope.step_rows", free_step_rows);
  if (!capsule) return nullptr;
  s.release();
  PyObject* build = PyCFunction_New(&build_columns_def, capsule);
  Py_DECREF(capsule);
  if (!build) return nullptr;
  return Py_BuildValue("nN", static_cast<Py_ssize_t>(n), build);
}

}  // namespace
