// The UBA's C++ adapter for the `npu` device (PyTorch's PrivateUse1 key, renamed).
//
// A thin layer, modelled on PyTorch's OpenReg example, with no op logic in it:
//   * an allocator whose buffers come from the emulated chip's device memory (a Python
//     callback into torchfl.runtime.device: aligned, accounted, OOM-checked);
//   * a device guard with one index per chip and a thread-local current device;
//   * the PrivateUse1 hooks (generators, availability, storage resize);
//   * the metadata and copy kernels (empty, empty_strided, as_strided, view, resize_, set_,
//     _copy_from, _local_scalar_dense) reusing ATen's CPU code: emulated device memory is
//     host-addressable.
// Every other op reaches torchfl's Python fallback, which plans it with the SME; the
// functional ops the rule packs name are registered here instead (the fast path below): a
// signature seen before finds its route's runner in a C++ map, the rest go to the same Python
// router as the fallback's.
#include <torch/extension.h>
#include <torch/library.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>

#include <ATen/EmptyTensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/CallOnce.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torchfl_npu {
namespace {

constexpr auto kNpu = c10::DeviceType::PrivateUse1;

// Python callbacks (set once by torchfl.runtime.eager.device): malloc(index, nbytes) -> int,
// free(address) -> None, device_count() -> int. Leaked on purpose: they must outlive every
// tensor, including those freed while the interpreter shuts down.
PyObject* py_malloc = nullptr;
PyObject* py_free = nullptr;
PyObject* py_count = nullptr;
PyObject* py_oom = nullptr;   // the Python exception type that means out of memory
PyObject* py_layout = nullptr;  // default_layout(index) -> list of 4 ints (physical order) or []
PyObject* py_sync = nullptr;    // lazy mode: run the recorded ops before the host reads a tensor
std::atomic<bool> lazy_pending{false};
// kept parameters (kept.py): storages whose bytes kernels keep derived copies of; a copy into
// one (``p.data.copy_(...)``: no version bump on ``p``) tells Python first, which drops them
PyObject* py_written = nullptr;
std::mutex kept_mutex;
std::unordered_set<uintptr_t> kept_storages;
std::atomic<bool> any_kept{false};

void notify_written(const at::Tensor& dst) {
  if (!any_kept.load() || py_written == nullptr) return;
  const auto address = reinterpret_cast<uintptr_t>(dst.storage().data_ptr().get());
  {
    std::lock_guard<std::mutex> lock(kept_mutex);
    if (kept_storages.count(address) == 0) return;
  }
  py::gil_scoped_acquire gil;
  py::reinterpret_borrow<py::object>(py_written)(static_cast<uint64_t>(address));
}

void set_kept(uint64_t address, bool kept) {
  std::lock_guard<std::mutex> lock(kept_mutex);
  if (kept) {
    kept_storages.insert(static_cast<uintptr_t>(address));
  } else {
    kept_storages.erase(static_cast<uintptr_t>(address));
  }
  any_kept.store(!kept_storages.empty());
}

void set_written_callback(py::object fn) {
  Py_XINCREF(fn.ptr());
  py_written = fn.ptr();
}

void sync_if_lazy() {
  if (!lazy_pending.load() || py_sync == nullptr) return;
  py::gil_scoped_acquire gil;
  lazy_pending.store(false);
  py::reinterpret_borrow<py::object>(py_sync)();
}

std::atomic<int> device_count_cache{-1};
thread_local c10::DeviceIndex current_index = 0;
std::mutex count_error_mutex;
std::string count_error;          // why the device list could not be read (empty: it could)
std::atomic<bool> count_warned{false};

std::string last_count_error() {
  std::lock_guard<std::mutex> lock(count_error_mutex);
  return count_error;
}

// The message of the Python error now set (and cleared), for a one-line report.
std::string take_python_error() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  std::string msg = "unknown error";
  if (value != nullptr) {
    PyObject* s = PyObject_Str(value);
    if (s != nullptr) {
      const char* text = PyUnicode_AsUTF8(s);
      if (text != nullptr) msg = text;
      Py_DECREF(s);
    }
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return msg;
}

c10::DeviceIndex device_count() noexcept {
  int n = device_count_cache.load();
  if (n >= 0) return static_cast<c10::DeviceIndex>(n);
  if (py_count == nullptr || !Py_IsInitialized()) return 0;
  py::gil_scoped_acquire gil;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* res = PyObject_CallNoArgs(py_count);
  int count = 0;
  if (res != nullptr) {
    count = static_cast<int>(PyLong_AsLong(res));
    Py_DECREF(res);
    if (count < 0) count = 0;
    device_count_cache.store(count);
    PyErr_Clear();
  } else {
    // The device list could not be read (a TORCHFL_DEVICES naming chips the registry lacks,
    // a registry that cannot be opened). This function must stay noexcept: c10's
    // DeviceGuardImplInterface::deviceCount is, and torch calls it from the autograd engine
    // and torch.accelerator, where an exception would terminate the process. So it answers
    // 0 devices here, but not silently: the reason is warned once (RuntimeWarning), kept for
    // the "npu:N does not exist" error of any npu tensor, and the Python entry points
    // (torch.npu.device_count, is_available for anything but an unreadable registry, the
    // first allocation) raise the error itself. Not cached: a later call reads again.
    std::string msg = take_python_error();
    {
      std::lock_guard<std::mutex> lock(count_error_mutex);
      count_error = msg;
    }
    if (!count_warned.exchange(true)) {
      std::string warning = "torchfl npu: no devices in this process: " + msg;
      if (PyErr_WarnEx(PyExc_RuntimeWarning, warning.c_str(), 1) < 0) PyErr_Clear();  // -W error: still 0
    }
  }
  PyErr_Restore(type, value, tb);
  return static_cast<c10::DeviceIndex>(count);
}

void free_buffer(void* ptr) {
  if (ptr == nullptr || py_free == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* res = PyObject_CallFunction(py_free, "K", (unsigned long long)reinterpret_cast<uintptr_t>(ptr));
  if (res == nullptr) {
    PyErr_Print();  // a deleter cannot raise
  } else {
    Py_DECREF(res);
  }
  PyErr_Restore(type, value, tb);
}

struct NpuAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = current_index;
    const c10::Device device(kNpu, index);
    if (nbytes == 0) return {nullptr, nullptr, &free_buffer, device};
    TORCH_CHECK(py_malloc != nullptr, "torchfl npu device: the adapter is loaded but not initialised "
                "(import torchfl.runtime.eager and call register())");
    void* data = nullptr;
    std::string oom;
    {
      py::gil_scoped_acquire gil;
      PyObject* res = PyObject_CallFunction(py_malloc, "iK", (int)index, (unsigned long long)nbytes);
      if (res == nullptr) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        std::string msg = "torchfl npu allocation failed";
        if (value != nullptr) {
          PyObject* s = PyObject_Str(value);
          if (s != nullptr) {
            msg = PyUnicode_AsUTF8(s);
            Py_DECREF(s);
          }
        }
        bool is_oom = type != nullptr && py_oom != nullptr && PyErr_GivenExceptionMatches(type, py_oom);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (is_oom) {
          oom = msg;
        } else {
          TORCH_CHECK(false, msg);
        }
      } else {
        data = reinterpret_cast<void*>(static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(res)));
        Py_DECREF(res);
      }
    }
    TORCH_CHECK_WITH(OutOfMemoryError, oom.empty(), oom);
    TORCH_CHECK(data != nullptr, "torchfl npu: the chip's device memory returned no buffer for ", nbytes, " bytes");
    return {data, data, &free_buffer, device};
  }

  at::DeleterFnPtr raw_deleter() const override { return &free_buffer; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

NpuAllocator npu_allocator;
REGISTER_ALLOCATOR(kNpu, &npu_allocator);

// ------------------------------------------------------------------ device guard

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kNpu;
  NpuGuardImpl() = default;
  explicit NpuGuardImpl(c10::DeviceType t) { TORCH_INTERNAL_ASSERT(t == static_type); }
  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(static_type, current_index); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == static_type, "expected an npu device, got ", d);
    if (d.index() < 0) return;
    if (d.index() < device_count()) {
      current_index = d.index();
      return;
    }
    const std::string why = last_count_error();
    TORCH_CHECK(false, "npu:", (int)d.index(), " does not exist: this process has ", (int)device_count(),
                " npu device(s), one per chip in TORCHFL_DEVICES (or the default registry)",
                why.empty() ? std::string() : " -- the device list could not be read: " + why);
    current_index = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) current_index = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  // the emulated chip runs synchronously: every stream is idle
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void synchronizeEvent(void*) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ------------------------------------------------------------------ hooks

