// Full tensors of the native dump (data="tensor"; included by dumpobs.cpp inside its anonymous
// namespace). A measured tensor's bytes are copied at the op, right after the statistics pass read
// them (they are in cache), into the step's open shard: chunks of pooled memory that hold the
// shard's data in file order, and its safetensors header, built here. A shard that reaches
// shard_mb is handed to Python at once (back-pressure and bounded memory are the writer's), the
// last one when the step's rows are taken: one call of the `shard` hook per shard
// (DumpWriter.add_shard), no Python object or call per tensor. The file is the chunks one after
// the other, cut to its size: every chunk starts at a multiple of ALIGN bytes of the file and of
// memory, and is a multiple of ALIGN long, so that the writer can write them with O_DIRECT (no
// copy into the page cache: on a machine of few cores that copy competes with training).

// ---- pooled memory chunks, handed to Python as read-only buffers -----------------------------
constexpr size_t CHUNK = size_t(8) << 20, ALIGN = 4096;
std::mutex pool_mu;
std::vector<char*> pool;  // free chunks, their pages touched already (a fresh page costs a fault)
size_t g_pool_size = 0;   // chunks the pool may keep during tensor steps: what the writer may hold at once
size_t g_pool_keep = 0;   // chunks it may keep now: g_pool_size in a tensor step, else 0 (returned)
int64_t g_chunks_live = 0;  // chunks allocated and not freed (in a shard, the writer's queue or the pool)

// A chunk's memory straight from the kernel (mmap), 2 MB aligned: freed, it goes back to the
// system at once (malloc would keep chunks this size in its heap after the first free).
constexpr size_t HUGE = size_t(2) << 20;
char* chunk_map() {
  void* p = mmap(nullptr, CHUNK + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  uintptr_t start = reinterpret_cast<uintptr_t>(p), at = (start + HUGE - 1) / HUGE * HUGE;
  if (at > start) munmap(p, at - start);
  if (at + CHUNK < start + CHUNK + HUGE) munmap(reinterpret_cast<void*>(at + CHUNK), start + HUGE - at);
  return reinterpret_cast<char*>(at);
}

void chunk_unmap(char* p) { munmap(p, CHUNK); }

char* chunk_new() {
  {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (!pool.empty()) {
      char* p = pool.back();
      pool.pop_back();
      return p;
    }
  }
  char* p = chunk_map();
  {
    std::lock_guard<std::mutex> lock(pool_mu);
    ++g_chunks_live;
  }
#ifdef MADV_HUGEPAGE
  madvise(p, CHUNK, MADV_HUGEPAGE);  // a fault per 2 MB instead of per 4 kB, where the kernel allows
#endif
  return p;
}

void chunk_release(char* p) {
  std::lock_guard<std::mutex> lock(pool_mu);
  if (pool.size() < g_pool_keep) {
    pool.push_back(p);
    return;
  }
  --g_chunks_live;
  chunk_unmap(p);
}

// The pool keeps its chunks (on: a tensor step runs) or returns them to the system now, and
// each chunk the writer lets go of later (off: between tensor steps, nothing idle is held).
void pool_keep(bool on) {
  std::lock_guard<std::mutex> lock(pool_mu);
  g_pool_keep = on ? g_pool_size : 0;
  while (pool.size() > g_pool_keep) {
    chunk_unmap(pool.back());
    pool.pop_back();
    --g_chunks_live;
  }
}

void pool_clear() {
  pool_keep(false);
}

struct ChunkObject {  // one chunk of a shard's file, owned by Python once handed over
  PyObject_HEAD char* data;
  Py_ssize_t size;
  bool pooled;  // a data chunk (else the header's own memory)
};

int chunk_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  auto* c = reinterpret_cast<ChunkObject*>(self);
  return PyBuffer_FillInfo(view, self, c->data, c->size, 1, flags);
}

void chunk_dealloc(PyObject* self) {
  auto* c = reinterpret_cast<ChunkObject*>(self);
  if (c->data && c->pooled) chunk_release(c->data);
  else std::free(c->data);
  Py_TYPE(self)->tp_free(self);
}

PyBufferProcs chunk_procs = {chunk_getbuffer, nullptr};
PyTypeObject ChunkType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool chunk_type_ready() {
  ChunkType.tp_name = "_opscope_dump.Chunk";
  ChunkType.tp_basicsize = sizeof(ChunkObject);
  ChunkType.tp_flags = Py_TPFLAGS_DEFAULT;
  ChunkType.tp_dealloc = chunk_dealloc;
  ChunkType.tp_as_buffer = &chunk_procs;
  ChunkType.tp_doc = "bytes of a tensor shard, in file order (read-only buffer)";
  return PyType_Ready(&ChunkType) == 0;
}

// ---- the step's open shard -------------------------------------------------------------------
struct OpenShard {
  std::vector<char*> chunks;
  size_t used = 0;      // bytes in the last chunk
  size_t bytes = 0;     // data bytes in all
  int count = 0;        // tensors
  std::string entries;  // the header's entries, comma-separated
};
OpenShard g_shard;
int64_t g_shard_bytes = int64_t(256) << 20;
std::vector<std::optional<std::string>> shard_names;  // the step's shards handed over (nullopt: not written)

