/* mllm_kernel.runtime._launch: the launch path of CompiledKernel as a CPython extension.
 *
 * fast_launch(plan, args, stream) takes a default launch (the kernel's own grid, block, shared
 * memory and cluster) from the Python call to cuLaunchKernelEx: it checks each argument against
 * its parameter, builds the launch record on the C stack and calls driver.cpp's C entry point,
 * whose address the driver module hands over once (set_entry). It returns False, having launched
 * nothing, for anything it does not take as is (a NumPy array, a numpy scalar, a value out of
 * range, a tensor of another dtype or device, a kernel not yet loaded on the device, ...): the
 * caller then runs its general path, which converts what can be converted and raises naming the
 * parameter otherwise. launch(record_address) launches a record the general path packed.
 *
 * Built against the stable ABI (abi3): one binary serves CPython 3.10 and later. */
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <structmember.h> /* PyMemberDef, T_OBJECT_EX (the limited API's, before 3.12) */
#include <float.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int (*LaunchEntry)(int64_t record, char* message, size_t capacity);
static LaunchEntry entry = NULL;
static PyObject *s_is_cuda, *s_dtype, *s_get_device, *s_data_ptr, *s_device_index, *s_cuda_stream;

/* The part of DLPack 1.x's C exchange API that the fast path reads (dlpack.h's DLTensor and
 * DLPackExchangeAPI; declared here because the extension builds with Python's headers only).
 * torch >= 2.10 sets one on torch.Tensor as the capsule `__dlpack_c_exchange_api__`: a tensor's
 * device, dtype and data pointer in one C call (four attribute lookups otherwise, 80-100 ns
 * each), and torch's current stream without a Python call. */
enum { kDLCUDA = 2 };
typedef struct {
  int32_t device_type, device_id;
} DLDevice;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct ExchangeHeader {
  uint32_t major, minor;
  struct ExchangeHeader* prev_api;
} ExchangeHeader;
typedef struct {
  ExchangeHeader header;
  void *managed_tensor_allocator, *managed_tensor_from_py_object_no_sync, *managed_tensor_to_py_object_no_sync;
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out); /* may be NULL */
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
} ExchangeAPI;
static const ExchangeAPI* exchange = NULL; /* set_exchange: NULL while unset or unusable */

/* set_exchange(capsule or None) -> whether the fast path now reads tensors through it. */
static PyObject* set_exchange(PyObject* self, PyObject* capsule) {
  (void)self;
  exchange = NULL;
  if (PyCapsule_CheckExact(capsule) && PyCapsule_IsValid(capsule, "dlpack_exchange_api")) {
    const ExchangeHeader* header = (const ExchangeHeader*)PyCapsule_GetPointer(capsule, "dlpack_exchange_api");
    while (header != NULL && header->major > 1) header = header->prev_api; /* a newer table: its 1.x one */
    const ExchangeAPI* api = (const ExchangeAPI*)header;
    if (api != NULL && api->header.major == 1 && api->dltensor_from_py_object_no_sync != NULL &&
        api->current_work_stream != NULL) {
      exchange = api;
    }
  }
  return PyBool_FromLong(exchange != NULL);
}

static uint32_t packed_dtype(DLDataType t) { return (uint32_t)t.code | (uint32_t)t.bits << 8 | (uint32_t)t.lanes << 16; }

/* exchange_dtype(tensor) -> its DLPack dtype packed as code | bits << 8 | lanes << 16, read
 * through the exchange API (what the fast path compares with the plan's accepted dtypes). */
static PyObject* exchange_dtype(PyObject* self, PyObject* tensor) {
  (void)self;
  if (exchange == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "exchange_dtype: no DLPack exchange API set");
    return NULL;
  }
  DLTensor view;
  if (exchange->dltensor_from_py_object_no_sync(tensor, &view) != 0) return NULL;
  return PyLong_FromUnsignedLong(packed_dtype(view.dtype));
}

static PyObject* set_entry(PyObject* self, PyObject* address) {
  (void)self;
  void* pointer = PyLong_AsVoidPtr(address);
  if (pointer == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "set_entry: null entry point");
    return NULL;
  }
  entry = (LaunchEntry)pointer;
  Py_RETURN_NONE;
}