struct NpuGenerator : public at::CPUGeneratorImpl {
  explicit NpuGenerator(c10::DeviceIndex index) {
    device_ = c10::Device(kNpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

std::vector<at::Generator> default_generators;
c10::once_flag generators_once;

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex d) const override { NpuGuardImpl().setDevice(c10::Device(kNpu, d)); }
  c10::DeviceIndex getCurrentDevice() const override { return current_index; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_index;
    NpuGuardImpl().setDevice(c10::Device(kNpu, d));
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  at::Device getDeviceFromPtr(void*) const override { return c10::Device(kNpu, current_index); }
  bool isPinnedPtr(const void*) const override { return false; }
  at::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    c10::call_once(generators_once, [] {
      auto n = device_count();
      default_generators.resize(n);
      for (c10::DeviceIndex i = 0; i < n; i++) {
        default_generators[i] = at::make_generator<NpuGenerator>(i);
        default_generators[i].set_current_seed(67280421310721ULL);
      }
    });
    c10::DeviceIndex i = index < 0 ? current_index : index;
    TORCH_CHECK(i >= 0 && i < (c10::DeviceIndex)default_generators.size(), "npu:", (int)i, " does not exist");
    return default_generators[i];
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return at::make_generator<NpuGenerator>(index); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // like the CPU's resize_bytes: a new buffer from the chip, the old bytes copied over
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize npu storage that is not resizable");
    const c10::DeviceGuard guard(storage.device());
    at::DataPtr fresh = npu_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0 && impl->data() != nullptr) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

int register_hooks() {
  at::RegisterPrivateUse1HooksInterface(new NpuHooks());
  return 0;
}
const int hooks_registered = register_hooks();

// ------------------------------------------------------------------ metadata and copy kernels

constexpr c10::DispatchKeySet npu_keys(c10::DispatchKey::PrivateUse1);

// The chip's default layout (HCD tensor.default_layout, article 3.1) as the physical order
// of a 4-D tensor's logical axes, asked of Python once per device; empty: row-major.
std::mutex layouts_mutex;
std::vector<std::optional<std::vector<int64_t>>> default_layouts;

std::vector<int64_t> default_layout(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(layouts_mutex);
  if (index < 0) index = current_index;
  if ((size_t)index >= default_layouts.size()) default_layouts.resize(index + 1);
  auto& slot = default_layouts[index];
  if (!slot.has_value()) {
    std::vector<int64_t> perm;
    if (py_layout != nullptr) {
      py::gil_scoped_acquire gil;
      try {
        perm = py::reinterpret_borrow<py::object>(py_layout)(index).cast<std::vector<int64_t>>();
      } catch (py::error_already_set& e) {
        TORCH_CHECK(false, "torchfl npu: the default layout of npu:", (int)index, " is unknown: ", e.what());
      }
    }
    slot = perm;
  }
  return *slot;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.is_privateuseone(), "npu empty called for ", dev);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "npu tensors are strided");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pin_memory applies to CPU tensors only");
  const c10::DeviceGuard guard(dev);
  if (!memory_format.has_value() && size.size() == 4) {
    // no layout asked for: the chip's default one
    auto perm = default_layout(dev.index());
    if (perm.size() == 4) {
      std::vector<int64_t> stride(4);
      int64_t step = 1;
      for (int i = 3; i >= 0; i--) {
        stride[perm[i]] = step;
        step *= std::max<int64_t>(size[perm[i]], 1);
      }
      return at::detail::empty_strided_generic(size, stride, &npu_allocator, npu_keys, c10::dtype_or_default(dtype));
    }
  }
  return at::detail::empty_generic(size, &npu_allocator, npu_keys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.is_privateuseone(), "npu empty_strided called for ", dev);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "npu tensors are strided");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pin_memory applies to CPU tensors only");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, &npu_allocator, npu_keys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::cpu::as_strided(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  return at::cpu::set_(self, source, offset, size, stride);
}

