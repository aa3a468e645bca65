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
// Every other op reaches torchfl's Python fallback, which plans it with the SME.
#include <torch/extension.h>

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
#include <cstring>
#include <mutex>
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

}  // namespace

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
}