static int call_entry(const char* record, const char* kernel_name) {
  if (entry == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mllm_kernel.runtime._launch: set_entry was not called");
    return -1;
  }
  char message[1024];
  if (entry((int64_t)(intptr_t)record, message, sizeof message) != 0) {
    if (kernel_name != NULL) {
      PyErr_Format(PyExc_RuntimeError, "%s: launch failed: %s", kernel_name, message);
    } else {
      PyErr_SetString(PyExc_RuntimeError, message);
    }
    return -1;
  }
  return 0;
}

static PyObject* launch(PyObject* self, PyObject* record) {
  (void)self;
  long long address = PyLong_AsLongLong(record);
  if (address == -1 && PyErr_Occurred()) return NULL;
  if (call_entry((const char*)(intptr_t)address, NULL) != 0) return NULL;
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------------------------
 * The plan, made once per kernel by kernel.py (_FastPlan.astuple), a tuple:
 *   (name: str, specs: list of bytes or None indexed by device, Tensor type, Stream type,
 *    raw_stream: callable device -> CUstream, dtypes: tuple with, per parameter, None (any
 *    dtype, or not a pointer) or a tuple of accepted torch dtypes, dl_dtypes: None, or the
 *    same per parameter as bytes of packed DLPack dtypes (uint32, exchange_dtype's) when the
 *    tensors are read through the exchange API)
 * A spec (per device: the loaded function and its context are in it):
 *   uint32 record_size, uint32 count, uint64 unused,
 *   count x {uint32 offset, uint8 format, uint8 alignment mask (pointers), 2 bytes unused},
 *   the record's template (record_size bytes: driver.cpp's LaunchRecord head with the launch
 *   configuration, context and function, the value slots, then the kernelParams array, filled
 *   here with the slots' addresses).
 * Formats: 'P' pointer; struct's 'b' 'B' 'h' 'H' 'i' 'I' 'q' 'Q' integers, '?' bool, 'f' float,
 * 'd' double, 'e' half; 'E' bfloat16. */
enum { kRecordCapacity = 8192, kParamsOffsetAt = 40, kContextAt = 48, kStreamAt = 64, kSpecHead = 16, kSlotSize = 8 };
enum { kLaunched = 1, kDeclined = 0, kFailed = -1 };

static size_t format_size(char format) {
  switch (format) {
    case 'P': case 'q': case 'Q': case 'd': return 8;
    case 'i': case 'I': case 'f': return 4;
    case 'h': case 'H': case 'e': case 'E': return 2;
    case 'b': case 'B': case '?': return 1;
    default: return 0;
  }
}

/* x -> IEEE half bits, rounding to nearest even, as struct's "e" does; |x| <= 65504. */
static uint16_t half_bits(double x) {
  const uint16_t sign = signbit(x) ? 0x8000 : 0;
  const double a = fabs(x);
  if (a < 6.103515625e-05) return sign | (uint16_t)rint(a * 16777216.0); /* subnormal: units of 2^-24 */
  int exponent;
  const double mantissa = frexp(a, &exponent); /* a = mantissa * 2^exponent, mantissa in [0.5, 1) */
  const unsigned bits = (unsigned)rint((mantissa * 2.0 - 1.0) * 1024.0); /* may round up to 1024 */
  return sign | (uint16_t)((((unsigned)(exponent - 1 + 15)) << 10) + bits);
}

/* x -> bfloat16 bits via float, rounding to nearest even (kernel.py's _bf16_bits). */
static uint16_t bf16_bits(double x) {
  const float f = (float)x;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF);
}

/* An integer argument of the exact type int within the format's range, else declined. */
static int integer_value(PyObject* arg, char format, char* slot) {
  if (!PyLong_CheckExact(arg)) return kDeclined;
  if (format == 'Q') {
    const unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      return kDeclined;
    }
    memcpy(slot, &v, 8);
    return kLaunched;
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return kDeclined;
  }
  long long low, high;
  size_t size;
  switch (format) {
    case 'b': low = INT8_MIN, high = INT8_MAX, size = 1; break;
    case 'B': low = 0, high = UINT8_MAX, size = 1; break;
    case 'h': low = INT16_MIN, high = INT16_MAX, size = 2; break;
    case 'H': low = 0, high = UINT16_MAX, size = 2; break;
    case 'i': low = INT32_MIN, high = INT32_MAX, size = 4; break;
    case 'I': low = 0, high = UINT32_MAX, size = 4; break;
    case 'q': low = INT64_MIN, high = INT64_MAX, size = 8; break;
    default: return kDeclined;
  }
  if (v < low || v > high) return kDeclined;
  memcpy(slot, &v, size); /* little-endian: the low bytes */
  return kLaunched;
}