at::Tensor& set_storage_only(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor as_host(const at::Tensor& t) {
  // the same bytes, seen as a CPU tensor (emulated device memory is host memory)
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "npu copy: undefined tensor");
  sync_if_lazy();
  if (dst.numel() == 0) return dst;
  at::Tensor src = self.is_privateuseone() ? as_host(self) : self;
  if (dst.is_privateuseone()) {
    notify_written(dst);
    at::Tensor target = as_host(dst);
    at::native::copy_(target, src, non_blocking);
  } else {
    at::native::copy_(const_cast<at::Tensor&>(dst), src, non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  sync_if_lazy();
  return at::native::_local_scalar_dense_cpu(as_host(self));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_storage_only);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
}


// ------------------------------------------------------------------ the fast path
//
// One boxed C++ kernel serves every functional op the rule packs name (registered by
// install_fast). It computes the call's route key in C++ -- the op, grad mode, inside a
// backward or not, the raw TORCHFL_STRICT / TORCHFL_PRECISION values, and per argument its
// kind and value (tensors: device, dtype, sizes, strides, requires_grad, Python type, the
// Python type of a view's base, aliasing) -- a key at least as fine as the Python router's
// fast key (ops.fast_key), so one C++ entry never stands for two Python routes. A hit calls
// the entry's runner (ChipRoute.fast: the bound kernel on the inputs' buffers) with the tensor
// arguments and makes the output tensor here over the buffer it returns. A miss, a runner
// that declines (None), lazy mode, an optimizer step or an argument the key cannot express
// goes to the Python router (routing._fast_miss: exactly what the PrivateUse1 fallback runs),
// which hands back the route's runner once its direct form is prepared; the entry caches it.
// What a route is stays Python's (routes.ChipRoute); the map keeps a handle to its runner.

thread_local int bypass_depth[2] = {0, 0};   // this thread's lazy-mode and optimizer-step depths

struct FastEntry {
  PyObject* run = nullptr;           // new reference; null: no runner yet (the router was asked `asked` times)
  int asked = 0;
  PyObject* meta = nullptr;          // the last output meta seen (sizes, strides, dtype, index)
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  c10::DeviceIndex index = 0;
  FastEntry() = default;
  FastEntry(const FastEntry&) = delete;
  FastEntry& operator=(const FastEntry&) = delete;
  ~FastEntry() {   // dropped with the GIL held (fast_clear, the kernel's own scope)
    Py_XDECREF(run);
    Py_XDECREF(meta);
  }
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t w : k) {
      h ^= static_cast<uint64_t>(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// Guarded by the GIL. Never destroyed: its Python references must not be released after
// the interpreter is gone.
auto& fast_map = *new std::unordered_map<std::vector<int64_t>, std::shared_ptr<FastEntry>, KeyHash>();
PyObject* py_miss = nullptr;         // routing._fast_miss(op, args, kwargs, want) -> (result, runner|None)
uint64_t fast_hits = 0, fast_misses = 0, fast_declined = 0, fast_unkeyed = 0;
constexpr size_t kMaxEntries = 1 << 16;   // signatures kept before the map starts over

int64_t env_word(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  return static_cast<int64_t>(std::hash<std::string_view>()(std::string_view(v)) | 1);
}

bool env_lazy() {
  const char* v = std::getenv("TORCHFL_LAZY");
  if (v == nullptr) return false;
  for (; *v == ' ' || *v == '\t'; v++) {}
  return *v != '\0' && *v != '0' && *v != 'n' && *v != 'N' && *v != 'f' && *v != 'F' &&
         !((v[0] == 'o' || v[0] == 'O') && (v[1] == 'f' || v[1] == 'F'));
}

// The route key of the call on the stack, and its tensor arguments as Python objects (new
// references, appended to objs). False: an argument the key does not express (a tensor list,
// a string...): the call goes to Python and is not cached.
bool route_key(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n, std::vector<int64_t>& key,
               std::vector<PyObject*>& objs, std::vector<const c10::TensorImpl*>& impls) {
  key.push_back(reinterpret_cast<int64_t>(&op.schema()));
  key.push_back((c10::GradMode::is_enabled() ? 1 : 0) | (torch::autograd::get_current_node() ? 2 : 0));
  key.push_back(env_word("TORCHFL_STRICT"));
  key.push_back(env_word("TORCHFL_PRECISION"));
  auto args = torch::jit::last(*stack, n);
  for (size_t i = 0; i < n; i++) {
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {            // an absent optional tensor (convolution's bias): Python gets None
        key.push_back(2);
        continue;
      }
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      if (impl->is_wrapped_number()) {
        // `x * 0.5`: a Python number torch wrapped as a 0-dim CPU tensor. Python kernels get it
        // back as the number (toPyObject), so the router's key holds its value: so must this one
        if (!t.device().is_cpu() || t.dim() != 0) return false;
        key.push_back(7);
        key.push_back(static_cast<int64_t>(t.scalar_type()));
        int64_t bits = 0;
        switch (t.scalar_type()) {
          case at::kDouble: std::memcpy(&bits, t.const_data_ptr<double>(), sizeof(double)); break;
          case at::kLong: bits = *t.const_data_ptr<int64_t>(); break;
          case at::kBool: bits = *t.const_data_ptr<bool>() ? 1 : 0; break;
          default: return false;       // complex numbers: the router decides
        }
        key.push_back(bits);
        continue;
      }
      int64_t alias = -1;
      for (size_t j = 0; j < impls.size(); j++) {
        if (impls[j] == impl) alias = static_cast<int64_t>(j);
      }
      impls.push_back(impl);
      PyObject* obj = THPVariable_Wrap(t);
      if (obj == nullptr) throw python_error();
      objs.push_back(obj);
      const auto dev = t.device();
      key.push_back(1);
      key.push_back((static_cast<int64_t>(dev.type()) << 16) | (static_cast<int64_t>(dev.index()) & 0xffff));
      key.push_back(static_cast<int64_t>(t.scalar_type()));
      key.push_back(alias);
      key.push_back(t.requires_grad() ? 1 : 0);
      key.push_back(reinterpret_cast<int64_t>(Py_TYPE(obj)));
      int64_t base_type = 0;
      if (t.is_view()) {
        PyObject* b = t._base().unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
        base_type = b == nullptr ? 1 : reinterpret_cast<int64_t>(Py_TYPE(b));
      }
      key.push_back(base_type);
      const int64_t dim = t.dim();
      key.push_back(dim);
      for (int64_t d = 0; d < dim; d++) key.push_back(t.sizes()[d]);
      for (int64_t d = 0; d < dim; d++) key.push_back(t.strides()[d]);
    } else if (v.isNone()) {
      key.push_back(2);
    } else if (v.isBool()) {
      key.push_back(3);
      key.push_back(v.toBool() ? 1 : 0);
    } else if (v.isInt() || v.isSymInt()) {
      int64_t value;
      if (v.isInt()) {
        value = v.toInt();
      } else {
        auto concrete = v.toSymInt().maybe_as_int();
        if (!concrete.has_value()) return false;
        value = *concrete;
      }
      key.push_back(4);
      key.push_back(value);
    } else if (v.isDouble()) {
      key.push_back(5);
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);   // NaN equals itself, -0.0 is not 0.0 (as the Python key)
      key.push_back(bits);
    } else if (v.isIntList()) {
      key.push_back(6);
      auto list = v.toIntList();
      key.push_back(static_cast<int64_t>(list.size()));
      for (int64_t x : list) key.push_back(x);
    } else if (v.isList()) {           // SymInt[] (convolution's stride, padding...): concrete ints only
      key.push_back(6);
      auto list = v.toListRef();
      key.push_back(static_cast<int64_t>(list.size()));
      for (const c10::IValue& x : list) {
        if (x.isInt()) {
          key.push_back(x.toInt());
        } else if (x.isSymInt()) {
          auto concrete = x.toSymInt().maybe_as_int();
          if (!concrete.has_value()) return false;
          key.push_back(*concrete);
        } else {
          return false;
        }
      }
    } else {
      return false;
    }
  }
  return true;
}

void release(std::vector<PyObject*>& objs) {
  for (PyObject* o : objs) Py_DECREF(o);
  objs.clear();
}

// The tensor arguments' Python objects, released however the kernel ends (GIL held: declared
// after the kernel's gil_scoped_acquire).
struct PyRefs {
  std::vector<PyObject*> v;
  ~PyRefs() { release(v); }
};

// The output of a runner's (address, nbytes, meta) as an npu tensor owning the buffer.
at::Tensor adopt_output(FastEntry& e, PyObject* res) {
  const uint64_t address = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(res, 0));
  const int64_t nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
  PyObject* meta = PyTuple_GET_ITEM(res, 2);
  if (PyErr_Occurred()) throw python_error();
  if (meta != e.meta) {        // (sizes, strides, dtype, index): the runner keeps one per output shape
    auto m = py::reinterpret_borrow<py::tuple>(meta);
    e.sizes = m[0].cast<std::vector<int64_t>>();
    e.strides = m[1].cast<std::vector<int64_t>>();
    TORCH_CHECK(THPDtype_Check(m[2].ptr()), "torchfl npu fast path: the runner's dtype is not a torch.dtype");
    e.dtype = reinterpret_cast<THPDtype*>(m[2].ptr())->scalar_type;
    e.index = static_cast<c10::DeviceIndex>(m[3].cast<int64_t>());
    Py_INCREF(meta);
    Py_XDECREF(e.meta);
    e.meta = meta;
  }
  const c10::Device device(kNpu, e.index);
  void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  c10::DataPtr data(ptr, ptr, &free_buffer, device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &npu_allocator, true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), npu_keys, c10::scalarTypeToTypeMeta(e.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(e.sizes, e.strides, 0);
  return t;
}

// The Python (args, kwargs) of a call on the stack, as torch's Python kernels receive them
// (torch's own parseIValuesToPyArgsKwargs, not exported): trailing positional defaults and
// default keyword-only arguments left out. install_fast registers only ops whose arguments
// toPyObject renders as torch's would (no dtype, layout, memory format or device argument).
std::pair<py::object, py::dict> python_arguments(const c10::OperatorHandle& op, const std::vector<c10::IValue>& arguments) {
  const auto& schema = op.schema();
  auto is_default = [&](size_t idx) -> bool {
    const auto& arg = schema.arguments()[idx];
    if (!arg.default_value().has_value()) return false;
    return *arg.default_value() == arguments[idx];
  };
  int64_t kwarg_only_start = static_cast<int64_t>(arguments.size());
  for (; kwarg_only_start > 0; kwarg_only_start--) {
    if (!schema.arguments()[kwarg_only_start - 1].kwarg_only()) break;
  }
  int64_t positional_default_start = kwarg_only_start;
  for (; positional_default_start > 0; positional_default_start--) {
    if (!is_default(positional_default_start - 1)) break;
  }
  py::tuple args(positional_default_start);
  for (int64_t idx = 0; idx < positional_default_start; idx++) {
    args[idx] = arguments[idx].isNone() ? py::none() : torch::jit::toPyObject(arguments[idx]);
  }
  py::dict kwargs;
  for (size_t idx = kwarg_only_start; idx < arguments.size(); idx++) {
    if (is_default(idx)) continue;
    kwargs[py::str(schema.arguments()[idx].name())] =
        arguments[idx].isNone() ? py::none() : torch::jit::toPyObject(arguments[idx]);
  }
  return {std::move(args), std::move(kwargs)};
}

// A Python kernel's result onto the stack (torch's pushPyOutToStack, not exported).
void push_python_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, py::handle out) {
  const auto& returns = op.schema().returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].real_type()));
  } else if (returns.size() > 1) {
    auto items = py::reinterpret_borrow<py::sequence>(out);
    TORCH_CHECK(items.size() == returns.size(), "torchfl npu: ", op.schema().name(), " returned ", items.size(),
                " values, its schema ", returns.size());
    for (size_t i = 0; i < returns.size(); i++) {
      stack->push_back(torch::jit::toIValue(py::object(items[i]), returns[i].real_type()));
    }
  }
}