void append(const char* src, size_t n) {
  while (n) {
    if (g_shard.chunks.empty() || g_shard.used == CHUNK) {
      g_shard.chunks.push_back(chunk_new());
      g_shard.used = 0;
    }
    size_t k = std::min(n, CHUNK - g_shard.used);
    std::memcpy(g_shard.chunks.back() + g_shard.used, src, k);
    g_shard.used += k, g_shard.bytes += k, src += k, n -= k;
  }
}

void async_finish();
namespace device_stats {
void finish();
void drop();
}  // namespace device_stats

void drop_shard() {  // (a step cleared: its pending statistics are dropped too)
  async_finish();
  device_stats::drop();
  for (char* p : g_shard.chunks) chunk_release(p);
  g_shard = OpenShard();
}

size_t aligned(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

PyObject* chunk_object(char* data, size_t size, bool pooled) {  // a new reference, or null
  auto* c = PyObject_New(ChunkObject, &ChunkType);
  if (!c) {
    if (pooled) chunk_release(data);
    else std::free(data);
    return nullptr;
  }
  c->data = data, c->size = static_cast<Py_ssize_t>(size), c->pooled = pooled;
  return reinterpret_cast<PyObject*>(c);
}

// The file's first chunk: the header's length (8 bytes, little-endian) and the header as the
// Python writer writes it (json.dumps, separators "," and ":"), padded with spaces (which
// safetensors allows) up to a multiple of ALIGN.
PyObject* header_chunk() {
  std::string h = "{" + g_shard.entries + "}";
  h.append(aligned(8 + h.size()) - 8 - h.size(), ' ');
  void* p = nullptr;
  if (posix_memalign(&p, ALIGN, 8 + h.size()) != 0) throw std::bad_alloc();
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) static_cast<unsigned char*>(p)[i] = static_cast<unsigned char>(n >> (8 * i));
  std::memcpy(static_cast<char*>(p) + 8, h.data(), h.size());
  return chunk_object(static_cast<char*>(p), 8 + h.size(), false);
}

// Hand the open shard to Python (with the GIL): the `shard` hook queues its chunks (header
// first; the last one ends at a multiple of ALIGN, past the data) on the writer, with the
// file's size and its data bytes, and returns its file name (None: not written, the writer
// failed).
void hook_failed(const char* hook);
void flush_shard() {
  async_finish();  // the worker's statistics into their rows first (at the step's end, before its rows are taken)
  device_stats::finish();  // and the device's
  if (!g_shard.count) return;
  size_t index = shard_names.size();
  shard_names.emplace_back(std::nullopt);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* chunks = PyList_New(0);
  PyObject* head = header_chunk();
  size_t size = head ? static_cast<size_t>(reinterpret_cast<ChunkObject*>(head)->size) + g_shard.bytes : 0;
  if (head) PyList_Append(chunks, head), Py_DECREF(head);
  size_t left = g_shard.bytes;
  for (char* p : g_shard.chunks) {
    size_t n = std::min(left, CHUNK);
    left -= n;
    if (PyObject* c = chunk_object(p, aligned(n), true)) PyList_Append(chunks, c), Py_DECREF(c);
  }
  g_shard.chunks.clear();
  PyObject* r = !head || PyErr_Occurred() ? nullptr
                                          : PyObject_CallMethod(g_hooks, "shard", "LOKK", static_cast<long long>(g_step),
                                                                chunks, static_cast<unsigned long long>(size),
                                                                static_cast<unsigned long long>(g_shard.bytes));
  if (r && PyUnicode_Check(r)) shard_names[index] = std::string(PyUnicode_AsUTF8(r));
  if (!r && PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {  // Ctrl-C while the writer's queue was full:
    PyErr_Clear();                                               // the user's, raised at Python's next check
    PyErr_SetInterrupt();
  } else if (!r) {
    hook_failed("tensor shard");
  }
  Py_XDECREF(r);
  Py_DECREF(chunks);
  PyGILState_Release(gil);
  g_shard = OpenShard();
}

// ---- storing a tensor ------------------------------------------------------------------------
const char* st_dtype(at::ScalarType s) {  // safetensors' dtype names (safetensors_io.DTYPES)
  switch (s) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kFloat8_e4m3fn: return "F8_E4M3";
    case at::kFloat8_e5m2: return "F8_E5M2";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kUInt16: return "U16";
    case at::kUInt32: return "U32";
    case at::kUInt64: return "U64";
    case at::kBool: return "BOOL";
    default: return nullptr;
  }
}

// Start a tensor of n bytes: a full shard is handed over first (a tensor larger than a shard
// gets one of its own, as DumpWriter.add_tensor does). Returns its offset in the shard.
size_t begin_tensor(size_t n) {
  if (g_shard.count && g_shard.bytes + n > static_cast<size_t>(g_shard_bytes)) flush_shard();
  return g_shard.bytes;
}

void end_tensor(int64_t id, const char* dtype, at::IntArrayRef shape, size_t start) {
  std::string& e = g_shard.entries;
  if (!e.empty()) e += ',';
  e += "\"r" + std::to_string(id) + "\":{\"dtype\":\"" + dtype + "\",\"shape\":[";
  for (size_t i = 0; i < shape.size(); ++i) e += (i ? "," : "") + std::to_string(shape[i]);
  e += "],\"data_offsets\":[" + std::to_string(start) + "," + std::to_string(g_shard.bytes) + "]}";
  ++g_shard.count;
}

// Which shard (of this step) the next tensor goes to, once begin_tensor made room.
int open_shard_index() { return static_cast<int>(shard_names.size()); }