/* A float argument of the exact type float, finite within the format's range (a double may
 * also be infinite), else declined. */
static int float_value(PyObject* arg, char format, char* slot) {
  if (!PyFloat_CheckExact(arg)) return kDeclined;
  const double v = PyFloat_AsDouble(arg);
  if (isnan(v)) return kDeclined;
  if (format == 'd') {
    memcpy(slot, &v, 8);
    return kLaunched;
  }
  const double limit = format == 'f' ? FLT_MAX : format == 'e' ? 65504.0 : 3.3895313892515355e38;
  if (!(fabs(v) <= limit)) return kDeclined;
  if (format == 'f') {
    const float f = (float)v;
    memcpy(slot, &f, 4);
  } else {
    const uint16_t bits = format == 'e' ? half_bits(v) : bf16_bits(v);
    memcpy(slot, &bits, 2);
  }
  return kLaunched;
}

/* A tensor's CUDA device and data pointer through the exchange API, its dtype among `accepted`
 * (None: any; else bytes of packed dtypes). A tensor torch cannot export (it raised) is declined:
 * the general path says what is wrong with it. */
static int exchange_tensor(PyObject* arg, PyObject* accepted, long* arg_device, unsigned long long* pointer) {
  DLTensor view;
  if (exchange->dltensor_from_py_object_no_sync(arg, &view) != 0) {
    PyErr_Clear();
    return kDeclined;
  }
  if (view.device.device_type != kDLCUDA) return kDeclined;
  if (accepted != Py_None) {
    const uint32_t dtype = packed_dtype(view.dtype);
    const char* codes = PyBytes_AsString(accepted);
    if (codes == NULL) return kFailed;
    int found = 0;
    for (Py_ssize_t i = 0, n = PyBytes_Size(accepted) / 4; i < n && !found; ++i) {
      uint32_t code;
      memcpy(&code, codes + 4 * i, 4);
      found = code == dtype;
    }
    if (!found) return kDeclined;
  }
  *arg_device = view.device.device_id;
  *pointer = (unsigned long long)(uintptr_t)view.data + view.byte_offset;
  return kLaunched;
}

/* The same through torch's attributes. */
static int attribute_tensor(PyObject* arg, PyObject* dtypes, long* arg_device, unsigned long long* pointer) {
  PyObject* is_cuda = PyObject_GetAttr(arg, s_is_cuda);
  if (is_cuda == NULL) return kFailed;
  Py_DECREF(is_cuda);
  if (is_cuda != Py_True) return kDeclined;
  if (dtypes != Py_None) {
    PyObject* dtype = PyObject_GetAttr(arg, s_dtype);
    if (dtype == NULL) return kFailed;
    Py_DECREF(dtype); /* the tensor keeps its dtype alive */
    int accepted = 0;
    for (Py_ssize_t i = 0, n = PyTuple_Size(dtypes); i < n && !accepted; ++i) accepted = PyTuple_GetItem(dtypes, i) == dtype;
    if (!accepted) return kDeclined;
  }
  PyObject* index = PyObject_CallMethodObjArgs(arg, s_get_device, NULL);
  if (index == NULL) return kFailed;
  *arg_device = PyLong_AsLong(index);
  Py_DECREF(index);
  PyObject* address = PyObject_CallMethodObjArgs(arg, s_data_ptr, NULL);
  if (address == NULL) return kFailed;
  *pointer = PyLong_AsUnsignedLongLong(address);
  Py_DECREF(address);
  return PyErr_Occurred() ? kFailed : kLaunched;
}

/* One pointer argument: None (a null pointer) or an exact torch.Tensor on a CUDA device, of an
 * accepted dtype (`dl_dtypes`' entry where the exchange API reads it, else `dtypes`'), on the
 * same device as the tensors before it (*device: -1 before the first), its data pointer aligned
 * as the pointee needs. With pointers_as_ints (the tests' record_of), a Python int stands for a
 * tensor's data pointer. */