struct FastKernel final : public c10::OperatorKernel {
  PyObject* py_op;   // the op the Python router runs (convolution_overrideable: aten.convolution)
  explicit FastKernel(PyObject* op) : py_op(op) { Py_INCREF(op); }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    py::gil_scoped_acquire gil;
    // locals, not thread-locals: the Python calls below may run other npu ops on this thread
    // (the router's executor, a view's wrapping), which re-enter this kernel
    std::vector<int64_t> key;
    PyRefs refs;
    std::vector<PyObject*>& objs = refs.v;
    std::vector<const c10::TensorImpl*> impls;
    key.reserve(48);
    objs.reserve(4);
    impls.reserve(4);
    bool cacheable = bypass_depth[0] == 0 && bypass_depth[1] == 0 && !env_lazy();
    if (cacheable && !route_key(op, stack, n, key, objs, impls)) {
      cacheable = false;
      fast_unkeyed++;
    }
    std::shared_ptr<FastEntry> entry;
    if (cacheable) {
      auto it = fast_map.find(key);
      if (it != fast_map.end()) entry = it->second;
    }
    if (entry && entry->run != nullptr) {
      PyObject* res = PyObject_Vectorcall(entry->run, objs.data(), objs.size(), nullptr);
      release(objs);
      if (res == nullptr) {
        python_error err;
        err.persist();
        throw err;
      }
      if (PyTuple_CheckExact(res) && PyTuple_GET_SIZE(res) == 3) {
        at::Tensor out;
        try {
          out = adopt_output(*entry, res);
        } catch (...) {
          Py_DECREF(res);
          throw;
        }
        Py_DECREF(res);
        fast_hits++;
        torch::jit::drop(*stack, n);
        stack->emplace_back(std::move(out));
        return;
      }
      if (THPVariable_Check(res)) {          // an output that views an input: the runner made it
        at::Tensor out = THPVariable_Unpack(res);
        Py_DECREF(res);
        fast_hits++;
        torch::jit::drop(*stack, n);
        stack->emplace_back(std::move(out));
        return;
      }
      Py_DECREF(res);                        // None: declined (a buffer torch does not own...)
      fast_declined++;
      cacheable = false;
    }
    release(objs);
    fast_misses++;
    std::vector<c10::IValue> arguments(torch::jit::last(*stack, n).begin(), torch::jit::last(*stack, n).end());
    auto [args, kwargs] = python_arguments(op, arguments);
    // a signature whose route had no runner three times (several outputs, a host route...)
    // stops asking for one: the router's lookup of it is a cost of its own
    const bool want = cacheable && !(entry && entry->asked >= 3);
    PyObject* res = PyObject_CallFunction(py_miss, "OOOO", py_op, args.ptr(), kwargs.ptr(), want ? Py_True : Py_False);
    if (res == nullptr) {
      python_error err;
      err.persist();
      throw err;
    }
    auto pair = py::reinterpret_steal<py::object>(res);
    TORCH_CHECK(PyTuple_CheckExact(res) && PyTuple_GET_SIZE(res) == 2,
                "torchfl npu fast path: the router's miss handler must return (result, runner)");
    PyObject* runner = PyTuple_GET_ITEM(res, 1);
    if (want) {
      if (entry) {
        entry->asked++;
      } else {
        if (fast_map.size() >= kMaxEntries) fast_map.clear();
        entry = fast_map[key] = std::make_shared<FastEntry>();
        entry->asked = 1;
      }
      if (runner != Py_None) {
        Py_INCREF(runner);
        entry->run = runner;
      }
    }
    torch::jit::drop(*stack, n);
    push_python_result(op, stack, PyTuple_GET_ITEM(res, 0));
  }
};

