/* mllm_kernel.runtime._launch: the launch call as a CPython extension function (METH_O), for
 * the few hundred nanoseconds a tvm-ffi call costs more on a path that is a few microseconds in
 * all. It only forwards a launch record's address to driver.cpp's C entry point, whose address
 * the driver module hands over once (set_entry); everything else stays in driver.cpp.
 * Built against the stable ABI (abi3): one binary serves CPython 3.10 and later. */
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <stdint.h>

typedef int (*LaunchEntry)(int64_t record, char* message, size_t capacity);
static LaunchEntry entry = NULL;

static PyObject* set_entry(PyObject* self, PyObject* address) {
  void* pointer = PyLong_AsVoidPtr(address);
  if (pointer == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "set_entry: null entry point");
    return NULL;
  }
  entry = (LaunchEntry)pointer;
  Py_RETURN_NONE;
}

static PyObject* launch(PyObject* self, PyObject* record) {
  long long address = PyLong_AsLongLong(record);
  if (address == -1 && PyErr_Occurred()) return NULL;
  if (entry == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mllm_kernel.runtime._launch: set_entry was not called");
    return NULL;
  }
  char message[1024];
  if (entry((int64_t)address, message, sizeof message) != 0) {
    PyErr_SetString(PyExc_RuntimeError, message);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_entry", set_entry, METH_O, "Set the address of driver.cpp's LaunchEntry."},
    {"launch", launch, METH_O, "Launch the record at this address (driver.cpp's LaunchRecord)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__launch(void) { return PyModule_Create(&module); }