static int pointer_value(PyObject* arg, PyObject* tensor_type, PyObject* dtypes, PyObject* dl_dtypes, unsigned mask,
                         int pointers_as_ints, long* device, char* slot) {
  unsigned long long pointer = 0;
  if (pointers_as_ints && PyLong_CheckExact(arg)) {
    pointer = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return kFailed;
  } else if (arg != Py_None) {
    if ((PyObject*)Py_TYPE(arg) != tensor_type) return kDeclined;
    long arg_device = -1;
    const int status = dl_dtypes != NULL ? exchange_tensor(arg, dl_dtypes, &arg_device, &pointer)
                                         : attribute_tensor(arg, dtypes, &arg_device, &pointer);
    if (status != kLaunched) return status;
    if (arg_device < 0 || (*device >= 0 && arg_device != *device)) return kDeclined;
    *device = arg_device;
    if (pointer & mask) return kDeclined;
  }
  memcpy(slot, &pointer, 8);
  return kLaunched;
}

/* Fills `record` from the plan, args and stream: kLaunched (ready), kDeclined or kFailed (a
 * Python error set). `device` is the tensors' device, or the given one for record_of. */
static int build_record(PyObject* plan, PyObject* args, PyObject* stream, int pointers_as_ints, long device,
                        char* record, Py_ssize_t* record_size) {
  if (!PyTuple_Check(plan) || PyTuple_Size(plan) != 7 || !PyTuple_Check(args)) {
    PyErr_SetString(PyExc_TypeError, "expected (plan: the 7-tuple of kernel.py's _make_fast_path, args: tuple, stream)");
    return kFailed;
  }
  PyObject* specs = PyTuple_GetItem(plan, 1);
  PyObject* tensor_type = PyTuple_GetItem(plan, 2);
  PyObject* dtypes = PyTuple_GetItem(plan, 5);
  PyObject* dl_dtypes = exchange != NULL ? PyTuple_GetItem(plan, 6) : Py_None; /* None: torch's attributes */
  const Py_ssize_t nargs = PyTuple_Size(args);
  if (PyTuple_Size(dtypes) != nargs) return kDeclined; /* the general path names the count */
  if (dl_dtypes != Py_None && (!PyTuple_Check(dl_dtypes) || PyTuple_Size(dl_dtypes) != nargs)) {
    PyErr_SetString(PyExc_ValueError, "the plan's dl_dtypes do not match its dtypes");
    return kFailed;
  }
  /* The spec is per device, and the device is the first tensor's: fill the record from any
   * loaded device's spec (a kernel's specs differ only in context and function), then take
   * those two from the tensors' device's spec. */
  PyObject* any_spec = NULL;
  for (Py_ssize_t i = 0, n = PyList_Size(specs); i < n && any_spec == NULL; ++i) {
    PyObject* item = PyList_GetItem(specs, i);
    if (item != Py_None) any_spec = item;
  }
  if (any_spec == NULL) return kDeclined; /* not loaded anywhere yet */
  const char* slots = PyBytes_AsString(any_spec);
  if (slots == NULL) return kFailed;
  uint32_t size, count, params_offset;
  memcpy(&size, slots, 4);
  memcpy(&count, slots + 4, 4);
  if (size > kRecordCapacity || (Py_ssize_t)count != nargs ||
      PyBytes_Size(any_spec) != (Py_ssize_t)(kSpecHead + kSlotSize * (size_t)count + size)) {
    PyErr_SetString(PyExc_ValueError, "the launch spec does not match the kernel's parameters");
    return kFailed;
  }
  memcpy(record, slots + kSpecHead + kSlotSize * count, size);
  memcpy(&params_offset, record + kParamsOffsetAt, 4);
  if ((size_t)params_offset + 8 * (size_t)count > size) {
    PyErr_SetString(PyExc_ValueError, "the launch spec's kernelParams array lies outside its record");
    return kFailed;
  }
  long tensors_device = -1;
  for (uint32_t i = 0; i < count; ++i) {
    const unsigned char* slot = (const unsigned char*)slots + kSpecHead + kSlotSize * i;
    uint32_t offset;
    memcpy(&offset, slot, 4);
    const char format = (char)slot[4];
    if (format_size(format) == 0 || offset + format_size(format) > params_offset) {
      PyErr_SetString(PyExc_ValueError, "the launch spec has a bad value slot");
      return kFailed;
    }
    char* value = record + offset;
    PyObject* arg = PyTuple_GetItem(args, i);
    int status;
    if (format == 'P') {
      status = pointer_value(arg, tensor_type, PyTuple_GetItem(dtypes, i),
                             dl_dtypes == Py_None ? NULL : PyTuple_GetItem(dl_dtypes, i), slot[5], pointers_as_ints,
                             &tensors_device, value);
    } else if (format == '?') {
      status = PyBool_Check(arg) ? kLaunched : kDeclined;
      *value = arg == Py_True;
    } else if (format == 'f' || format == 'd' || format == 'e' || format == 'E') {
      status = float_value(arg, format, value);
    } else {
      status = integer_value(arg, format, value);
    }
    if (status != kLaunched) return status;
    const void* address = value;
    memcpy(record + params_offset + 8 * i, &address, 8);
  }
  if (!pointers_as_ints) {
    if (tensors_device < 0) return kDeclined; /* no tensor: the general path finds the device */
    device = tensors_device;
  }
  PyObject* spec = device < PyList_Size(specs) ? PyList_GetItem(specs, device) : NULL;
  if (spec == NULL || spec == Py_None) return kDeclined; /* not loaded on this device yet */
  memcpy(record + kContextAt, PyBytes_AsString(spec) + kSpecHead + kSlotSize * count + kContextAt, 16);

  uint64_t handle;
  void* current = NULL;
  /* torch's current stream: through the exchange API where it reads the tensors (record_of, for
   * the tests, always asks raw_stream), else raw_stream. */
  if (stream == Py_None && dl_dtypes != Py_None && !pointers_as_ints &&
      exchange->current_work_stream(kDLCUDA, (int32_t)device, &current) == 0) {
    handle = (uint64_t)(uintptr_t)current;
  } else if (stream == Py_None) {
    PyErr_Clear(); /* a failed exchange query: ask raw_stream */
    PyObject* raw = PyObject_CallFunction(PyTuple_GetItem(plan, 4), "l", device);
    if (raw == NULL) return kFailed;
    handle = PyLong_AsUnsignedLongLong(raw);
    Py_DECREF(raw);
    if (PyErr_Occurred()) return kFailed;
  } else if ((PyObject*)Py_TYPE(stream) == PyTuple_GetItem(plan, 3)) {
    PyObject* index = PyObject_GetAttr(stream, s_device_index);
    if (index == NULL) return kFailed;
    const long stream_device = PyLong_AsLong(index);
    Py_DECREF(index);
    if (stream_device != device) return kDeclined; /* the general path says which is where */
    PyObject* raw = PyObject_GetAttr(stream, s_cuda_stream);
    if (raw == NULL) return kFailed;
    handle = PyLong_AsUnsignedLongLong(raw);
    Py_DECREF(raw);
    if (PyErr_Occurred()) return kFailed;
  } else {
    return kDeclined; /* a raw handle or anything else: the general path */
  }
  memcpy(record + kStreamAt, &handle, 8);
  *record_size = size;
  return kLaunched;
}