std::vector<std::unique_ptr<torch::Library>> fast_libraries;

}  // namespace

// Register the fast kernel for ``ops``: (schema name without "aten::", overload name, the Python
// op the router runs), as the PrivateUse1 kernels of those ops.
void install_fast(std::vector<std::tuple<std::string, std::string, py::object>> ops, py::object miss) {
  if (py_miss == nullptr) {
    Py_INCREF(miss.ptr());
    py_miss = miss.ptr();
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                              __FILE__, __LINE__);
  for (auto& [name, overload, py_op] : ops) {
    const std::string full = overload.empty() ? name : name + "." + overload;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<FastKernel>(py_op.ptr())));
  }
  fast_libraries.push_back(std::move(lib));
}

// Forget every cached runner (the Python routes were cleared).
void fast_clear() { fast_map.clear(); }

py::dict fast_stats() {
  py::dict d;
  d["hits"] = fast_hits;
  d["misses"] = fast_misses;
  d["declined"] = fast_declined;
  d["unkeyed"] = fast_unkeyed;
  d["entries"] = fast_map.size();
  return d;
}

// This thread's lazy-mode depth (which 0) or optimizer-step depth (which 1): the fast path is
// off while either is above 0 (the Python router decides those calls).
void set_bypass(int64_t which, int64_t depth) {
  TORCH_CHECK(which == 0 || which == 1, "set_bypass: which is 0 (lazy) or 1 (optimizer), got ", which);
  bypass_depth[which] = static_cast<int>(depth);
}


// ------------------------------------------------------------------ Python face

void init(py::object malloc_fn, py::object free_fn, py::object count_fn, py::object oom_type,
          py::object layout_fn, py::object sync_fn) {
  Py_XINCREF(sync_fn.ptr());
  py_sync = sync_fn.ptr();
  Py_XINCREF(layout_fn.ptr());
  py_layout = layout_fn.ptr();
  Py_XINCREF(malloc_fn.ptr());
  Py_XINCREF(free_fn.ptr());
  Py_XINCREF(count_fn.ptr());
  Py_XINCREF(oom_type.ptr());
  py_malloc = malloc_fn.ptr();
  py_free = free_fn.ptr();
  py_count = count_fn.ptr();
  py_oom = oom_type.ptr();
}

// A tensor over a buffer the chip's device memory already holds (a kernel's output): the
// tensor owns it from now on and frees it through the same callback as the allocator's.
at::Tensor wrap(uint64_t address, int64_t nbytes, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                int64_t storage_offset, at::ScalarType dtype, int64_t index) {
  const c10::Device device(kNpu, static_cast<c10::DeviceIndex>(index));
  void* ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  c10::DataPtr data(ptr, ptr, &free_buffer, device);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(data), &npu_allocator, true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), npu_keys, c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, storage_offset);
  return t;
}