/* Launches if it can: 1 launched, 0 declined (nothing launched), -1 failed (error set). */
static int try_fast_launch(PyObject* plan, PyObject* args, PyObject* stream) {
  _Alignas(16) char record[kRecordCapacity];
  Py_ssize_t size = 0;
  const int status = build_record(plan, args, stream, 0, -1, record, &size);
  if (status != kLaunched) return status;
  const char* name = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(plan, 0), NULL);
  if (name == NULL || call_entry(record, name) != 0) return kFailed;
  return kLaunched;
}

/* fast_launch(plan, args, stream) -> True (launched) or False (declined: nothing launched). */
static PyObject* fast_launch(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "fast_launch(plan, args, stream)");
    return NULL;
  }
  const int status = try_fast_launch(args[0], args[1], args[2]);
  if (status == kFailed) return NULL;
  return PyBool_FromLong(status == kLaunched);
}

/* Launcher: the base class of CompiledKernel where the extension exists. Calling an instance
 * tries fast_launch with its `_plan` (None: no fast path) and calls its Python method
 * `_call_general(*args, **kwargs)` when that declines or a launch option other than stream= is
 * given, so a launch costs no Python frame. */
typedef struct {
  PyObject_HEAD
  PyObject* plan;
} Launcher;

static PyObject* s_call_general;

static PyObject* launcher_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* plan = ((Launcher*)self)->plan;
  if (plan != NULL && plan != Py_None) {
    PyObject* stream = Py_None;
    Py_ssize_t options = kwargs == NULL ? 0 : PyDict_Size(kwargs);
    if (options == 1) {
      stream = PyDict_GetItemString(kwargs, "stream"); /* borrowed */
      if (stream != NULL) options = 0;
    }
    if (options == 0) {
      const int status = try_fast_launch(plan, args, stream);
      if (status == kFailed) return NULL;
      if (status == kLaunched) Py_RETURN_NONE;
    }
  }
  PyObject* general = PyObject_GetAttr(self, s_call_general);
  if (general == NULL) return NULL;
  PyObject* result = PyObject_Call(general, args, kwargs);
  Py_DECREF(general);
  return result;
}

static int launcher_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self)); /* a heap type's instances own a reference to it */
  Py_VISIT(((Launcher*)self)->plan);
  return 0;
}

static int launcher_clear(PyObject* self) {
  Py_CLEAR(((Launcher*)self)->plan);
  return 0;
}

static void launcher_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  launcher_clear(self);
  ((freefunc)PyType_GetSlot(type, Py_tp_free))(self);
  Py_DECREF(type);
}

static PyMemberDef launcher_members[] = {
    {"_plan", T_OBJECT_EX, offsetof(Launcher, plan), 0, "the fast path's plan (kernel.py), or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot launcher_slots[] = {
    {Py_tp_call, launcher_call},
    {Py_tp_traverse, launcher_traverse},
    {Py_tp_clear, launcher_clear},
    {Py_tp_dealloc, launcher_dealloc},
    {Py_tp_members, launcher_members},
    {Py_tp_doc, "Calls launch through fast_launch with self._plan, else self._call_general."},
    {0, NULL},
};

static PyType_Spec launcher_spec = {"mllm_kernel.runtime._launch.Launcher", sizeof(Launcher), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, launcher_slots};

/* record_of(plan, args, stream, device): the record fast_launch would launch on `device`, with
 * ints standing for tensors' data pointers and the kernelParams entries written as offsets from
 * the record's start; None where fast_launch would decline. For the tests, which compare it with
 * the record kernel.py's general path packs. */
static PyObject* record_of(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "record_of(plan, args, stream, device)");
    return NULL;
  }
  const long device = PyLong_AsLong(args[3]);
  if (device == -1 && PyErr_Occurred()) return NULL;
  _Alignas(16) char record[kRecordCapacity];
  Py_ssize_t size = 0;
  const int status = build_record(args[0], args[1], args[2], 1, device, record, &size);
  if (status == kFailed) return NULL;
  if (status == kDeclined) Py_RETURN_NONE;
  uint32_t params_offset;
  memcpy(&params_offset, record + kParamsOffsetAt, 4);
  for (Py_ssize_t i = 0, n = PyTuple_Size(args[1]); i < n; ++i) {
    uintptr_t address;
    memcpy(&address, record + params_offset + 8 * i, 8);
    const uint64_t offset = address - (uintptr_t)record;
    memcpy(record + params_offset + 8 * i, &offset, 8);
  }
  return PyBytes_FromStringAndSize(record, size);
}

static PyMethodDef methods[] = {
    {"set_entry", set_entry, METH_O, "Set the address of driver.cpp's LaunchEntry."},
    {"set_exchange", set_exchange, METH_O,
     "set_exchange(torch.Tensor.__dlpack_c_exchange_api__ or None) -> whether tensors are read through it."},
    {"exchange_dtype", exchange_dtype, METH_O, "exchange_dtype(tensor) -> its DLPack dtype, packed (uint32)."},
    {"launch", launch, METH_O, "Launch the record at this address (driver.cpp's LaunchRecord)."},
    {"fast_launch", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL,
     "fast_launch(plan, args, stream) -> True if launched, False if declined (nothing launched)."},
    {"record_of", (PyCFunction)(void (*)(void))record_of, METH_FASTCALL,
     "record_of(plan, args, stream, device): fast_launch's record, pointers given as ints."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__launch(void) {
  PyObject** names[] = {&s_is_cuda, &s_dtype, &s_get_device, &s_data_ptr, &s_device_index, &s_cuda_stream,
                        &s_call_general};
  const char* spellings[] = {"is_cuda", "dtype", "get_device", "data_ptr", "device_index", "cuda_stream",
                             "_call_general"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i) {
    if (*names[i] == NULL && (*names[i] = PyUnicode_InternFromString(spellings[i])) == NULL) return NULL;
  }
  PyObject* result = PyModule_Create(&module);
  if (result == NULL) return NULL;
  PyObject* launcher = PyType_FromSpec(&launcher_spec);
  if (launcher == NULL || PyModule_AddObject(result, "Launcher", launcher) != 0) {
    Py_XDECREF(launcher);
    Py_DECREF(result);
    return NULL;
  }
  return result;
}