int64_t current_device() { return current_index; }

// lazy mode: ops were recorded; the next host read of an npu tensor runs them first
void set_lazy_pending(bool pending) { lazy_pending.store(pending); }

void set_device(int64_t index) { NpuGuardImpl().setDevice(c10::Device(kNpu, static_cast<c10::DeviceIndex>(index))); }

int64_t cached_device_count() { return device_count(); }

}  // namespace torchfl_npu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torchfl's npu device adapter (allocator, guard, hooks, copy/view kernels)";
  m.def("init", &torchfl_npu::init);
  m.def("wrap", &torchfl_npu::wrap);
  m.def("current_device", &torchfl_npu::current_device);
  m.def("set_lazy_pending", &torchfl_npu::set_lazy_pending);
  m.def("set_device", &torchfl_npu::set_device);
  m.def("device_count", &torchfl_npu::cached_device_count);
  m.def("install_fast", &torchfl_npu::install_fast);
  m.def("fast_clear", &torchfl_npu::fast_clear);
  m.def("fast_stats", &torchfl_npu::fast_stats);
  m.def("set_bypass", &torchfl_npu::set_bypass);
  m.def("set_kept", &torchfl_npu::set_kept);
  m.def("set_written_callback", &torchfl_npu::set_written_callback);
}
